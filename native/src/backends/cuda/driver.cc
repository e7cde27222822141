// Loading libcuda.so.1 with dlopen and filling the function table; error naming for driver calls.
#include "driver.hpp"

#include <dlfcn.h>
#include <cstdlib>
#include <link.h>

#include <mutex>

namespace rankflow::cuda {
namespace {

// Stringify after macro expansion: RF_SYMBOL(cuMemAlloc) is "cuMemAlloc_v2", the ABI cuda.h declares.
#define RF_SYMBOL_STR(x) #x
#define RF_SYMBOL(x) RF_SYMBOL_STR(x)

// Where libcuda.so.1 lives: the loader's search path first (LD_LIBRARY_PATH, ldconfig), then the
// places container runtimes mount the driver without registering it with ldconfig.
constexpr const char* kLibcudaCandidates[] = {
    "libcuda.so.1",
    "/usr/local/nvidia/lib64/libcuda.so.1",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/usr/lib64/libcuda.so.1",
    "/usr/lib/wsl/lib/libcuda.so.1",
};

struct Loaded {
  Driver table;
  std::string error;  // empty on success
};

std::string loaded_path(void* handle, const char* fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0')
    return map->l_name;
  return fallback;
}

void load(Loaded& out) {
  Driver& d = out.table;
  void* handle = nullptr;
  std::string tried;
  for (const char* candidate : kLibcudaCandidates) {
    handle = dlopen(candidate, RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      d.library = loaded_path(handle, candidate);
      break;
    }
    const char* e = dlerror();
    tried += std::string("\n  ") + candidate + ": " + (e != nullptr ? e : "not found");
  }
  if (handle == nullptr) {
    out.error =
        "the CUDA driver library libcuda.so.1 was not found (tried:" + tried +
        "). Install the NVIDIA driver, or add the directory holding libcuda.so.1 to LD_LIBRARY_PATH; "
        "use backend 'host' on machines without a GPU.";
    return;
  }
  // The handle is never closed: kernels, contexts and mappings outlive any one caller.
#define RF_CUDA_DRIVER_LOOKUP(fn)                                                            \
  d.fn = reinterpret_cast<decltype(d.fn)>(dlsym(handle, RF_SYMBOL(fn)));                     \
  if (d.fn == nullptr) {                                                                     \
    out.error = std::string("the CUDA driver at ") + d.library + " lacks " RF_SYMBOL(fn)     \
                ": it is older than CUDA 13.0, which rankflow's CUDA backend is built for. " \
                "Update the NVIDIA driver (R580 or newer), or use backend 'host'.";         \
    return;                                                                                  \
  }
  RF_CUDA_DRIVER_CALLS(RF_CUDA_DRIVER_LOOKUP)
#undef RF_CUDA_DRIVER_LOOKUP

  // Work queues from the host to the GPU (default 8): streams beyond that share a queue, in order. A
  // rank's kernel that waits for a peer must never sit in front of that peer's work in one queue (ranks
  // sharing a GPU), so ask for the most, unless the application chose (read when a context is made).
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  const CUresult init = d.cuInit(0);
  if (init != CUDA_SUCCESS) {
    const char* name = nullptr;
    d.cuGetErrorName(init, &name);
    out.error = std::string("cuInit failed with ") + (name != nullptr ? name : "an unknown error") +
                " (driver " + d.library + "): " +
                (init == CUDA_ERROR_NO_DEVICE
                     ? "no CUDA-capable GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)."
                     : "the driver could not start (check nvidia-smi and the kernel module).") +
                " Use backend 'host' on machines without a GPU.";
    return;
  }
  d.cuDriverGetVersion(&d.version);
  d.cuDeviceGetCount(&d.device_count);
  if (d.device_count <= 0) {
    out.error = "the CUDA driver started but reports no GPU (check CUDA_VISIBLE_DEVICES); "
                "use backend 'host' on machines without a GPU.";
  }
}

const Loaded& loaded() {
  static Loaded state;
  static std::once_flag once;
  std::call_once(once, [] { load(state); });
  return state;
}

// What to do about the failures a caller can act on; empty for the rest.
const char* hint(CUresult r) {
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return " Free GPU memory (other processes: nvidia-smi) or ask for a smaller buffer.";
    case CUDA_ERROR_NOT_SUPPORTED:
      return " This GPU or driver lacks the feature (VMM, POSIX-FD export or HOST_NUMA memory).";
    case CUDA_ERROR_INVALID_CONTEXT:
      return " No CUDA context is current on this thread: make the rank's device current first.";
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_LAUNCH_FAILED:
      return " A kernel trapped: a device-side wait timed out (read the rank's Diagnostic) or faulted."
             " The context is unusable now; destroy the group.";
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      return " A kernel touched unmapped memory: a peer's window was not imported or was destroyed."
             " The context is unusable now; destroy the group.";
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_INVALID_IMAGE:
      return " The embedded kernels were not built for this GPU: rebuild with nvcc for its arch.";
    default:
      return "";
  }
}

}  // namespace

const Driver& driver() {
  const Loaded& l = loaded();
  if (!l.error.empty()) throw CudaError("BACKEND_UNAVAILABLE", "", l.error);
  return l.table;
}

bool driver_available(std::string* why) {
  const Loaded& l = loaded();
  if (why != nullptr) *why = l.error;
  return l.error.empty();
}

std::string error_name(CUresult r) {
  const Loaded& l = loaded();
  const char* name = nullptr;
  if (l.table.cuGetErrorName != nullptr) l.table.cuGetErrorName(r, &name);
  return name != nullptr ? name : "CUDA_ERROR_" + std::to_string(int(r));
}

void check(CUresult r, const char* call) { check(r, call, std::string()); }

void check(CUresult r, const char* call, const std::string& purpose) {
  if (r == CUDA_SUCCESS) return;
  const Loaded& l = loaded();
  const char* text = nullptr;
  if (l.table.cuGetErrorString != nullptr) l.table.cuGetErrorString(r, &text);
  const std::string name = error_name(r);
  throw CudaError(name, call,
                  std::string(call) + (purpose.empty() ? "" : " (" + purpose + ")") + " failed: " + name + " (" +
                      (text != nullptr ? text : "no description") + ")." + hint(r));
}

}  // namespace rankflow::cuda
