// MoE dispatch and combine on the host executor: the reference the CUDA kernels match bit for bit.
//   notify : the routing (ranks per token), counts per expert and per rank into every receiver's
//            workspace (rank count last), and `enter` (tagged with the layout's fingerprint).
//   counts : the CPU-sync wait on those slots (TIMEOUT_CPU naming rank and counter).
//   data   : after each receiver's `enter` (whose tag must be my fingerprint: a peer replaying another
//            handle is refused, EINVAL), rows, scales, topk and source tokens straight into the
//            receivers' buffers, then `done`; compaction of my receive region into the outputs.
// Receive order: by source rank, then by source token. A token is sent once per destination rank.
// Combine: every receiver returns its row for (source rank, source token) into the source's buffer
// at slot receiver * maxTokensPerRank + token; the source sums them in rank order in fp32, adds the
// biases, rounds to bf16 (nearest even).
#include <cstring>

#include "backend.hpp"

namespace rankflow::host {

namespace {

HostLayout& state_of(DispatchLayout& l) { return static_cast<HostLayout&>(*l.state); }

[[noreturn]] void refuse_handle(const Context& c, int peer, uint64_t seq) {
  throw Error("EINVAL",
              "inputs.handle: rank " + std::to_string(peer) + " replays another dispatch's handle than rank " +
                  std::to_string(c.rank()) + " in dispatch/combine #" + std::to_string(seq) +
                  ": every rank must pass the handle of the same dispatch");
}

}  // namespace

std::shared_ptr<Routing> HostBackend::make_routing(const DispatchInput& in, std::vector<int64_t>& expert_counts) const {
  const int64_t K = c_.cfg.ep.topk, E = c_.cfg.ep.num_experts, epr = c_.experts_per_rank(), T = in.num_tokens;
  const int W = world();
  const auto* idx = reinterpret_cast<const int32_t*>(host_ptr(in.topk_idx, "topkIdx"));
  auto routing = std::make_shared<Routing>();
  routing->topk_idx.assign(idx, idx + T * K);
  routing->dest_mask.assign(size_t(T), 0);
  routing->send_count.assign(size_t(W), 0);
  expert_counts.assign(size_t(W * epr), 0);
  // An elastic group's slots whose expert lives on a rank that left are dropped as -1 slots are.
  const uint64_t live = live_mask();
  routing->masked_slots = 0;
  for (int64_t t = 0; t < T; ++t) {
    uint64_t mask = 0;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = idx[t * K + k];
      if (e == -1) continue;
      RF_CHECK(e >= 0 && e < E, "EINVAL",
               "topkIdx[" + std::to_string(t * K + k) + "]: " + std::to_string(e) + " is outside [0, " +
                   std::to_string(E) + ") and not -1");
      if (!rank_live(live, int(e / epr))) {
        ++routing->masked_slots;
        continue;
      }
      mask |= uint64_t(1) << (e / epr);
      ++expert_counts[size_t(e)];
    }
    routing->dest_mask[size_t(t)] = mask;
    for (int p = 0; p < W; ++p) routing->send_count[size_t(p)] += (mask >> p) & 1;
  }
  return routing;
}

void HostBackend::begin_notify(DispatchLayout& l, const DispatchInput& in, std::vector<int64_t>& expert_counts) const {
  const int64_t K = c_.cfg.ep.topk, T = in.num_tokens;
  auto routing = make_routing(in, expert_counts);
  const auto* w = reinterpret_cast<const float*>(host_ptr(in.topk_weights, "topkWeights"));
  auto st = std::make_unique<HostLayout>();
  st->routing = routing;
  st->topk_weights.assign(w, w + T * K);
  l.state = std::move(st);
}

void HostBackend::dispatch_notify(uint64_t seq, DispatchLayout& l, const DispatchInput& in) {
  const int64_t epr = c_.experts_per_rank();
  const int W = world();
  std::vector<int64_t> expert_counts;
  begin_notify(l, in, expert_counts);
  const Routing* routing = state_of(l).routing.get();
  l.masked_slots = routing->masked_slots;
  for (int p = 0; p < W; ++p) {
    if (!live(p)) continue;
    uint8_t* peer_ws = mem_.peer_window(p);
    for (int64_t e = 0; e < epr; ++e)
      signal(peer_ws + c_.ws.expert_slot(rank(), int32_t(e)), seq, uint64_t(expert_counts[size_t(p * epr + e)]));
    // The rank count goes last: once it is visible, so are the expert counts (release order).
    signal(peer_ws + c_.ws.slot(c_.ws.rank_count, rank()), seq, uint64_t(routing->send_count[size_t(p)]));
  }
  announce(seq, l.fingerprint);
}

