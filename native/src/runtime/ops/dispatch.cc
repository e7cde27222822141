// MoE dispatch as the runtime runs it: the checks (once, for every backend), the layout a handle
// will name, and the three steps: notify (or the handle's routing, for a cached dispatch), the
// CPU-sync wait for the counts, and the data phase.
#include "../ops.hpp"

namespace rankflow::ops {

std::shared_ptr<DispatchLayout> handle_layout(const Context& c, uint32_t handle, const char* what) {
  auto l = c.layout(handle);
  RF_CHECK(l && l->complete, "EINVAL",
           std::string(what) + ": handle " + std::to_string(handle) + " is unknown or expired on rank " +
               std::to_string(c.rank()) + " (a rank keeps the " + std::to_string(Context::kMaxLiveHandles) +
               " most recently used handles)");
  // Its routing names the ranks that served then: a rank since gone (or back) would be waited for (or skipped).
  RF_CHECK(l->live_epoch == c.live_epoch, "EINVAL",
           std::string(what) + ": handle " + std::to_string(handle) + " was made before the group's membership changed (" +
               "membership " + std::to_string(l->live_epoch) + ", now " + std::to_string(c.live_epoch) +
               "): dispatch again without the handle");
  return l;
}

std::shared_ptr<DispatchLayout> dispatch_begin(Context& c, const DispatchInput& in) {
  const EpConfig& ep = c.cfg.ep;
  Backend& b = c.backend();
  b.check_alive("dispatch");
  b.check_runs("dispatch");
  RF_CHECK(in.num_tokens >= 0 && in.num_tokens <= ep.max_tokens_per_rank, "EINVAL",
           "input.x has " + std::to_string(in.num_tokens) + " tokens (rows), above buffer.maxTokensPerRank (" +
               std::to_string(ep.max_tokens_per_rank) + ")");
  // A group made with a small buffer.bytes (allGather or pipeline only) has no room for the receive regions.
  RF_CHECK(c.buf.bytes <= c.buffer_bytes(), "EINVAL",
           "dispatch needs a buffer of " + std::to_string(c.buf.bytes) + " bytes after the workspace; buffer.bytes gives " +
               std::to_string(c.buffer_bytes()) + " (use sizeHint(), " + std::to_string(size_hint(ep)) + " bytes)");
  RF_CHECK(in.x_elem_bytes == 2 || (in.x_elem_bytes == 1 && ep.fp8), "EINVAL",
           "x must be bf16, or fp8e4m3 on a buffer made with fp8Dispatch");
  RF_CHECK((in.x_elem_bytes == 1) == bool(in.scales), "EINVAL",
           in.x_elem_bytes == 1 ? "scales are required with fp8e4m3 x" : "scales are only for fp8e4m3 x");
  RF_CHECK(in.expert_alignment >= 1 && in.expert_alignment <= (1 << 16), "EINVAL", "expertAlignment must be in [1, 65536]");
  std::shared_ptr<DispatchLayout> from;
  if (in.handle != 0) {
    from = handle_layout(c, in.handle, "inputs.handle");
    RF_CHECK(from->num_tokens == in.num_tokens, "EINVAL",
             "x has " + std::to_string(in.num_tokens) + " tokens but the handle was made for " + std::to_string(from->num_tokens));
    // Refused before anything moved: the CPU never got this routing's counts to size the outputs by.
    RF_CHECK(from->counts_known || !in.cpu_sync, "EINVAL",
             "inputs.handle: its dispatch ran without a CPU sync, so the CPU has no counts to size the outputs by; "
             "dispatch with outputsInBuffer, or make the handle with a dispatch that syncs");
  } else {
    RF_CHECK(in.num_tokens == 0 || (in.topk_idx && in.topk_weights), "EINVAL",
             "topkIdx and topkWeights are required without a handle");
    if (!in.topk_idx.device) {  // device ids are checked by the kernels (Control.bad_*)
      const auto* idx = in.topk_idx.as<const int32_t>();
      const int64_t n = in.num_tokens * ep.topk;
      for (int64_t i = 0; i < n; ++i)
        RF_CHECK(idx[i] == -1 || (idx[i] >= 0 && idx[i] < ep.num_experts), "EINVAL",
                 "topkIdx[" + std::to_string(i) + "]: " + std::to_string(idx[i]) + " is outside [0, " +
                     std::to_string(ep.num_experts) + ") and not -1");
    }
    // Without a CPU sync its notify is device work the graph replays: every replay routes anew (an
    // elastic group's replay after a membership change routes among the ranks then serving).
    RF_CHECK(!(c.capturing() && in.cpu_sync), "EINVAL",
             "a dispatch without a handle is captured in a graph only with outputsInBuffer (its counts would need a CPU sync)");
  }
  auto l = c.add_layout();
  l->seq = c.next_seq();
  l->num_tokens = in.num_tokens;
  l->expert_alignment = in.expert_alignment;
  l->live_epoch = c.live_epoch;
  if (from) {
    l->masked_slots = from->masked_slots;
    // Cached mode (seed 6.1 cached_mode): the same routing, counts known; no notify, no CPU sync.
    l->fingerprint = from->fingerprint;
    l->counts_known = from->counts_known;
    l->counts = from->counts;
    l->num_recv = from->num_recv;
    b.adopt_routing(*l, *from, bool(in.topk_weights));
  } else {
    l->fingerprint = l->seq;
    b.dispatch_notify(l->seq, *l, in);
  }
  return l;
}

bool dispatch_counts(Context& c, DispatchLayout& l, bool block) {
  if (l.counts_known) return true;
  return c.backend().dispatch_counts(l, block);
}

void dispatch_finish(Context& c, DispatchLayout& l, const DispatchInput& in, DispatchOutput& out) {
  Backend& b = c.backend();
  RF_CHECK(out.in_buffer || l.counts_known, "EINVAL",
           "dispatch: outputs of numRecv rows need the counts (a CPU sync) first");
  RF_CHECK(!out.in_buffer || in.x.device, "EINVAL", "outputsInBuffer takes device tensors (backend 'cuda')");
  RF_CHECK(!(c.capturing() && !out.in_buffer), "EINVAL", "a captured dispatch must leave its outputs in the buffer");
  b.dispatch_data(l.seq, l, in, out);
  l.complete = true;
}

void aligned_tokens_per_expert(const DispatchLayout& l, double* out) {
  const std::vector<int64_t>& tpe = l.counts->per_expert;
  const int64_t a = l.expert_alignment;
  // No division per expert where nothing is rounded (the common case): 256 of them, into a vector made
  // per call, were ~1.5 µs of a cached dispatch's CPU time on the H200 machine.
  if (a == 1) {
    for (size_t e = 0; e < tpe.size(); ++e) out[e] = double(tpe[e]);
  } else {
    for (size_t e = 0; e < tpe.size(); ++e) out[e] = double(align_up(tpe[e], a));
  }
}

}  // namespace rankflow::ops
