// MoE dispatch of the host backend in a world whose nodes share no memory (two levels).
// Rank (n, i) is the forwarder of rail i on node n: it exchanges token records with the ranks (k, i)
// of the other nodes, and writes them into its node's ranks' windows as if their sources had.
//
// dispatch: a token crosses the network at most once per destination node that owns one of its
//   experts, to the rank of its source's local index there (one record: x row, scales, the k global
//   expert ids and weights, the token id). notify: my counts into my node's ranks, my records to my
//   rail peers and theirs to me, then the counts their tokens bring into my node's ranks' slots of
//   those sources (rank_count[s], expert_count[s][e]), so that the flat CPU-sync wait reads every
//   count where it always does. A cached dispatch sends its records in the data phase instead.
//   data: into each node peer (after its enter), my own rows at my slots and each rail peer's at that
//   source's slots, in token order; then `done` for me and for each source I forwarded. The receive
//   region is then exactly the flat one: compaction is the flat code, and so are the outputs.
// combine: two_level_combine.cc.
#include <cstring>

#include "two_level.hpp"

namespace rankflow::host {

void HostTwoLevel::adopt_routing(DispatchLayout& l, const DispatchLayout& from, bool /*new_weights*/) {
  begin_adopt(l, from);
  announce_locals(l.seq, l.fingerprint);
}

namespace {

HostLayout& state_of(DispatchLayout& l) { return static_cast<HostLayout&>(*l.state); }

// Where the fields of one token record lie.
struct Record {
  int64_t row, scales_at, idx_at, w_at, token_at, bytes;
  Record(int64_t row_bytes, int64_t scale_floats, int64_t K)
      : row(row_bytes), scales_at(row_bytes), idx_at(scales_at + scale_floats * 4), w_at(idx_at + K * 4), token_at(w_at + K * 4),
        bytes(token_at + 4) {}
};

[[noreturn]] void broken_frame(const Context& c, int peer, const std::string& what, Phase phase) {
  throw Error("RANK_FAILED", "rank " + std::to_string(peer) + " sent rank " + std::to_string(c.rank()) + " a " + phase_name(phase) +
                                 " frame that does not fit the protocol: " + what,
              peer, phase_name(phase));
}

}  // namespace

void HostTwoLevel::dispatch_notify(uint64_t seq, DispatchLayout& l, const DispatchInput& in) {
  std::vector<int64_t> expert_counts;
  begin_notify(l, in, expert_counts);
  const Routing& r = *state_of(l).routing;
  const int64_t epr = c_.experts_per_rank();
  // My counts into my node's ranks; the other nodes' ranks get them from my rail peers there.
  for (int j = 0; j < c_.nodes.ranks_per_node; ++j) {
    const int p = local_rank(j);
    uint8_t* peer_ws = mem_.peer_window(p);
    for (int64_t e = 0; e < epr; ++e)
      signal(peer_ws + c_.ws.expert_slot(rank(), int32_t(e)), seq, uint64_t(expert_counts[size_t(p * epr + e)]));
    signal(peer_ws + c_.ws.slot(c_.ws.rank_count, rank()), seq, uint64_t(r.send_count[size_t(p)]));
  }
  announce_locals(seq, l.fingerprint);
  exchange_records(seq, kPhaseNotify, l, in, true);
}

void HostTwoLevel::exchange_records(uint64_t seq, Phase phase, DispatchLayout& l, const DispatchInput& in, bool forward_counts) {
  HostLayout& st = state_of(l);
  const Routing& r = *st.routing;
  const Nodes& nd = c_.nodes;
  const auto& cfg = c_.cfg.ep;
  const int64_t K = cfg.topk, E = cfg.num_experts, epr = c_.experts_per_rank(), maxT = cfg.max_tokens_per_rank, T = l.num_tokens;
  const int64_t srow = in.scales ? c_.buf.scales_per_token : 0;
  const Record rec(cfg.hidden * in.x_elem_bytes, srow, K);
  const uint8_t* x = T > 0 ? host_ptr(in.x, "x") : nullptr;
  const auto* scales = reinterpret_cast<const float*>(in.scales ? host_ptr(in.scales, "scales") : nullptr);
  auto two = std::make_unique<TwoLevelState>();
  two->record_bytes = rec.bytes;
  two->rail.resize(size_t(nd.num_nodes));
  two->refused.resize(size_t(nd.num_nodes));
  RailTokens& own = two->rail[size_t(nd.node)];
  std::vector<std::vector<uint8_t>> payload(size_t(nd.num_nodes));
  for (int64_t t = 0; t < T; ++t) {
    const uint64_t mask = r.dest_mask[size_t(t)], nodes = nd.nodes_of(mask);
    own.token.push_back(int32_t(t));
    own.nodes.push_back(nodes);
    own.locals.push_back(nd.locals_of(mask));
    for (int k = 0; k < nd.num_nodes; ++k) {
      if (k == nd.node || ((nodes >> k) & 1) == 0) continue;
      std::vector<uint8_t>& p = payload[size_t(k)];
      const size_t at = p.size();
      p.resize(at + size_t(rec.bytes));
      uint8_t* d = p.data() + at;
      std::memcpy(d, x + t * rec.row, size_t(rec.row));
      if (scales != nullptr) std::memcpy(d + rec.scales_at, scales + t * srow, size_t(srow * 4));
      std::memcpy(d + rec.idx_at, r.topk_idx.data() + t * K, size_t(K * 4));
      std::memcpy(d + rec.w_at, st.topk_weights.data() + t * K, size_t(K * 4));
      const int32_t token = int32_t(t);
      std::memcpy(d + rec.token_at, &token, 4);
    }
  }
  std::vector<RailSend> sends;
  std::vector<RailRecv> recvs;
  for (int k = 0; k < nd.num_nodes; ++k) {
    if (k == nd.node) continue;
    sends.push_back({k, payload[size_t(k)].data(), int64_t(payload[size_t(k)].size()), uint64_t(rec.bytes)});
    recvs.push_back({k, maxT * rec.bytes, {}});
  }
  rails_->exchange(seq, phase, l.fingerprint, sends, recvs, WaitKind::Device);
  // What came is checked before anything acts on it: sizes, token ids, expert ids.
  for (const RailRecv& f : recvs) {
    const int k = f.node, s = nd.rail_peer(k);
    std::string& refused = two->refused[size_t(k)];
    if (f.tag != l.fingerprint) {
      refused = "inputs.handle: rank " + std::to_string(s) + " replays another dispatch's handle than rank " + std::to_string(rank()) +
                " in dispatch #" + std::to_string(seq) + ": every rank must pass the handle of the same dispatch";
      continue;
    }
    if (f.aux != uint64_t(rec.bytes)) {
      refused = "inputs.x: rank " + std::to_string(s) + " dispatches token records of " + std::to_string(f.aux) + " bytes, rank " +
                std::to_string(rank()) + " of " + std::to_string(rec.bytes) + ": every rank must dispatch the same dtype (and scales)";
      continue;
    }
    const int64_t n = int64_t(f.data.size()) / rec.bytes;
    if (int64_t(f.data.size()) % rec.bytes != 0) broken_frame(c_, s, "its size is not a whole number of token records", phase);
    RailTokens& rt = two->rail[size_t(k)];
    int32_t last = -1;
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* d = f.data.data() + i * rec.bytes;
      int32_t t;
      std::memcpy(&t, d + rec.token_at, 4);
      if (t <= last || t >= maxT) broken_frame(c_, s, "its token ids are not ascending below maxTokensPerRank", phase);
      last = t;
      uint64_t mask = 0;
      for (int64_t kk = 0; kk < K; ++kk) {
        int32_t e;
        std::memcpy(&e, d + rec.idx_at + kk * 4, 4);
        if (e == -1) continue;
        if (e < 0 || e >= E) broken_frame(c_, s, "an expert id outside [0, numExperts)", phase);
        mask |= uint64_t(1) << (e / epr);
      }
      const uint64_t locals = nd.locals_of(mask);
      if (locals == 0) broken_frame(c_, s, "a token with no expert on this node", phase);
      rt.token.push_back(t);
      rt.nodes.push_back(nd.nodes_of(mask));
      rt.locals.push_back(locals);
      rt.offset.push_back(i * rec.bytes);
    }
  }
  two->frames = std::move(recvs);
  two->exchanged = true;
  if (forward_counts) {
    // The counts of each rail peer's tokens, into my node's ranks' slots of that source.
    std::vector<uint64_t> counts(static_cast<size_t>(epr));
    for (const RailRecv& f : two->frames) {
      const int k = f.node, s = nd.rail_peer(k);
      const RailTokens& rt = two->rail[size_t(k)];
      for (int j = 0; j < nd.ranks_per_node; ++j) {
        const int p = local_rank(j);
        std::fill(counts.begin(), counts.end(), 0);
        uint64_t tokens = 0;
        for (size_t i = 0; i < rt.token.size(); ++i) {
          if (((rt.locals[i] >> j) & 1) == 0) continue;
          ++tokens;
          const uint8_t* d = f.data.data() + rt.offset[i];
          for (int64_t kk = 0; kk < K; ++kk) {
            int32_t e;
            std::memcpy(&e, d + rec.idx_at + kk * 4, 4);
            if (e >= 0 && e / epr == p) ++counts[size_t(e - p * epr)];
          }
        }
        uint8_t* peer_ws = mem_.peer_window(p);
        for (int64_t e = 0; e < epr; ++e) signal(peer_ws + c_.ws.expert_slot(s, int32_t(e)), seq, counts[size_t(e)]);
        signal(peer_ws + c_.ws.slot(c_.ws.rank_count, s), seq, tokens);
      }
    }
  }
  st.two = std::move(two);
}

