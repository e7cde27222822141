// What the CUDA backend would find on this machine, without throwing: for `rankflow doctor`, for
// backend 'auto' (falls back to host, saying why) and for error messages.
#pragma once

#include <string>

namespace rankflow::cuda {

struct CudaDoctor {
  bool driver_ok = false;
  std::string driver;   // "libcuda at <path>, CUDA 13.0, 2 GPU(s)" or why not
  bool kernels_ok = false;
  std::string kernels;  // kernel_build_note()
  bool nccl_ok = false;
  std::string nccl;     // "NCCL 2.28.9 at <path> (python package)" or why not
  // The CUDA backend can run: driver, GPU and kernels present (NCCL is needed only by the baseline
  // collectives and NCCL windows).
  bool usable() const { return driver_ok && kernels_ok; }
};

// Probes the driver (cuInit), the embedded kernels and NCCL. Loads libraries; never throws.
CudaDoctor cuda_doctor();

}  // namespace rankflow::cuda
