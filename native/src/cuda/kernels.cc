// Kernels: embedded fatbins -> CUmodule -> CUfunction.
#include "kernels.hpp"

#include <cstring>
#include <string>

#include "driver.hpp"
#include "kernel_images.hpp"

namespace rankflow::cuda {

const KernelImage* find_kernel_image(const char* name) {
  std::size_t count = 0;
  const KernelImage* images = kernel_images(&count);
  for (std::size_t i = 0; i < count; ++i)
    if (std::strcmp(images[i].name, name) == 0) return &images[i];
  return nullptr;
}

Kernels::Kernels() {
  try {
    barrier_ = function("barrier", "rf_barrier");
    all_gather_ = function("all_gather", "rf_all_gather");
  } catch (...) {
    for (CUmodule m : modules_) driver().cuModuleUnload(m);
    throw;
  }
}

Kernels::~Kernels() {
  // Unload errors (a context poisoned by a trap) cannot be acted on here.
  for (CUmodule m : modules_) driver().cuModuleUnload(m);
}

CUfunction Kernels::function(const char* image, const char* entry) {
  const KernelImage* k = find_kernel_image(image);
  if (k == nullptr)
    throw CudaError("BACKEND_UNAVAILABLE", "",
                    std::string("the CUDA kernel '") + image + "' is not in this build: kernels " +
                        kernel_build_note() + ".");
  CUmodule module = nullptr;
  RF_CU_FOR(std::string("load kernel image ") + image + " (" + kernel_build_note() + ")",
            cuModuleLoadData, &module, k->data);
  modules_.push_back(module);
  CUfunction f = nullptr;
  RF_CU_FOR(std::string("find ") + entry + " in " + image, cuModuleGetFunction, &f, module, entry);
  return f;
}

}  // namespace rankflow::cuda