void HostTwoLevel::dispatch_data(uint64_t seq, DispatchLayout& l, const DispatchInput& in, DispatchOutput& out) {
  begin_dispatch_data(l, in, out);
  HostLayout& st = state_of(l);
  if (!st.two || !st.two->exchanged) exchange_records(seq, kPhaseDispatchData, l, in, false);  // a cached dispatch
  const TwoLevelState& two = *st.two;
  const Routing& r = *st.routing;
  const Nodes& nd = c_.nodes;
  const auto& cfg = c_.cfg.ep;
  const int64_t K = cfg.topk, H = cfg.hidden, epr = c_.experts_per_rank(), maxT = cfg.max_tokens_per_rank;
  const int64_t row = H * in.x_elem_bytes, srow = c_.buf.scales_per_token, xstride = c_.buf.x_bytes_per_token;
  const uint8_t* x = l.num_tokens > 0 ? host_ptr(in.x, "x") : nullptr;
  const auto* scales = reinterpret_cast<const float*>(in.scales ? host_ptr(in.scales, "scales") : nullptr);
  const Record rec(row, scales != nullptr ? srow : 0, K);
  const int64_t token_bytes = row + (scales != nullptr ? srow * 4 : 0) + K * 8 + 8;
  std::string refused;
  int refused_rank = -1;
  for (int i = 0; i < nd.ranks_per_node; ++i) {
    const int j = (nd.local + i) % nd.ranks_per_node, p = local_rank(j);
    const bool same = p == rank() || wait_entered(p, seq) == l.fingerprint;
    if (!same && refused.empty()) {
      refused = "inputs.handle: rank " + std::to_string(p) + " replays another dispatch's handle than rank " + std::to_string(rank()) +
                " in dispatch/combine #" + std::to_string(seq) + ": every rank must pass the handle of the same dispatch";
      refused_rank = p;
    }
    if (same) {
      uint8_t* dst = p == rank() ? buffer() : peer_buffer(p);
      int64_t rows = 0;
      // One token into slot `slot` of p's receive region.
      auto put = [&](int64_t slot, const uint8_t* xrow, const float* srow_src, const int32_t* idx_src, const float* w_src, int32_t token,
                     int32_t src_rank) {
        std::memcpy(dst + c_.buf.x + slot * xstride, xrow, size_t(row));
        if (scales != nullptr) std::memcpy(dst + c_.buf.scales + slot * srow * 4, srow_src, size_t(srow * 4));
        auto* idx = reinterpret_cast<int32_t*>(dst + c_.buf.topk_idx) + slot * K;
        auto* w = reinterpret_cast<float*>(dst + c_.buf.topk_weights) + slot * K;
        for (int64_t k = 0; k < K; ++k) {
          int32_t e;
          float wk;
          std::memcpy(&e, idx_src + k, 4);
          std::memcpy(&wk, w_src + k, 4);
          const bool mine = e >= 0 && e / epr == p;
          idx[k] = mine ? int32_t(e - p * epr) : -1;
          w[k] = mine ? wk : 0.0f;
        }
        reinterpret_cast<int32_t*>(dst + c_.buf.src_token)[slot] = token;
        reinterpret_cast<int32_t*>(dst + c_.buf.src_rank)[slot] = src_rank;
        ++rows;
      };
      int64_t slot = int64_t(rank()) * maxT;
      for (int64_t t = 0; t < l.num_tokens; ++t)
        if ((r.dest_mask[size_t(t)] >> p) & 1)
          put(slot++, x + t * row, scales + t * srow, r.topk_idx.data() + t * K, st.topk_weights.data() + t * K, int32_t(t), rank());
      for (const RailRecv& f : two.frames) {
        if (!two.refused[size_t(f.node)].empty()) continue;
        const int s = nd.rail_peer(f.node);
        const RailTokens& rt = two.rail[size_t(f.node)];
        slot = int64_t(s) * maxT;
        for (size_t q = 0; q < rt.token.size(); ++q) {
          if (((rt.locals[q] >> j) & 1) == 0) continue;
          const uint8_t* d = f.data.data() + rt.offset[q];
          put(slot++, d, reinterpret_cast<const float*>(d + rec.scales_at), reinterpret_cast<const int32_t*>(d + rec.idx_at),
              reinterpret_cast<const float*>(d + rec.w_at), rt.token[q], s);
        }
      }
      if (p != rank()) c_.traffic.up(rows * token_bytes);
    }
    // `done` for me, and for each source whose tokens I forwarded (1: refused, nothing came).
    if (p != rank()) signal(peer_slot(p, c_.ws.done), seq);
    for (const RailRecv& f : two.frames) {
      const int s = nd.rail_peer(f.node);
      signal(mem_.peer_window(p) + c_.ws.slot(c_.ws.done, s), seq, !same || !two.refused[size_t(f.node)].empty() ? 1 : 0);
    }
  }
  // What this rank refused itself says most; then what a forwarder of this node refused for it.
  for (int k = 0; k < nd.num_nodes && refused.empty(); ++k)
    if (!two.refused[size_t(k)].empty()) refused = two.refused[size_t(k)], refused_rank = nd.rail_peer(k);
  for (int q = 0; q < world(); ++q) {
    if (q == rank()) continue;
    const uint64_t bad = wait_slot(my_slot(c_.ws.done, q), seq, WaitSite{kPhaseDispatchData, q, "done"}, WaitKind::Device);
    if (bad != 0 && !nd.same_node(q) && refused.empty()) {
      refused = "inputs: the tokens of rank " + std::to_string(q) + " were refused by its forwarder (rank " +
                std::to_string(nd.rank_of(nd.node, nd.local_of(q))) + ") in dispatch #" + std::to_string(seq) +
                ": every rank must pass the handle of the same dispatch, and the same dtype";
      refused_rank = q;
    }
  }
  if (!refused.empty()) throw Error("EINVAL", refused, refused_rank);
  compact_dispatch(l, st, out, row);
}

}  // namespace rankflow::host
