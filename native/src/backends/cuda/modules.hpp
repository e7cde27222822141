// The one kernel-module loader: every embedded image (kernels/kernels.cmake) loaded into the rank's
// context through cuModuleLoadData, and the entry points the launchers call. One instance per rank,
// made on the rank's thread with its context current (modules belong to a context).
#pragma once

#include <cuda.h>

#include <vector>

namespace rankflow::cuda {

struct KernelSet {
  CUfunction barrier = nullptr, all_gather = nullptr, notify = nullptr, dispatch_data = nullptr, dispatch_fused = nullptr,
             dispatch_local = nullptr,
             combine = nullptr, combine_local = nullptr,
             signal = nullptr, put = nullptr, reduce = nullptr, peer_reduce = nullptr, fetch = nullptr, epoch_advance = nullptr, busy = nullptr,
             tl_copy = nullptr, tl_fold = nullptr, tl_finish = nullptr;  // two_level.cu
};

class Modules {
 public:
  // Loads every kernel image. Throws BACKEND_UNAVAILABLE when the build had no nvcc.
  Modules();
  ~Modules();
  Modules(const Modules&) = delete;
  Modules& operator=(const Modules&) = delete;
  const KernelSet& kernels() const { return k_; }

 private:
  CUmodule load(const char* image);
  CUfunction entry(CUmodule m, const char* image, const char* name);
  std::vector<CUmodule> modules_;
  KernelSet k_;
};

}  // namespace rankflow::cuda
