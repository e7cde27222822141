// MoE dispatch on the host executor: layout, notify (encoded counts into the receivers' workspaces),
// CPU-sync wait on those counters, and the data phase writing straight into the receivers' buffers.
// Receive order: by source rank, then by source token index. A token is sent once per destination rank.
#include <cstring>

#include "../moe_device.hpp"
#include "ops.hpp"

namespace rankflow::ops {

namespace {

// On cuda the phases run on the GPU: native/src/gpu/moe.cc.
MoeDevice& gpu(Context& c) {
  MoeDevice* m = c.device->moe();
  RF_CHECK(m != nullptr, "EINVAL", "dispatch is not available on this rank's device backend");
  return *m;
}

int64_t experts_per_rank(const Context& c) { return c.cfg.ep.num_experts / c.world(); }

void build_routing(Context& c, DispatchLayout& l, const DispatchInput& in) {
  const int64_t K = c.cfg.ep.topk, E = c.cfg.ep.num_experts, epr = experts_per_rank(c), T = in.num_tokens;
  l.num_tokens = T;
  l.topk_idx.assign(in.topk_idx, in.topk_idx + T * K);
  if (in.topk_weights != nullptr) l.topk_weights.assign(in.topk_weights, in.topk_weights + T * K);
  else l.topk_weights.assign(size_t(T * K), 0.0f);
  l.dest_mask.assign(size_t(T), 0);
  l.send_count.assign(size_t(c.world()), 0);
  for (int64_t t = 0; t < T; ++t) {
    uint64_t mask = 0;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = in.topk_idx[t * K + k];
      if (e < 0) continue;
      RF_CHECK(e < E, "EINVAL", "topkIdx[" + std::to_string(t * K + k) + "] = " + std::to_string(e) + " is not below numExperts");
      mask |= uint64_t(1) << (e / epr);
    }
    l.dest_mask[size_t(t)] = mask;
    for (int p = 0; p < c.world(); ++p) l.send_count[size_t(p)] += (mask >> p) & 1;
  }
}

}  // namespace

uint32_t dispatch_notify(Context& c, const DispatchInput& in) {
  if (c.on_cuda()) return gpu(c).dispatch_notify(in);
  const int64_t K = c.cfg.ep.topk, epr = experts_per_rank(c), W = c.world();
  RF_CHECK(in.num_tokens <= c.cfg.ep.max_tokens_per_rank, "EINVAL",
           "x has " + std::to_string(in.num_tokens) + " tokens, above buffer.maxTokensPerRank (" +
               std::to_string(c.cfg.ep.max_tokens_per_rank) + ")");
  // A group made with a small buffer.bytes (allGather or pipeline only) has no room for the receive regions.
  RF_CHECK(c.buf.bytes <= c.buffer_bytes(), "EINVAL",
           "dispatch needs a buffer of " + std::to_string(c.buf.bytes) + " bytes after the workspace; buffer.bytes gives " +
               std::to_string(c.buffer_bytes()) + " (use sizeHint(), " + std::to_string(size_hint(c.cfg.ep)) + " bytes)");
  std::shared_ptr<DispatchLayout> cached;
  if (in.cached_handle != 0) {
    cached = c.layout(in.cached_handle);
    RF_CHECK(cached && cached->complete, "EINVAL", "handle " + std::to_string(in.cached_handle) + " is unknown or expired on rank " + std::to_string(c.rank()));
    RF_CHECK(cached->num_tokens == in.num_tokens, "EINVAL", "x has " + std::to_string(in.num_tokens) +
             " tokens but the handle was made for " + std::to_string(cached->num_tokens));
  }
  auto l = c.add_layout();
  l->seq = c.next_seq();
  l->expert_alignment = in.expert_alignment;
  if (cached) {
    // Cached mode: same routing, counts already known; no notify and no CPU sync (seed 6.1 cached_mode).
    l->num_tokens = cached->num_tokens;
    l->topk_idx = cached->topk_idx;
    l->topk_weights = in.topk_weights != nullptr
                          ? std::vector<float>(in.topk_weights, in.topk_weights + in.num_tokens * K)
                          : cached->topk_weights;
    l->dest_mask = cached->dest_mask;
    l->send_count = cached->send_count;
    l->recv_count = cached->recv_count;
    l->tokens_per_expert = cached->tokens_per_expert;
    l->num_recv = cached->num_recv;
    c.announce(l->seq);
    return l->id;
  }
  build_routing(c, *l, in);
  // Per destination rank, tokens per its local expert.
  std::vector<int64_t> expert_counts(size_t(W * epr), 0);
  for (int64_t i = 0; i < in.num_tokens * K; ++i)
    if (in.topk_idx[i] >= 0) ++expert_counts[size_t(in.topk_idx[i])];
  const uint32_t s = l->seq;
  for (int p = 0; p < W; ++p) {
    uint8_t* peer_ws = c.mem.peer_window(p);
    for (int64_t e = 0; e < epr; ++e)
      store_release(peer_ws + c.ws.expert_slot(c.rank(), int32_t(e)), encode_signal(s, expert_counts[size_t(p * epr + e)]));
    // The rank count goes last: once it is visible, so are the expert counts (release order).
    store_release(peer_ws + c.ws.slot(c.ws.rank_count, c.rank()), encode_signal(s, l->send_count[size_t(p)]));
  }
  c.announce(s);
  return l->id;
}

