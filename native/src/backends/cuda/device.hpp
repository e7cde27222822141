// One rank's GPU: its primary context, retained for the rank's lifetime and made current on the
// calling thread (each rank's worker thread calls make_current() before any driver call), and the
// attributes the symmetric memory and the launchers need. Primary contexts, not cuCtxCreate: every
// thread and library (NCCL, torch) in the process then shares one context per GPU.
#pragma once

#include <cuda.h>

#include <string>

namespace rankflow::cuda {

class DeviceContext {
 public:
  explicit DeviceContext(int ordinal);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  // Binds the primary context to the calling thread (cheap; call at the top of every rank job).
  void make_current() const;

  int ordinal() const { return ordinal_; }
  CUdevice device() const { return device_; }
  CUcontext context() const { return context_; }
  const std::string& name() const { return name_; }
  int sm_count() const { return sm_count_; }
  int64_t l2_bytes() const { return l2_bytes_; }
  int compute_capability() const { return cc_major_ * 10 + cc_minor_; }
  // Host NUMA node closest to the GPU, for HOST_NUMA allocations; 0 where the system has no NUMA
  // (the driver answers -1, and cuMemCreate wants id 0 then).
  int host_numa_id() const { return numa_id_; }
  bool supports_posix_fd_vmm() const { return vmm_ && posix_fd_; }

 private:
  int ordinal_ = -1;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  std::string name_;
  int sm_count_ = 0, cc_major_ = 0, cc_minor_ = 0, numa_id_ = 0;
  int64_t l2_bytes_ = 0;
  bool vmm_ = false, posix_fd_ = false;
};

}  // namespace rankflow::cuda
