// Device memory of one rank: a pool of cuMemAlloc'd blocks by size (a freed block goes back to its
// size class, so that a tensor of the same size reuses it without cuMemFree's device-wide
// synchronisation; up to 4 GiB pooled), and the CUDA events of its rank programs.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <set>

namespace rankflow::cuda {

class DevicePool {
 public:
  DevicePool() = default;
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  ~DevicePool() { destroy(); }

  CUdeviceptr alloc(int64_t bytes, const char* what);
  // EINVAL for an address that is not a live block of this pool.
  void free(CUdeviceptr p);
  bool owns(CUdeviceptr p) const { return live_.count(p) != 0; }
  CUevent new_event();
  bool owns_event(CUevent e) const { return events_.count(e) != 0; }
  void destroy_event(CUevent e);
  void destroy() noexcept;  // everything, live or pooled

 private:
  std::map<CUdeviceptr, int64_t> live_;
  std::multimap<int64_t, CUdeviceptr> free_;
  int64_t pooled_bytes_ = 0;
  std::set<CUevent> events_;
};

}  // namespace rankflow::cuda
