// Launchers of the MoE kernels (kernels/dispatch.cu, kernels/combine.cu), taking plain device
// addresses and the shared layouts, so the Context only passes its layouts, peer table, streams and
// tensors. The protocol, slots and receive order are the host executor's (native/src/ops/dispatch.cc,
// combine.cc); moe_args.hpp says where the dispatched rows land (compacted in the receiver's buffer).
//
// A dispatch with CPU sync:     launch_dispatch_notify -> poll_dispatch_counts until true (CPU)
//                               -> allocate outputs of num_recv rows -> launch_dispatch_data
// A dispatch without CPU sync:  launch_dispatch_notify -> launch_dispatch_data with DispatchOut{}
//                               (outputs stay in the buffer, worst-case sized W * max_tokens; counts
//                               on the device in the state: recv_offset[W] = num_recv)
// A cached dispatch:            launch_dispatch_cached (no notify, no CPU sync; the routing and
//                               counts of a previous layout's state)
// Combine:                      launch_combine with the state of the dispatch's layout
// Every op takes its own sequence number (MoeArgs.seq, as the host executor's c.next_seq()).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <vector>

#include "../layout.hpp"
#include "moe_args.hpp"

namespace rankflow::cuda {

// The MoE kernels loaded into the current context (one instance per rank, created on the rank's
// thread with its context current). Throws BACKEND_UNAVAILABLE when the build had no nvcc.
class MoeKernels {
 public:
  MoeKernels();
  ~MoeKernels();
  MoeKernels(const MoeKernels&) = delete;
  MoeKernels& operator=(const MoeKernels&) = delete;

  CUfunction notify() const { return notify_; }
  CUfunction data() const { return data_; }
  CUfunction combine() const { return combine_; }

 private:
  CUmodule load(const char* image);
  CUfunction function(CUmodule module, const char* image, const char* entry);
  std::vector<CUmodule> modules_;
  CUfunction notify_ = nullptr, data_ = nullptr, combine_ = nullptr;
};

// The arguments every MoE launch shares. peer_table: uint64_t[W] in device memory (peer_table() of
// the symmetric memory, uploaded); the buffer follows the workspace in every window. diag: device
// address of a Diagnostic in mapped host memory (or 0). arrivals: a zeroed 4-byte device word owned
// by the stream (the kernels leave it zeroed; ops on one stream may share it).
moe::MoeArgs moe_args(CUdeviceptr peer_table, int64_t workspace_offset, const WorkspaceLayout& ws,
                      const BufferLayout& buf, const EpConfig& ep, int rank, uint32_t seq,
                      uint64_t timeout_ns, CUdeviceptr diag, CUdeviceptr arrivals);

// The device state of one dispatch layout: allocate state_bytes() of device memory per handle.
inline moe::MoeStateLayout moe_state_layout(const moe::MoeArgs& a) {
  return moe::MoeStateLayout::make(a.world, a.max_tokens, a.topk, a.experts_per_rank);
}
// Bytes of mapped host memory poll_dispatch_counts reads (zeroed once; each op's seq tells them apart).
inline int64_t host_counts_bytes(const moe::MoeArgs& a) {
  return moe::host_counts_words(a.world, a.experts_per_rank) * 8;
}

// Notify: routing into `state`, counts into every peer, peers' counts into `state` and into the
// host mirror (host_counts: its device address, may be 0 when nobody polls), then `enter`.
// topk_idx: [num_tokens, topk] int32 on the device. One block.
void launch_dispatch_notify(const MoeKernels& k, CUstream stream, const moe::MoeArgs& a, CUdeviceptr state,
                            CUdeviceptr topk_idx, int64_t num_tokens, CUdeviceptr host_counts);

// The CPU-sync wait, one poll (never blocks): true once every count of op `seq` is in the mirror
// (its host address); fills recv_count[W], tokens_per_expert[experts_per_rank] (unaligned), num_recv.
struct HostDispatchCounts {
  int64_t num_recv = 0;
  std::vector<int64_t> recv_count;
  std::vector<int64_t> tokens_per_expert;
};
bool poll_dispatch_counts(const void* host_counts, int world, int experts_per_rank, uint32_t seq,
                          HostDispatchCounts* out);

// Data (after notify of the same seq). num_sms: blocks, 1 block per SM, at most sm_count (the blocks
// wait on each other). out: all null to leave the outputs in the buffer, else num_recv rows each.
void launch_dispatch_data(const MoeKernels& k, CUstream stream, const moe::MoeArgs& a, CUdeviceptr state,
                          const moe::DispatchIn& in, const moe::DispatchOut& out, int num_sms, int sm_count);

// Cached dispatch (no notify, no CPU sync): copies the routing part of `from_state` (a completed
// layout with the same topk_idx) into `state` unless they are the same allocation, then runs the
// data kernel, which announces `enter` itself.
void launch_dispatch_cached(const MoeKernels& k, CUstream stream, const moe::MoeArgs& a, CUdeviceptr from_state,
                            CUdeviceptr state, const moe::DispatchIn& in, const moe::DispatchOut& out,
                            int num_sms, int sm_count);

// Where the outputs are when DispatchOut was left null: dense tensors in this rank's buffer
// (my_window: this rank's window address) and src_rank in the state.
moe::DispatchOut dispatch_outputs_in_buffer(const moe::MoeArgs& a, CUdeviceptr my_window, CUdeviceptr state,
                                            bool with_scales);

// Combine with the state of the dispatch's layout. in.x must not lie in the symmetric buffer.
// send_blocks: -1 = a third of the blocks send while the others reduce as rows arrive (split mode);
// 0 = every block sends, then every block reduces after `done`; n = n blocks send.
void launch_combine(const MoeKernels& k, CUstream stream, const moe::MoeArgs& a, CUdeviceptr state,
                    const moe::CombineIn& in, const moe::CombineOut& out, int num_sms, int sm_count,
                    int send_blocks = -1);

}  // namespace rankflow::cuda
