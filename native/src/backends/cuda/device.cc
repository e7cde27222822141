// DeviceContext: primary context retain/release and device attributes.
#include "device.hpp"

#include "driver.hpp"

namespace rankflow::cuda {

DeviceContext::DeviceContext(int ordinal) : ordinal_(ordinal) {
  const Driver& d = driver();
  if (ordinal < 0 || ordinal >= d.device_count)
    throw CudaError("EINVAL", "",
                    "GPU " + std::to_string(ordinal) + " does not exist: the driver sees " +
                        std::to_string(d.device_count) +
                        " GPU(s). Pass `devices` with ordinals below that, or fewer ranks.");
  RF_CU(cuDeviceGet, &device_, ordinal);
  char name[256] = {};
  RF_CU(cuDeviceGetName, name, int(sizeof(name)), device_);
  name_ = name;
  auto attr = [&](CUdevice_attribute a) {
    int v = 0;
    RF_CU(cuDeviceGetAttribute, &v, a, device_);
    return v;
  };
  sm_count_ = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  l2_bytes_ = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  cc_major_ = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  cc_minor_ = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  vmm_ = attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) != 0;
  posix_fd_ = attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) != 0;
  const int numa = attr(CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID);
  numa_id_ = numa < 0 ? 0 : numa;
  RF_CU(cuDevicePrimaryCtxRetain, &context_, device_);
  make_current();
}

DeviceContext::~DeviceContext() {
  // A destructor must not throw: a failed release (driver torn down at exit) leaks nothing we own.
  if (context_ != nullptr) driver().cuDevicePrimaryCtxRelease(device_);
}

void DeviceContext::make_current() const { RF_CU(cuCtxSetCurrent, context_); }

}  // namespace rankflow::cuda
