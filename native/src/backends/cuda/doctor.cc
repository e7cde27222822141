// cuda_doctor(): the driver, kernel and NCCL probes in one report.
#include "doctor.hpp"

#include "driver.hpp"
#include "kernel_images.hpp"
#include "nccl.hpp"

namespace rankflow::cuda {

CudaDoctor cuda_doctor() {
  CudaDoctor r;
  std::string why;
  r.driver_ok = driver_available(&why);
  if (r.driver_ok) {
    const Driver& d = driver();
    r.driver = "libcuda at " + d.library + ", CUDA " + std::to_string(d.version / 1000) + "." +
               std::to_string(d.version % 1000 / 10) + ", " + std::to_string(d.device_count) + " GPU(s)";
  } else {
    r.driver = why;
  }
  std::size_t images = 0;
  kernel_images(&images);
  r.kernels_ok = images > 0;
  r.kernels = kernel_build_note();
  r.nccl_ok = nccl_available(&why);
  if (r.nccl_ok) {
    const Nccl& n = nccl();
    r.nccl = "NCCL " + nccl_version_string(n.version) + " at " + n.library + " (" + n.origin + "); ncclCommShrink " +
             (n.comm_shrink ? "yes" : "no") + ", ncclCommGrow " + (n.comm_grow ? "yes" : "no");
  } else {
    r.nccl = why;
  }
  return r;
}

}  // namespace rankflow::cuda