DispatchCounts dispatch_wait(Context& c, uint32_t layout_id) {
  if (c.on_cuda()) return gpu(c).dispatch_wait(layout_id);
  auto l = c.layout(layout_id);
  RF_CHECK(l != nullptr, "EINVAL", "dispatch layout " + std::to_string(layout_id) + " is unknown");
  const int64_t epr = experts_per_rank(c);
  if (l->recv_count.empty()) {
    // The CPU polls the encoded counters (seed 7.3): 0 means not yet written, -(count+1) means count.
    l->recv_count.assign(size_t(c.world()), 0);
    l->tokens_per_expert.assign(size_t(epr), 0);
    for (int p = 0; p < c.world(); ++p) {
      const uint64_t v = c.wait_for(c.my_slot(c.ws.rank_count, p), l->seq, WaitSite{kPhaseNotify, p, "rank_count"},
                                    WaitKind::Cpu, /*exact=*/true);
      l->recv_count[size_t(p)] = decode_count(v);
      l->num_recv += l->recv_count[size_t(p)];
    }
    for (int64_t e = 0; e < epr; ++e)
      for (int p = 0; p < c.world(); ++p) {
        const uint64_t v = c.wait_for(c.workspace() + c.ws.expert_slot(p, int32_t(e)), l->seq,
                                      WaitSite{kPhaseNotify, p, "expert_count", int(e)}, WaitKind::Cpu, true);
        l->tokens_per_expert[size_t(e)] += decode_count(v);
      }
  }
  DispatchCounts out;
  out.num_recv = l->num_recv;
  for (const int64_t n : l->tokens_per_expert) out.tokens_per_expert.push_back(align_up(n, l->expert_alignment));
  return out;
}

void dispatch_data(Context& c, uint32_t layout_id, const DispatchInput& in, const DispatchOutput& out) {
  if (c.on_cuda()) {
    DispatchOutput o = out;
    return gpu(c).dispatch_data(layout_id, in, o);
  }
  auto l = c.layout(layout_id);
  RF_CHECK(l != nullptr, "EINVAL", "dispatch layout " + std::to_string(layout_id) + " is unknown");
  const auto& cfg = c.cfg.ep;
  const int64_t K = cfg.topk, H = cfg.hidden, epr = experts_per_rank(c), maxT = cfg.max_tokens_per_rank;
  const int64_t row = H * in.x_elem_bytes, srow = c.buf.scales_per_token, xstride = c.buf.x_bytes_per_token;
  const uint32_t s = l->seq;
  const int W = c.world();
  for (int i = 0; i < W; ++i) {
    const int p = (c.rank() + i) % W;
    if (l->send_count[size_t(p)] == 0 && p != c.rank()) {
      store_release(c.peer_slot(p, c.ws.done), encode_signal(s, 0));
      continue;
    }
    c.wait_entered(p, s);
    uint8_t* dst = c.peer_buffer(p);
    int64_t slot = int64_t(c.rank()) * maxT;
    for (int64_t t = 0; t < l->num_tokens; ++t) {
      if (((l->dest_mask[size_t(t)] >> p) & 1) == 0) continue;
      std::memcpy(dst + c.buf.x + slot * xstride, in.x + t * row, size_t(row));
      if (in.scales != nullptr)
        std::memcpy(dst + c.buf.scales + slot * srow * 4, in.scales + t * srow, size_t(srow * 4));
      auto* idx = reinterpret_cast<int32_t*>(dst + c.buf.topk_idx) + slot * K;
      auto* w = reinterpret_cast<float*>(dst + c.buf.topk_weights) + slot * K;
      for (int64_t k = 0; k < K; ++k) {
        const int32_t e = l->topk_idx[size_t(t * K + k)];
        const bool mine = e >= 0 && e / epr == p;
        idx[k] = mine ? int32_t(e - p * epr) : -1;
        w[k] = mine ? l->topk_weights[size_t(t * K + k)] : 0.0f;
      }
      reinterpret_cast<int32_t*>(dst + c.buf.src_token)[slot] = int32_t(t);
      ++slot;
    }
    if (p != c.rank()) store_release(c.peer_slot(p, c.ws.done), encode_signal(s, 0));
  }
  c.wait_all(c.ws.done, s, kPhaseDispatchData, "done");
  // Compact my receive region (source-rank major) into the outputs, and keep what combine needs.
  l->recv_src_rank.resize(size_t(l->num_recv));
  l->recv_src_token.resize(size_t(l->num_recv));
  l->recv_topk_weights.resize(size_t(l->num_recv * K));
  int64_t o = 0;
  const uint8_t* b = c.buffer();
  for (int p = 0; p < W; ++p) {
    const int64_t first = int64_t(p) * maxT, n = l->recv_count[size_t(p)];
    for (int64_t j = 0; j < n; ++j, ++o) {
      const int64_t slot = first + j;
      std::memcpy(out.x + o * row, b + c.buf.x + slot * xstride, size_t(row));
      if (out.scales != nullptr) std::memcpy(out.scales + o * srow, b + c.buf.scales + slot * srow * 4, size_t(srow * 4));
      std::memcpy(out.topk_idx + o * K, b + c.buf.topk_idx + slot * K * 4, size_t(K * 4));
      std::memcpy(out.topk_weights + o * K, b + c.buf.topk_weights + slot * K * 4, size_t(K * 4));
      out.src_rank[o] = p;
      out.src_token[o] = reinterpret_cast<const int32_t*>(b + c.buf.src_token)[slot];
    }
  }
  std::memcpy(l->recv_src_rank.data(), out.src_rank, size_t(l->num_recv * 4));
  std::memcpy(l->recv_src_token.data(), out.src_token, size_t(l->num_recv * 4));
  std::memcpy(l->recv_topk_weights.data(), out.topk_weights, size_t(l->num_recv * K * 4));
  l->complete = true;
}

void dispatch_abandon(Context& c, uint32_t layout_id) { c.layouts.erase(layout_id); }

}  // namespace rankflow::ops
