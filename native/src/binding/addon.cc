// The addon's entry: it only registers what the other binding files define (node-llama-cpp's
// addon.cpp): the rank Context, the layout and size functions, fd passing between processes, and
// the CUDA probe where the CUDA backend is linked in, and the scale-out leg's HMAC (for tests).
#include <napi.h>

#include "context.hpp"
#include "layout.hpp"

void RegisterFdPass(Napi::Env env, Napi::Object exports);
void RegisterScaleout(Napi::Env env, Napi::Object exports);
// Present when the build found cuda.h (binding/cuda_probe.cc); it also installs the cuda backend.
void RegisterCuda(Napi::Env env, Napi::Object exports) __attribute__((weak));

static Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("Context", rankflow::binding::ContextWrap::Define(env));
  rankflow::binding::RegisterLayout(env, exports);
  RegisterFdPass(env, exports);
  RegisterScaleout(env, exports);
  if (RegisterCuda) RegisterCuda(env, exports);
  return exports;
}

NODE_API_MODULE(rankflow, Init)
