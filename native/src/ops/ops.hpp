// The operations of the protocol, as executed by the host backend (the reference executor).
// Each takes plain host pointers; the addon keeps the JS memory behind them alive for the call.
// The same phases, slots and receive orders are what the CUDA kernels implement.
#pragma once

#include <cstdint>
#include <vector>

#include "../context.hpp"

namespace rankflow::ops {

// barrier: every rank writes its epoch into every peer's slot, then waits for all of them (device round,
// a new seq). The CPU-sync round (cpu_round) follows a device round under the same seq and is waited
// on by the CPU with the CPU timeout.
void barrier(Context& c, bool cpu_round);

// allGather outside a session: out (W * bytes) = every rank's `bytes` in rank order.
void all_gather(Context& c, const uint8_t* in, int64_t bytes, uint8_t* out);

struct DispatchInput {
  const uint8_t* x = nullptr;          // [T, hidden] bf16 or fp8 bits
  int64_t x_elem_bytes = 2;
  const float* scales = nullptr;       // [T, hidden / 128] (fp8)
  const int32_t* topk_idx = nullptr;   // [T * K], -1 = unused
  const float* topk_weights = nullptr; // [T * K]
  int64_t num_tokens = 0;
  int64_t expert_alignment = 1;
  uint32_t cached_handle = 0;          // 0 = compute the layout and notify
  bool device = false;                 // cuda rank programs: the pointers are device addresses
  int num_sms = 0;                     // cuda: blocks of the data kernel (0 = every SM)
};
struct DispatchCounts {
  int64_t num_recv = 0;
  std::vector<int64_t> tokens_per_expert;  // aligned
};
struct DispatchOutput {
  uint8_t* x = nullptr;                // [num_recv, hidden]
  float* scales = nullptr;
  int32_t* topk_idx = nullptr;         // local expert ids, -1 elsewhere
  float* topk_weights = nullptr;
  int32_t* src_rank = nullptr;
  int32_t* src_token = nullptr;
  bool in_buffer = false;              // cuda: leave the outputs in the buffer (their addresses come back here)
};
// Phase 1 (layout + notify): returns the layout id the handle will carry.
uint32_t dispatch_notify(Context& c, const DispatchInput& in);
// Phase 2 (CPU sync): waits until every peer's counts arrived in the workspace (TIMEOUT_CPU otherwise).
DispatchCounts dispatch_wait(Context& c, uint32_t layout_id);
// Phase 3 (data): rows, scales, topk and source indices into the receivers' buffers, then compaction.
void dispatch_data(Context& c, uint32_t layout_id, const DispatchInput& in, const DispatchOutput& out);
// Drops a layout whose dispatch failed before its data phase.
void dispatch_abandon(Context& c, uint32_t layout_id);

struct CombineInput {
  uint32_t handle = 0;
  const uint16_t* x = nullptr;          // [num_recv, hidden] bf16
  const float* topk_weights = nullptr;  // [num_recv * K] or null: the dispatched weights
  const uint16_t* bias[2] = {nullptr, nullptr};  // [T, hidden] bf16 each
  bool device = false;                  // cuda rank programs: x, weights, biases and outputs are device addresses
  int num_sms = 0;                      // cuda: blocks of the combine kernel (0 = every SM)
};
void combine(Context& c, const CombineInput& in, uint16_t* out_x, float* out_weights);

// AGRS sessions (seed 6.3): open/close are a batched write-and-wait of the session index.
void session_open(Context& c, int64_t max_bytes, int64_t max_all_gathers);
void session_close(Context& c);
void session_all_gather(Context& c, const uint8_t* in, int64_t bytes, uint8_t* out);
// in: [W * n, ...] of fp32 or bf16; out[n, ...] = sum over ranks of their rows [rank*n, (rank+1)*n), fp32 accumulation.
void session_reduce_scatter(Context& c, const void* in, int64_t elems_per_rank, bool bf16, void* out);

// engram: a table in the host segment, fetched by global row id.
void engram_write(Context& c, const uint8_t* table, int64_t entries, int64_t row_bytes);
void engram_fetch(Context& c, const int32_t* ids, int64_t n, uint8_t* out);

// pipeline: send to rank+1, receive from rank-1 (ring).
void pp_exchange(Context& c, const uint8_t* in, int64_t bytes, uint8_t* out);

}  // namespace rankflow::ops
