// What a rank's GPU side (rank.cc) lends to its MoE part (moe.cc): the stream, windows, device
// scratch, the Diagnostic, NCCL, and its stream sync with failure translation. Executor thread only.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <string>

#include "../context.hpp"
#include "../cuda/error.hpp"
#include "../moe_device.hpp"

namespace rankflow::gpu {

// A cuda::CudaError as the core's Error: preconditions keep their code (EINVAL refuses an op and
// leaves the rank usable; BACKEND_UNAVAILABLE), a failed driver or NCCL call fails the rank (or
// names the rank whose trap poisoned the process). Defined in rank.cc.
Error to_error(const cuda::CudaError& e, int rank);

// Runs f, turning CUDA errors into the core's errors for `rank`.
template <typename F>
auto translating(int rank, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const cuda::CudaError& e) {
    throw to_error(e, rank);
  }
}

class RankGpu {
 public:
  virtual ~RankGpu() = default;
  virtual Context& ctx() = 0;
  virtual CUstream stream() const = 0;
  virtual CUdeviceptr window_of(int peer) const = 0;  // rank peer's window in my address space
  virtual int64_t window_stride() const = 0;
  virtual CUdeviceptr peer_table() const = 0;         // uint64_t[W] on the device
  virtual CUdeviceptr arrivals() const = 0;           // a zeroed device word of the stream
  virtual CUdeviceptr diag() const = 0;               // Diagnostic in mapped host memory
  virtual int sms() const = 0;
  virtual void* nccl_comm() const = 0;                // ncclComm_t or null
  virtual void check_alive(const char* what) const = 0;
  // Waits for the stream (CPU polling, aborts seen); a trap -> TIMEOUT_GPU, a fault -> RANK_FAILED.
  virtual void sync_stream(uint32_t seq) = 0;
  // The rank's protocol state is lost (a CPU-sync wait gave up while a kernel still waits).
  virtual void mark_dead(const std::string& why) = 0;
};

std::unique_ptr<MoeDevice> make_cuda_moe(RankGpu& g);

}  // namespace rankflow::gpu
