// RegisterCuda: what the CUDA part adds to the addon (binding/addon.cc calls it through a weak
// symbol): the factory that lets a Context be made with backend 'cuda', and `cudaProbe(options)` for
// `rankflow doctor` and backend selection. The probe creates and retains no context: the driver is
// loaded and initialised (cuInit), GPUs are queried by attribute, NCCL is dlopen'ed.
#include <napi.h>

#include <cstdio>
#include <string>

#include "backends/cuda/driver.hpp"
#include "backends/cuda/kernel_images.hpp"
#include "backends/cuda/nccl.hpp"
#include "backends/cuda/scaleout.hpp"
#include "marshal.hpp"
#include "runtime/backend.hpp"

namespace rankflow {
std::unique_ptr<Backend> make_cuda_backend(Context& c);
}

namespace rankflow::binding {
namespace {

// NCCL's search paths as actors/core/config.ts read them ({ ncclHome, pythonPrefixes }).
void configure_nccl(const Napi::Value& v) {
  cuda::NcclSearch s;
  if (v.IsObject()) {
    const Napi::Object o = v.As<Napi::Object>();
    s.home = str_prop(o, "ncclHome");
    const Napi::Value prefixes = o.Get("pythonPrefixes");
    if (prefixes.IsArray()) {
      const auto a = prefixes.As<Napi::Array>();
      for (uint32_t i = 0; i < a.Length(); ++i)
        if (a.Get(i).IsString()) s.python_prefixes.push_back(a.Get(i).As<Napi::String>().Utf8Value());
    }
  }
  cuda::set_nccl_search(s);
}

std::string uuid_text(const CUuuid& u) {
  char out[48];
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  snprintf(out, sizeof out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
           b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return out;
}

Napi::Value CudaProbe(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  configure_nccl(info[0]);
  Napi::Object o = Napi::Object::New(env);
  std::string reason;
  try {
    std::size_t images = 0;
    cuda::kernel_images(&images);
    Napi::Object k = Napi::Object::New(env);
    k.Set("images", Napi::Number::New(env, double(images)));
    k.Set("note", cuda::kernel_build_note());
    o.Set("kernels", k);
    if (images == 0) reason = std::string("the CUDA kernels are ") + cuda::kernel_build_note();

    std::string why;
    Napi::Object n = Napi::Object::New(env);
    if (cuda::nccl_available(&why)) {
      const cuda::Nccl& nc = cuda::nccl();
      n.Set("path", nc.library);
      n.Set("version", cuda::nccl_version_string(nc.version));
      n.Set("origin", nc.origin);
      n.Set("commShrink", nc.comm_shrink);  // elastic communicators (issue 35): exported or not
      n.Set("commGrow", nc.comm_grow);
      // The cuda scale-out leg's calls (backends/cuda/scaleout.hpp): grouped ncclSend / ncclRecv.
      try {
        cuda::nccl_p2p();
        n.Set("p2p", true);
      } catch (const std::exception& e) {
        n.Set("p2p", false);
        n.Set("p2pReason", e.what());
      }
    } else {
      n.Set("reason", why);
    }
    o.Set("nccl", n);

    if (!cuda::driver_available(&why)) {
      o.Set("devices", 0);
      if (reason.empty()) reason = why;
    } else {
      const cuda::Driver& d = cuda::driver();
      o.Set("devices", d.device_count);
      o.Set("driver", d.library);
      o.Set("driverVersion", std::to_string(d.version / 1000) + "." + std::to_string(d.version % 1000 / 10));
      Napi::Array gpus = Napi::Array::New(env, size_t(d.device_count));
      for (int i = 0; i < d.device_count; ++i) {
        CUdevice dev = 0;
        RF_CU(cuDeviceGet, &dev, i);
        char name[256] = {};
        RF_CU(cuDeviceGetName, name, int(sizeof(name)), dev);
        auto attr = [&](CUdevice_attribute a) {
          int v = 0;
          RF_CU(cuDeviceGetAttribute, &v, a, dev);
          return v;
        };
        CUuuid uuid = {};
        RF_CU(cuDeviceGetUuid, &uuid, dev);
        const int major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
        const int minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
        const bool vmm = attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) != 0 &&
                         attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) != 0;
        Napi::Object g = Napi::Object::New(env);
        g.Set("ordinal", i);
        g.Set("name", std::string(name));
        g.Set("uuid", uuid_text(uuid));
        g.Set("arch", "sm_" + std::to_string(major * 10 + minor));
        g.Set("sms", attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT));
        g.Set("numaNode", attr(CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID));
        g.Set("cooperativeLaunch", attr(CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH) != 0);
        g.Set("vmmPosixFd", vmm);
        gpus.Set(uint32_t(i), g);
        if (!vmm && reason.empty())
          reason = "GPU " + std::to_string(i) + " (" + name +
                   ") lacks virtual memory management with POSIX-fd handles, which symmetric memory needs";
      }
      o.Set("gpus", gpus);
    }
  } catch (const std::exception& e) {
    if (reason.empty()) reason = e.what();
  }
  o.Set("available", reason.empty());
  if (!reason.empty()) o.Set("reason", reason);
  return o;
}

}  // namespace
}  // namespace rankflow::binding

void RegisterCuda(Napi::Env env, Napi::Object exports) {
  rankflow::set_cuda_backend_factory(&rankflow::make_cuda_backend);
  exports.Set("cudaProbe", Napi::Function::New(env, rankflow::binding::CudaProbe));
}
