// DevicePool (pool.hpp).
#include "pool.hpp"

#include <algorithm>
#include <string>

#include "driver.hpp"
#include "protocol.hpp"

namespace rankflow::cuda {

void DevicePool::create(int ordinal, CUstream stream) {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = ordinal;
  RF_CU_FOR("the rank's device memory pool", cuMemPoolCreate, &pool_, &props);
  cuuint64_t keep = ~cuuint64_t(0);
  RF_CU(cuMemPoolSetAttribute, pool_, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
  RF_CU(cuStreamCreate, &alloc_stream_, CU_STREAM_NON_BLOCKING);
  stream_ = stream;
}

CUdeviceptr DevicePool::alloc(int64_t bytes, const char* what) {
  RF_CUDA_REQUIRE(pool_ != nullptr, "device memory pool used before it was created");
  const int64_t n = align_up(std::max<int64_t>(bytes, 1), kRegionAlignment);
  const auto kept = free_.find(n);
  if (kept != free_.end()) {
    const CUdeviceptr p = kept->second;
    free_.erase(kept);
    pooled_bytes_ -= n;
    live_[p] = n;
    return p;
  }
  CUdeviceptr p = 0;
  // In the rank's stream order: every use of a rank's device memory is on that stream (its ops, its
  // uploads and downloads), so nothing waits. While that stream is captured an allocation there would
  // become a node of the graph: then the side stream, synchronised (nothing runs during a capture).
  const CUstream s = capturing_ ? alloc_stream_ : stream_;
  RF_CU_FOR(std::string(what) + " of " + std::to_string(bytes) + " bytes", cuMemAllocFromPoolAsync, &p, size_t(n), pool_, s);
  if (capturing_) RF_CU(cuStreamSynchronize, alloc_stream_);
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
  } else if (capturing_) {
    deferred_.push_back(p);
  } else {
    RF_CU(cuMemFreeAsync, p, stream_);
  }
}

void DevicePool::end_capture() {
  capturing_ = false;
  for (const CUdeviceptr p : deferred_) RF_CU(cuMemFreeAsync, p, stream_);
  deferred_.clear();
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
  if (pool_ != nullptr) {
    for (auto& [p, n] : live_) d->cuMemFreeAsync(p, alloc_stream_);
    for (const CUdeviceptr p : deferred_) d->cuMemFreeAsync(p, alloc_stream_);
    for (auto& [n, p] : free_) d->cuMemFreeAsync(p, alloc_stream_);
    d->cuStreamSynchronize(alloc_stream_);
    d->cuMemPoolDestroy(pool_);
  }
  live_.clear();
  deferred_.clear();
  free_.clear();
  pooled_bytes_ = 0;
  if (alloc_stream_ != nullptr) d->cuStreamDestroy(alloc_stream_);
  alloc_stream_ = nullptr;
  pool_ = nullptr;
  stream_ = nullptr;
}

}  // namespace rankflow::cuda