void HostBackend::begin_adopt(DispatchLayout& l, const DispatchLayout& from) {
  const auto& origin = static_cast<const HostLayout&>(*from.state);
  auto st = std::make_unique<HostLayout>();
  st->routing = origin.routing;
  st->topk_weights = origin.topk_weights;  // replaced in dispatch_data when new weights are given
  l.state = std::move(st);
}

void HostBackend::adopt_routing(DispatchLayout& l, const DispatchLayout& from, bool /*new_weights*/) {
  begin_adopt(l, from);
  announce(l.seq, l.fingerprint);
}

bool HostBackend::dispatch_counts(DispatchLayout& l, bool block) {
  const int W = world();
  const int64_t epr = c_.experts_per_rank();
  const uint64_t mask = live_mask();
  auto arrived = [&] {
    for (int p = 0; p < W; ++p)
      if (rank_live(mask, p) && slot_seq(my_slot(c_.ws.rank_count, p)) != l.seq) return false;
    return true;  // rank counts go last: the expert counts are there too
  };
  if (!block && !spin_for(c_.rules.spin_ns, arrived)) return false;
  // The CPU polls the counters (seed 7.3): each slot must carry this op's sequence number.
  auto k = std::make_shared<RecvCounts>();
  k->per_rank.assign(size_t(W), 0);
  k->per_expert.assign(size_t(epr), 0);
  for (int p = 0; p < W; ++p)
    if (rank_live(mask, p)) k->per_rank[size_t(p)] = int64_t(wait_slot(my_slot(c_.ws.rank_count, p), l.seq,
                                               WaitSite{kPhaseNotify, p, "rank_count"}, WaitKind::Cpu, true));
  for (int64_t e = 0; e < epr; ++e)
    for (int p = 0; p < W; ++p)
      if (rank_live(mask, p)) k->per_expert[size_t(e)] += int64_t(wait_slot(workspace() + c_.ws.expert_slot(p, int32_t(e)), l.seq,
                                                    WaitSite{kPhaseNotify, p, "expert_count", int(e)},
                                                    WaitKind::Cpu, true));
  l.set_counts(std::move(k));
  return true;
}

void HostBackend::begin_dispatch_data(DispatchLayout& l, const DispatchInput& in, const DispatchOutput& out) const {
  RF_CHECK(!out.in_buffer, "EINVAL", "outputsInBuffer needs backend 'cuda'");
  host_ptr(in.x, "x");
  if (in.scales) host_ptr(in.scales, "scales");
  if (in.topk_weights) {
    const auto* w = reinterpret_cast<const float*>(host_ptr(in.topk_weights, "topkWeights"));
    state_of(l).topk_weights.assign(w, w + l.num_tokens * c_.cfg.ep.topk);
  }
}

