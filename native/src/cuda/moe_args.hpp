// Arguments of the MoE kernels (kernels/dispatch.cu, kernels/combine.cu), shared by the kernels and
// their launchers (moe_launch.cc): plain structs of fixed-width fields, laid out identically by g++
// and nvcc, passed by value through cuLaunchKernel. Slot and region offsets come from layout.hpp.
//
// The device state of one dispatch layout (what a handle keeps for cached dispatch and combine) is
// one device allocation cut by MoeStateLayout: the routing part first (copied as a whole for cached
// dispatch), then the per-dispatch receive part.
//
// Where dispatched rows land: sender r writes its i-th token for receiver p (token order) straight
// into p's buffer at row recv_offset_p[r] + i, i.e. already compacted in the receive order of the host
// executor (by source rank, then source token). Each buffer region then holds a dense output tensor:
// x at buf.x (row = hidden * x_elem_bytes), scales at buf.scales, topk_idx at buf.topk_idx,
// topk_weights at buf.topk_weights, src_token at buf.src_token; src_rank is in the state
// (recv_src_rank). The receiver tells each sender its offset in the payload of the `enter` signal:
// enter[p] = encode_signal(seq, recv_offset_p[r]) (the host executor waits on enter by sequence
// only, so its payload is free).
#pragma once

#include <cstdint>

#include "../layout.hpp"

namespace rankflow::moe {

struct MoeArgs {
  const uint64_t* peer_table = nullptr;  // device memory: rank p's window in this rank's address space
  int64_t workspace_offset = 0;          // of the workspace inside every window
  int64_t buffer_offset = 0;             // of the buffer inside every window (workspace_offset + ws.bytes)
  WorkspaceLayout ws;
  BufferLayout buf;
  int32_t rank = 0, world = 1;
  int32_t hidden = 0, topk = 0;
  int32_t num_experts = 0, experts_per_rank = 0;
  int64_t max_tokens = 0;                // max_tokens_per_rank
  uint32_t seq = 0, pad0 = 0;            // this op's sequence number
  uint64_t timeout_ns = 0;               // a device wait longer than this writes *diag and traps
  Diagnostic* diag = nullptr;            // mapped host memory (device address), may be null
  unsigned int* arrivals = nullptr;      // a zeroed device word per stream; kernels leave it zeroed
};

// The device state of one dispatch layout (pointers into one allocation, see MoeStateLayout).
struct MoeState {
  int32_t* send_count = nullptr;          // [W] tokens I send to rank p
  int32_t* recv_count = nullptr;          // [W] tokens rank p sends me
  int32_t* recv_offset = nullptr;         // [W + 1] first output row of rank p's tokens; [W] = num_recv
  int32_t* tokens_per_expert = nullptr;   // [experts_per_rank] unaligned
  uint64_t* dest_mask = nullptr;          // [max_tokens] bit p: token t goes to rank p
  int32_t* send_slot = nullptr;           // [max_tokens * W] index of t among my tokens for p, or -1
  int32_t* recv_src_rank = nullptr;       // [W * max_tokens] per output row
  // receive part (rewritten by every dispatch, cached ones too)
  int32_t* recv_src_token = nullptr;      // [W * max_tokens]
  float* recv_topk_weights = nullptr;     // [W * max_tokens * topk]
  int32_t* send_offset = nullptr;         // [W] first row of my tokens in rank p's output
};

struct MoeStateLayout {
  int64_t send_count = 0, recv_count = 0, recv_offset = 0, tokens_per_expert = 0, dest_mask = 0,
          send_slot = 0, recv_src_rank = 0, routing_bytes = 0, recv_src_token = 0,
          recv_topk_weights = 0, send_offset = 0, bytes = 0;

