// Device memory of one rank: a CUDA memory pool of its own, used in the order of the rank's stream
// (cuMemAllocFromPoolAsync / cuMemFreeAsync there; during a capture, allocations go to a side stream).
// A free comes after the work that used the memory. Freed blocks are kept by size (up to 4 GiB) and
// handed out again with no driver call at all: a dispatch's per-layout state costs nothing in the
// steady state. Reuse is safe in stream order: the next user is a later op on the same stream. Neither synchronises the device: cuMemAlloc and cuMemFree may wait for every
// kernel of the context, and with ranks sharing a GPU (one context) that would be a peer's kernel
// waiting for this rank, a deadlock. The pool keeps what it got (no release threshold), so that the
// steady state allocates nothing from the driver. The rank's CUDA events live here too.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <set>
#include <vector>

namespace rankflow::cuda {

class DevicePool {
 public:
  DevicePool() = default;
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  ~DevicePool() { destroy(); }

  // The pool on GPU `ordinal`; frees are ordered on `stream` (the rank's).
  void create(int ordinal, CUstream stream);
  CUdeviceptr alloc(int64_t bytes, const char* what);
  // EINVAL for an address that is not a live block of this pool. While the rank's stream is being
  // captured into a graph the free waits until end_capture() (a free in a capture would be a graph node).
  void free(CUdeviceptr p);
  void begin_capture() { capturing_ = true; }
  void end_capture();
  bool owns(CUdeviceptr p) const { return live_.count(p) != 0; }
  CUevent new_event();
  bool owns_event(CUevent e) const { return events_.count(e) != 0; }
  void destroy_event(CUevent e);
  void destroy() noexcept;  // everything; the rank's stream must be idle

 private:
  CUmemoryPool pool_ = nullptr;
  CUstream alloc_stream_ = nullptr, stream_ = nullptr;
  std::map<CUdeviceptr, int64_t> live_;
  std::multimap<int64_t, CUdeviceptr> free_;  // kept for reuse, by size
  int64_t pooled_bytes_ = 0;
  std::vector<CUdeviceptr> deferred_;
  bool capturing_ = false;
  std::set<CUevent> events_;
};

}  // namespace rankflow::cuda
