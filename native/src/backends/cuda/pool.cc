// DevicePool (pool.hpp).
#include "pool.hpp"

#include <algorithm>
#include <string>

#include "driver.hpp"
#include "protocol.hpp"

namespace rankflow::cuda {

CUdeviceptr DevicePool::alloc(int64_t bytes, const char* what) {
  const int64_t n = align_up(std::max<int64_t>(bytes, 1), kRegionAlignment);
  CUdeviceptr p = 0;
  const auto it = free_.find(n);
  if (it != free_.end()) {
    p = it->second;
    free_.erase(it);
    pooled_bytes_ -= n;
  } else {
    RF_CU_FOR(std::string(what) + " of " + std::to_string(bytes) + " bytes", cuMemAlloc, &p, size_t(n));
  }
  live_[p] = n;
  return p;
}

void DevicePool::free(CUdeviceptr p) {
  const auto it = live_.find(p);
  RF_CUDA_REQUIRE(it != live_.end(), "free: not a live device tensor of this rank");
  const int64_t n = it->second;
  live_.erase(it);
  if (pooled_bytes_ + n <= (int64_t(4) << 30)) {
    free_.emplace(n, p);
    pooled_bytes_ += n;
  } else {
    RF_CU(cuMemFree, p);
  }
}

CUevent DevicePool::new_event() {
  CUevent e = nullptr;
  RF_CU(cuEventCreate, &e, CU_EVENT_DEFAULT);
  events_.insert(e);
  return e;
}

void DevicePool::destroy_event(CUevent e) {
  if (events_.erase(e)) driver().cuEventDestroy(e);
}

void DevicePool::destroy() noexcept {
  const Driver* d = nullptr;
  try {
    d = &driver();
  } catch (...) {
    return;
  }
  for (CUevent e : events_) d->cuEventDestroy(e);
  events_.clear();
  for (auto& [p, n] : live_) d->cuMemFree(p);
  live_.clear();
  for (auto& [n, p] : free_) d->cuMemFree(p);
  free_.clear();
  pooled_bytes_ = 0;
}

}  // namespace rankflow::cuda
