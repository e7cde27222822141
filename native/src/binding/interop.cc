// ContextWrap's interop methods (context.hpp): the rank's CUDA stream and context as BigInt
// addresses, a wait of the rank's stream for a CUevent recorded elsewhere, and the check that an
// address range is device memory of the rank's GPU (rank.wrapDevice). The backend answers; the host
// backend refuses each with EINVAL.
#include "context.hpp"
#include "marshal.hpp"

namespace rankflow::binding {

namespace {
// A 64-bit address given as a BigInt: non-negative and lossless, else EINVAL naming it.
uint64_t handle_arg(const Napi::Value& v, const char* name) {
  if (!v.IsBigInt()) throw_einval(v.Env(), std::string(name) + " must be a BigInt (an address)");
  bool lossless = true;
  const uint64_t a = v.As<Napi::BigInt>().Uint64Value(&lossless);
  if (!lossless) throw_einval(v.Env(), std::string(name) + " must be a BigInt in [0, 2^64)");
  return a;
}
}  // namespace

Napi::Value ContextWrap::CudaStream(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  return Napi::BigInt::New(env, guarded(env, [&] { return c.device("cudaStream").stream_handle(); }));
}

Napi::Value ContextWrap::CudaContext(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  return Napi::BigInt::New(env, guarded(env, [&] { return c.device("cudaContext").context_handle(); }));
}

// (event: bigint)
Napi::Value ContextWrap::EventWait(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const uint64_t e = handle_arg(info[0], "event");
  guarded(env, [&] { c.device("waitEvent").wait_event(e); });
  return env.Undefined();
}

// (ptr: bigint, bytes: number)
Napi::Value ContextWrap::DeviceCheck(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const uint64_t p = handle_arg(info[0], "ptr");
  const int64_t bytes = int_arg(info[1], "bytes", 0, int64_t(1) << 50);
  guarded(env, [&] { c.device("wrapDevice").check_device_memory(p, bytes); });
  return env.Undefined();
}

// In the method table (ContextWrap::Define).
void ContextWrap::interop_methods(Methods& m) {
  m.push_back(InstanceMethod<&ContextWrap::CudaStream>("cudaStream"));
  m.push_back(InstanceMethod<&ContextWrap::CudaContext>("cudaContext"));
  m.push_back(InstanceMethod<&ContextWrap::EventWait>("eventWait"));
  m.push_back(InstanceMethod<&ContextWrap::DeviceCheck>("deviceCheck"));
}

}  // namespace rankflow::binding
