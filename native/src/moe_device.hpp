// The MoE side of a rank's GPU backend (native/src/gpu/moe.cc): dispatch and combine on the CUDA
// kernels with the host executor's phases, plus the device memory, stream sync, CUDA events and
// baselines that rank programs with device-resident tensors use. Reached through
// DeviceBackend::moe(); every method runs on the rank's executor thread.
#pragma once

#include <cstdint>

#include "ops/ops.hpp"

namespace rankflow {

class MoeDevice {
 public:
  virtual ~MoeDevice() = default;
  // The phases of ops/dispatch.cc and ops/combine.cc. With in.device the tensors are device addresses
  // (rank programs; nothing is synchronised at the end, rank.sync() does), otherwise host memory
  // (driver mode: staged through device memory, results copied back before returning).
  virtual uint32_t dispatch_notify(const ops::DispatchInput& in) = 0;
  virtual ops::DispatchCounts dispatch_wait(uint32_t layout_id) = 0;
  // out.in_buffer: the outputs stay in the buffer; their addresses are written into out.
  virtual void dispatch_data(uint32_t layout_id, const ops::DispatchInput& in, ops::DispatchOutput& out) = 0;
  virtual void combine(const ops::CombineInput& in, uint16_t* out_x, float* out_weights) = 0;

  // Device memory on the rank's GPU (freed at destroy at the latest), stream-ordered copies.
  virtual uint64_t alloc(int64_t bytes) = 0;
  virtual void free(uint64_t ptr) = 0;
  virtual void upload(uint64_t dst, const void* src, int64_t bytes) = 0;
  virtual void download(void* dst, uint64_t src, int64_t bytes) = 0;
  virtual void sync() = 0;
  // CUDA events on the rank's stream: record, elapsed (waits for the stream), destroy.
  virtual uint64_t record_event() = 0;
  virtual double elapsed_ms(uint64_t start, uint64_t end) = 0;
  virtual void destroy_event(uint64_t event) = 0;
  // Baselines, ms per op after warm-up (CUDA events): ncclAlltoAll of `bytes` per rank (bytes / W to
  // each rank), and a copy-engine copy of `bytes` into the next rank's buffer (cuMemcpyAsync).
  virtual double bench_all_to_all(int64_t bytes, int iters, int warmup) = 0;
  virtual double bench_peer_copy(int64_t bytes, int iters, int warmup) = 0;
  // Device time of the last dispatch (first launch to the data kernel's end, the CPU-sync gap
  // included) or combine, between CUDA events recorded around its launches; waits for the stream.
  virtual double last_op_ms() = 0;
  virtual int sm_count() const = 0;
  virtual void destroy() noexcept = 0;
};

}  // namespace rankflow
