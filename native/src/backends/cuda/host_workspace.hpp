// Pinned host memory mapped into the GPUs' address space (cuMemHostAlloc DEVICEMAP | PORTABLE): where
// a trapping kernel leaves its Diagnostic, and where the CPU polls counters without a copy. It stays
// readable by the CPU after a kernel trapped (the trap poisons the context, not this memory), as long
// as the context is not destroyed first: read the Diagnostic, then tear down.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace rankflow::cuda {

class HostWorkspace {
 public:
  HostWorkspace() = default;
  HostWorkspace(const HostWorkspace&) = delete;
  HostWorkspace& operator=(const HostWorkspace&) = delete;
  ~HostWorkspace() { destroy(); }

  // Allocates `bytes` (rounded up to 4 KiB), zeroed. A context must be current; PORTABLE makes the
  // memory usable from every context of the process, so one workspace may serve several ranks.
  void create(int64_t bytes);
  void destroy() noexcept;  // idempotent

  void* host() const { return host_; }
  CUdeviceptr device() const { return device_; }  // the same bytes, as kernels address them
  int64_t bytes() const { return bytes_; }
  template <typename T>
  T* host_at(int64_t offset) const { return reinterpret_cast<T*>(static_cast<char*>(host_) + offset); }
  CUdeviceptr device_at(int64_t offset) const { return device_ + CUdeviceptr(offset); }

 private:
  void* host_ = nullptr;
  CUdeviceptr device_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace rankflow::cuda
