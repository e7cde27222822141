// What an application's own GPU work needs to run beside a rank's (rank programs: rank.cudaStream(),
// rank.cudaContext(), rank.waitEvent(), rank.wrapDevice()): the rank's stream and context as
// addresses, a wait of the rank's stream for an event recorded elsewhere, and the check that memory
// handed to rankflow is device memory of the rank's GPU. Events the application waits on are the
// ones rank.recordEvent() makes (backend.cc): plain CUevents on the rank's stream.
#include <cstdio>

#include "backend.hpp"
#include "driver.hpp"
#include "faults.hpp"

namespace rankflow::cuda {

uint64_t CudaBackend::stream_handle() {
  check_alive("cudaStream");
  return uint64_t(reinterpret_cast<uintptr_t>(stream_));
}

uint64_t CudaBackend::context_handle() {
  check_alive("cudaContext");
  return uint64_t(reinterpret_cast<uintptr_t>(dev_->context()));
}

void CudaBackend::wait_event(uint64_t event) {
  check_alive("waitEvent");
  RF_CHECK(event != 0, "EINVAL", "waitEvent: event is 0, not a CUevent");
  // A wait on an event recorded outside the capture would make the captured graph depend on work
  // that is not in it (CUDA invalidates such a capture).
  RF_CHECK(!capturing_, "STATE", "waitEvent inside rank.capture(): a graph cannot wait for an event recorded outside it");
  const CUresult r = driver().cuStreamWaitEvent(stream_, reinterpret_cast<CUevent>(uintptr_t(event)), 0);
  // A handle CUDA does not know is the caller's mistake, not the rank's failure.
  if (r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_VALUE)
    throw Error("EINVAL", "waitEvent: " + hex_text(event, false) + " is not a live CUevent (" + error_name(r) + ")");
  translating(rank(), [&] { check(r, "cuStreamWaitEvent"); });
}

void CudaBackend::check_device_memory(uint64_t ptr, int64_t bytes) {
  check_alive("wrapDevice");
  const Driver& d = driver();
  // Both ends: an allocation made of several mappings (cuMemMap, caching allocators) has no one
  // range to compare with, and every kernel that reads the tensor touches both ends.
  const uint64_t last = ptr + uint64_t(bytes > 0 ? bytes - 1 : 0);
  RF_CHECK(ptr != 0 && last >= ptr, "EINVAL", "wrapDevice: ptr " + hex_text(ptr, false) + " with " + std::to_string(bytes) + " bytes is not an address range");
  for (const uint64_t at : {ptr, last}) {
    const std::string where = at == ptr ? "ptr " + hex_text(ptr, false) : "its last byte " + hex_text(at, false);
    unsigned int type = 0;
    CUresult r = d.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CUdeviceptr(at));
    RF_CHECK(r == CUDA_SUCCESS, "EINVAL",
             "wrapDevice: " + where + " is not memory CUDA knows (" + error_name(r) + "): pass a device allocation");
    RF_CHECK(type == CU_MEMORYTYPE_DEVICE, "EINVAL",
             "wrapDevice: " + where + " is not device memory (memory type " + std::to_string(type) +
                 "); host memory goes through rank.hostTensor");
    // Reserved address space with nothing mapped there (cuMemAddressReserve); a driver that cannot
    // say is not taken for a refusal.
    int mapped = 1;
    r = d.cuPointerGetAttribute(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, CUdeviceptr(at));
    RF_CHECK(r != CUDA_SUCCESS || mapped != 0, "EINVAL", "wrapDevice: " + where + " is not mapped to memory");
    int ordinal = -1;
    r = d.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CUdeviceptr(at));
    RF_CHECK(r == CUDA_SUCCESS, "EINVAL", "wrapDevice: the GPU of " + where + " is unknown (" + error_name(r) + ")");
    RF_CHECK(ordinal == ordinal_, "EINVAL",
             "wrapDevice: " + where + " is memory of GPU " + std::to_string(ordinal) + "; this rank runs on GPU " +
                 std::to_string(ordinal_));
  }
}

}  // namespace rankflow::cuda