void HostBackend::dispatch_data(uint64_t seq, DispatchLayout& l, const DispatchInput& in, DispatchOutput& out) {
  begin_dispatch_data(l, in, out);
  HostLayout& st = state_of(l);
  const Routing& r = *st.routing;
  const auto& cfg = c_.cfg.ep;
  const int64_t K = cfg.topk, H = cfg.hidden, epr = c_.experts_per_rank(), maxT = cfg.max_tokens_per_rank;
  const int64_t row = H * in.x_elem_bytes, srow = c_.buf.scales_per_token, xstride = c_.buf.x_bytes_per_token;
  const uint8_t* x = in.x.as<const uint8_t>();
  const auto* scales = in.scales.as<const float>();
  const int W = world();
  const int64_t token_bytes = row + (scales != nullptr ? srow * 4 : 0) + K * 8 + 8;
  int refused = -1;
  for (int i = 0; i < W; ++i) {
    const int p = (rank() + i) % W;
    if (!live(p)) continue;  // nothing of a dead rank's is routed to it, nor waited for from it
    if (r.send_count[size_t(p)] == 0 && p != rank()) {
      // Nothing to send; its enter is still read, so that a mismatched handle is seen on both sides.
      if (wait_entered(p, seq) != l.fingerprint) refused = p;
      signal(peer_slot(p, c_.ws.done), seq);
      continue;
    }
    if (wait_entered(p, seq) != l.fingerprint && p != rank()) {
      refused = p;  // its receive offsets mean nothing to my routing: nothing goes there
      signal(peer_slot(p, c_.ws.done), seq);
      continue;
    }
    uint8_t* dst = peer_buffer(p);
    int64_t slot = int64_t(rank()) * maxT;
    for (int64_t t = 0; t < l.num_tokens; ++t) {
      if (((r.dest_mask[size_t(t)] >> p) & 1) == 0) continue;
      std::memcpy(dst + c_.buf.x + slot * xstride, x + t * row, size_t(row));
      if (scales != nullptr) std::memcpy(dst + c_.buf.scales + slot * srow * 4, scales + t * srow, size_t(srow * 4));
      auto* idx = reinterpret_cast<int32_t*>(dst + c_.buf.topk_idx) + slot * K;
      auto* w = reinterpret_cast<float*>(dst + c_.buf.topk_weights) + slot * K;
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = r.topk_idx[size_t(t * K + k)];
        const bool mine = e >= 0 && e / epr == p;
        idx[k] = mine ? int32_t(e - p * epr) : -1;
        w[k] = mine ? st.topk_weights[size_t(t * K + k)] : 0.0f;
      }
      reinterpret_cast<int32_t*>(dst + c_.buf.src_token)[slot] = int32_t(t);
      reinterpret_cast<int32_t*>(dst + c_.buf.src_rank)[slot] = rank();
      ++slot;
    }
    if (p != rank()) {
      c_.traffic.up(r.send_count[size_t(p)] * token_bytes);
      signal(peer_slot(p, c_.ws.done), seq);
    }
  }
  wait_all(c_.ws.done, seq, kPhaseDispatchData, "done");
  if (refused >= 0) refuse_handle(c_, refused, seq);
  compact_dispatch(l, st, out, row);
}

// Compacts my receive region (source-rank major) into the outputs, and keeps what combine needs.
void HostBackend::compact_dispatch(DispatchLayout& l, HostLayout& st, DispatchOutput& out, int64_t row) {
  const auto& cfg = c_.cfg.ep;
  const int64_t K = cfg.topk, maxT = cfg.max_tokens_per_rank;
  const int64_t srow = c_.buf.scales_per_token, xstride = c_.buf.x_bytes_per_token;
  const int W = world();
  st.recv_src_rank.resize(size_t(l.num_recv));
  st.recv_src_token.resize(size_t(l.num_recv));
  st.recv_topk_weights.resize(size_t(l.num_recv * K));
  auto* ox = out.x.as<uint8_t>();
  auto* os = out.scales.as<float>();
  auto* oi = out.topk_idx.as<int32_t>();
  auto* ow = out.topk_weights.as<float>();
  auto* orank = out.src_rank.as<int32_t>();
  auto* otok = out.src_token.as<int32_t>();
  RF_CHECK(!out.x.device, "EINVAL", "dispatch outputs: device tensors need backend 'cuda'");
  int64_t o = 0;
  const uint8_t* b = buffer();
  for (int p = 0; p < W; ++p) {
    const int64_t first = int64_t(p) * maxT, n = l.counts->per_rank[size_t(p)];
    for (int64_t j = 0; j < n; ++j, ++o) {
      const int64_t slot = first + j;
      std::memcpy(ox + o * row, b + c_.buf.x + slot * xstride, size_t(row));
      if (os != nullptr) std::memcpy(os + o * srow, b + c_.buf.scales + slot * srow * 4, size_t(srow * 4));
      std::memcpy(oi + o * K, b + c_.buf.topk_idx + slot * K * 4, size_t(K * 4));
      std::memcpy(ow + o * K, b + c_.buf.topk_weights + slot * K * 4, size_t(K * 4));
      orank[o] = p;
      otok[o] = reinterpret_cast<const int32_t*>(b + c_.buf.src_token)[slot];
    }
  }
  std::memcpy(st.recv_src_rank.data(), orank, size_t(l.num_recv * 4));
  std::memcpy(st.recv_src_token.data(), otok, size_t(l.num_recv * 4));
  std::memcpy(st.recv_topk_weights.data(), ow, size_t(l.num_recv * K * 4));
}

