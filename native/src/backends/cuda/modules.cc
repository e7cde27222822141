// Modules: embedded fatbins -> CUmodule -> CUfunction, for every kernel of kernels/.
#include "modules.hpp"

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

Modules::Modules() {
  try {
    k_.barrier = entry(load("barrier"), "barrier", "rf_barrier");
    k_.all_gather = entry(load("all_gather"), "all_gather", "rf_all_gather");
    k_.notify = entry(load("notify"), "notify", "rf_dispatch_notify");
    const CUmodule dispatch = load("dispatch");
    k_.dispatch_data = entry(dispatch, "dispatch", "rf_dispatch_data");
    k_.dispatch_fused = entry(dispatch, "dispatch", "rf_dispatch_fused");
    k_.dispatch_local = entry(dispatch, "dispatch", "rf_dispatch_local");
    const CUmodule combine = load("combine");
    k_.combine = entry(combine, "combine", "rf_combine");
    k_.combine_local = entry(load("combine_local"), "combine_local", "rf_combine_local");
    const CUmodule session = load("session");
    k_.signal = entry(session, "session", "rf_signal");
    k_.put = entry(session, "session", "rf_put");
    k_.reduce = entry(session, "session", "rf_reduce");
    k_.peer_reduce = entry(session, "session", "rf_peer_reduce");
    k_.fetch = entry(load("engram"), "engram", "rf_engram_fetch");
    k_.epoch_advance = entry(load("graph"), "graph", "rf_epoch_advance");
    k_.busy = entry(load("busy"), "busy", "rf_busy");
    const CUmodule two = load("two_level");
    k_.tl_copy = entry(two, "two_level", "rf_tl_copy");
    k_.tl_fold = entry(two, "two_level", "rf_tl_fold");
    k_.tl_finish = entry(two, "two_level", "rf_tl_finish");
  } catch (...) {
    for (CUmodule m : modules_) driver().cuModuleUnload(m);
    throw;
  }
}

Modules::~Modules() {
  // Unload errors (a context that faulted) cannot be acted on here.
  for (CUmodule m : modules_) driver().cuModuleUnload(m);
}

CUmodule Modules::load(const char* image) {
  const KernelImage* k = find_kernel_image(image);
  if (k == nullptr)
    throw CudaError("BACKEND_UNAVAILABLE", "",
                    std::string("the CUDA kernel '") + image + "' is not in this build: kernels " + kernel_build_note() + ".");
  CUmodule module = nullptr;
  RF_CU_FOR(std::string("load kernel image ") + image + " (" + kernel_build_note() + ")", cuModuleLoadData, &module, k->data);
  modules_.push_back(module);
  return module;
}

CUfunction Modules::entry(CUmodule m, const char* image, const char* name) {
  CUfunction f = nullptr;
  RF_CU_FOR(std::string("find ") + name + " in " + image, cuModuleGetFunction, &f, m, name);
  return f;
}

}  // namespace rankflow::cuda
