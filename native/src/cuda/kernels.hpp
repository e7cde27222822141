// The kernels loaded into one context: each embedded image through cuModuleLoadData, and the entry
// points the launchers call. One instance per rank, created on the rank's thread with its context
// current (modules belong to a context).
#pragma once

#include <cuda.h>

#include <vector>

namespace rankflow::cuda {

class Kernels {
 public:
  // Loads every kernel image. Throws BACKEND_UNAVAILABLE when the build had no nvcc.
  Kernels();
  ~Kernels();
  Kernels(const Kernels&) = delete;
  Kernels& operator=(const Kernels&) = delete;

  CUfunction barrier() const { return barrier_; }
  CUfunction all_gather() const { return all_gather_; }
  // Another entry point of an embedded image, loaded into this context (kept until destruction).
  CUfunction entry(const char* image, const char* name) { return function(image, name); }

 private:
  CUfunction function(const char* image, const char* entry);
  std::vector<CUmodule> modules_;
  CUfunction barrier_ = nullptr, all_gather_ = nullptr;
};

}  // namespace rankflow::cuda