CombineSources HostBackend::combine_sources(const DispatchLayout& l, const CombineInput& in, const CombineOutput& out) {
  const HostLayout& st = static_cast<const HostLayout&>(*l.state);
  CombineSources src{reinterpret_cast<const uint16_t*>(host_ptr(in.x, "x")),
                     in.topk_weights ? reinterpret_cast<const float*>(host_ptr(in.topk_weights, "topkWeights")) : st.recv_topk_weights.data(),
                     {nullptr, nullptr}};
  for (int k = 0; k < 2; ++k)
    if (in.bias[k]) src.bias[k] = reinterpret_cast<const uint16_t*>(host_ptr(in.bias[k], "bias"));
  RF_CHECK(!out.x.device, "EINVAL", "combine outputs: device tensors need backend 'cuda'");
  return src;
}

void HostBackend::combine(uint64_t seq, DispatchLayout& l, const CombineInput& in, const CombineOutput& out) {
  const CombineSources src = combine_sources(l, in, out);
  const HostLayout& st = state_of(l);
  const Routing& r = *st.routing;
  const auto& cfg = c_.cfg.ep;
  const int64_t K = cfg.topk, H = cfg.hidden, maxT = cfg.max_tokens_per_rank;
  const int W = world();
  const uint16_t* x = src.x;
  const float* weights = src.weights;
  const auto& bias = src.bias;
  auto* out_x = out.x.as<uint16_t>();
  auto* out_w = out.topk_weights.as<float>();
  announce(seq, l.fingerprint);
  // Rows are grouped by source rank (the dispatch receive order), so each peer is waited on once.
  int64_t row = 0;
  int refused = -1;
  for (int p = 0; p < W; ++p) {
    if (!live(p)) continue;  // it received nothing of this dispatch (its counts are 0)
    const int64_t n = l.counts->per_rank[size_t(p)];
    const bool same = wait_entered(p, seq) == l.fingerprint || p == rank();
    if (!same) refused = p;
    if (n > 0 && same) {
      uint8_t* dst = peer_buffer(p);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t slot = int64_t(rank()) * maxT + st.recv_src_token[size_t(row + j)];
        std::memcpy(dst + c_.buf.combine_x + slot * H * 2, x + (row + j) * H, size_t(H * 2));
        std::memcpy(dst + c_.buf.combine_weights + slot * K * 4, weights + (row + j) * K, size_t(K * 4));
      }
      if (p != rank()) c_.traffic.up(n * (H * 2 + K * 4));
    }
    row += n;
    if (p != rank()) signal(peer_slot(p, c_.ws.done), seq);
  }
  wait_all(c_.ws.done, seq, kPhaseCombineData, "done");
  if (refused >= 0) refuse_handle(c_, refused, seq);
  const uint8_t* b = buffer();
  std::vector<float> acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < l.num_tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    float* w = out_w + t * K;
    std::fill(w, w + K, 0.0f);
    const uint64_t mask = r.dest_mask[size_t(t)];
    for (int p = 0; p < W; ++p) {
      if (((mask >> p) & 1) == 0) continue;
      const int64_t slot = int64_t(p) * maxT + t;
      const auto* rr = reinterpret_cast<const uint16_t*>(b + c_.buf.combine_x + slot * H * 2);
      for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += bf16_to_float(rr[h]);
      const auto* rw = reinterpret_cast<const float*>(b + c_.buf.combine_weights + slot * K * 4);
      for (int64_t k = 0; k < K; ++k) w[k] += rw[k];
    }
    for (const uint16_t* bb : bias)
      if (bb != nullptr)
        for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += bf16_to_float(bb[t * H + h]);
    for (int64_t h = 0; h < H; ++h) out_x[t * H + h] = float_to_bf16(acc[size_t(h)]);
  }
}

}  // namespace rankflow::host
