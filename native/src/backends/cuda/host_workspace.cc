// HostWorkspace: cuMemHostAlloc(DEVICEMAP | PORTABLE) and its device alias.
#include "host_workspace.hpp"

#include <cstring>
#include <string>

#include "protocol.hpp"
#include "driver.hpp"

namespace rankflow::cuda {

void HostWorkspace::create(int64_t bytes) {
  RF_CUDA_REQUIRE(host_ == nullptr, "the host workspace is already created: destroy() it first.");
  RF_CUDA_REQUIRE(bytes > 0, "the host workspace needs a positive size.");
  bytes_ = align_up(bytes, 4096);
  RF_CU_FOR("mapped host workspace of " + std::to_string(bytes_) + " bytes", cuMemHostAlloc, &host_,
            size_t(bytes_), CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
  std::memset(host_, 0, size_t(bytes_));
  try {
    RF_CU(cuMemHostGetDevicePointer, &device_, host_, 0);
  } catch (...) {
    destroy();
    throw;
  }
}

void HostWorkspace::destroy() noexcept {
  if (host_ != nullptr) {
    try {
      driver().cuMemFreeHost(host_);
    } catch (...) {
    }
  }
  host_ = nullptr;
  device_ = 0;
  bytes_ = 0;
}

}  // namespace rankflow::cuda