  RF_HD static MoeStateLayout make(int32_t world, int64_t max_tokens, int64_t topk, int64_t experts_per_rank) {
    MoeStateLayout l;
    const int64_t a = kRegionAlignment;
    int64_t off = 0;
    l.send_count = off;        off = align_up(off + world * 4, a);
    l.recv_count = off;        off = align_up(off + world * 4, a);
    l.recv_offset = off;       off = align_up(off + (world + 1) * 4, a);
    l.tokens_per_expert = off; off = align_up(off + (experts_per_rank > 0 ? experts_per_rank : 1) * 4, a);
    l.dest_mask = off;         off = align_up(off + (max_tokens > 0 ? max_tokens : 1) * 8, a);
    l.send_slot = off;         off = align_up(off + (max_tokens > 0 ? max_tokens : 1) * world * 4, a);
    l.recv_src_rank = off;     off = align_up(off + (max_tokens > 0 ? max_tokens : 1) * world * 4, a);
    l.routing_bytes = off;
    l.recv_src_token = off;    off = align_up(off + (max_tokens > 0 ? max_tokens : 1) * world * 4, a);
    l.recv_topk_weights = off; off = align_up(off + (max_tokens > 0 ? max_tokens : 1) * world * topk * 4, a);
    l.send_offset = off;       off = align_up(off + world * 4, a);
    l.bytes = off;
    return l;
  }
  RF_HD MoeState at(uint64_t base) const {
    MoeState s;
    s.send_count = reinterpret_cast<int32_t*>(base + send_count);
    s.recv_count = reinterpret_cast<int32_t*>(base + recv_count);
    s.recv_offset = reinterpret_cast<int32_t*>(base + recv_offset);
    s.tokens_per_expert = reinterpret_cast<int32_t*>(base + tokens_per_expert);
    s.dest_mask = reinterpret_cast<uint64_t*>(base + dest_mask);
    s.send_slot = reinterpret_cast<int32_t*>(base + send_slot);
    s.recv_src_rank = reinterpret_cast<int32_t*>(base + recv_src_rank);
    s.recv_src_token = reinterpret_cast<int32_t*>(base + recv_src_token);
    s.recv_topk_weights = reinterpret_cast<float*>(base + recv_topk_weights);
    s.send_offset = reinterpret_cast<int32_t*>(base + send_offset);
    return s;
  }
};

// The mapped host mirror of the counts a dispatch notify received, for the CPU-sync wait: the raw
// encoded slot values (0 = not written; signal_seq == the op's seq and a payload = ready).
//   [0, W)                       rank_count[p]                (written last)
//   [W, W + W * epr)             expert_count[p * epr + e]
RF_HD int64_t host_counts_words(int32_t world, int64_t experts_per_rank) {
  return int64_t(world) * (1 + experts_per_rank);
}

// Combine's per-row arrival flags (split mode, see combine.cu): uint64 per receive slot, the region
// BufferLayout::combine_flags (layout.hpp), part of the combine region and so of size_hint.
constexpr uint64_t kCombineFlagTag = 0x5EEDF1A6u;
RF_HD int64_t combine_flags_offset(const BufferLayout& b) { return b.combine_flags; }
RF_HD bool combine_flags_fit(const BufferLayout& b) { return b.combine_flags + b.slots * 8 <= b.bytes; }

// Dispatch tensors (device addresses). Input x is [T, hidden] of x_elem_bytes (2: bf16, 1: fp8).
struct DispatchIn {
  const void* x = nullptr;
  const float* scales = nullptr;         // [T, hidden / 128] (fp8) or null
  const int32_t* topk_idx = nullptr;     // [T, topk] global expert ids, -1 = unused
  const float* topk_weights = nullptr;   // [T, topk]
  int64_t num_tokens = 0;
  int32_t x_elem_bytes = 2, pad0 = 0;
};
// Outputs, [num_recv, ...] each. All null: the outputs stay in the buffer (dense tensors at the
// regions named above; src_rank in the state). Otherwise every pointer must be set (scales only with
// scales in) and the kernel copies the received rows there.
struct DispatchOut {
  void* x = nullptr;
  float* scales = nullptr;
  int32_t* topk_idx = nullptr;
  float* topk_weights = nullptr;
  int32_t* src_rank = nullptr;
  int32_t* src_token = nullptr;
};

// Combine tensors (device addresses). x is [num_recv, hidden] bf16 in the dispatch's receive order
// and must not lie in the symmetric buffer (peers write there during the combine).
struct CombineIn {
  const uint16_t* x = nullptr;
  const float* topk_weights = nullptr;   // [num_recv, topk] or null: the dispatched weights
  const uint16_t* bias0 = nullptr;       // [T, hidden] bf16 or null
  const uint16_t* bias1 = nullptr;
  int64_t num_tokens = 0;                // T of the dispatch (the handle's)
};
struct CombineOut {
  uint16_t* x = nullptr;                 // [T, hidden] bf16
  float* topk_weights = nullptr;         // [T, topk]
};

}  // namespace rankflow::moe
