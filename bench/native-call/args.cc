// What a native call's arguments cost through Node-API: a dispatch's 4 tensors (BigInt device
// addresses or undefined) and its 6 numbers, read three ways (node args.mjs runs them side by side):
//   wrapped  10 JS arguments through node-addon-api's checks (IsUndefined, IsNull, IsBigInt, Uint64Value;
//            IsNumber, DoubleValue): what native/src/binding/marshal.hpp did before 2026-12-01
//   direct   10 JS arguments, one Node-API call per check (napi_typeof, napi_get_value_*): marshal.hpp now
//   scratch  4 JS arguments, the numbers from a Float64Array over the scratch JS wrote them into: how
//            dispatch and combine take their numbers now (binding/context.hpp kScratchArgs)
// Above 6 arguments Napi::CallbackInfo allocates their array on every call. Standalone; from the
// repository root (after npm install):
//   g++ -O2 -std=c++20 -shared -fPIC -DNAPI_VERSION=8 -DNAPI_CPP_EXCEPTIONS \
//     -I"$(node -p "require('node-api-headers').include_dir")" -I"$(node -p "require('node-addon-api').include_dir")" \
//     bench/native-call/args.cc -o bench/native-call/args.node
//   node bench/native-call/args.mjs
#include <napi.h>

#include <cmath>
#include <cstdint>

namespace {

double* g_scratch = nullptr;

[[noreturn]] void refuse(Napi::Env env, const char* what) { throw Napi::Error::New(env, what); }

uint64_t tensor_wrapped(const Napi::Value& v) {
  if (v.IsUndefined() || v.IsNull()) return 0;
  if (v.IsBigInt()) {
    bool lossless = true;
    const uint64_t p = v.As<Napi::BigInt>().Uint64Value(&lossless);
    if (!lossless) refuse(v.Env(), "not an address");
    return p;
  }
  refuse(v.Env(), "not a tensor");
}

double number_wrapped(const Napi::Value& v) {
  if (!v.IsNumber()) refuse(v.Env(), "not a number");
  return v.As<Napi::Number>().DoubleValue();
}

uint64_t tensor_direct(const Napi::Value& v) {
  napi_valuetype t = napi_undefined;
  if (napi_typeof(v.Env(), v, &t) != napi_ok) refuse(v.Env(), "no type");
  if (t == napi_undefined || t == napi_null) return 0;
  if (t != napi_bigint) refuse(v.Env(), "not a tensor");
  bool lossless = true;
  uint64_t p = 0;
  if (napi_get_value_bigint_uint64(v.Env(), v, &p, &lossless) != napi_ok || !lossless) refuse(v.Env(), "not an address");
  return p;
}

double number_direct(const Napi::Value& v) {
  double d = 0;
  if (napi_get_value_double(v.Env(), v, &d) != napi_ok) refuse(v.Env(), "not a number");
  return d;
}

// Every number is checked as the binding checks it (an integer in range).
int64_t integer(Napi::Env env, double d) {
  if (!std::isfinite(d) || d != std::floor(d) || d < 0 || d > double(1 << 30)) refuse(env, "not an integer in range");
  return int64_t(d);
}

template <int Way>
Napi::Value call(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint64_t acc = 0;
  for (size_t i = 0; i < 4; ++i) acc += Way == 0 ? tensor_wrapped(info[i]) : tensor_direct(info[i]);
  for (size_t i = 0; i < 6; ++i) {
    const double d = Way == 0 ? number_wrapped(info[4 + i]) : Way == 1 ? number_direct(info[4 + i]) : g_scratch[i];
    acc += uint64_t(integer(env, d));
  }
  return Napi::Number::New(env, double(acc & 0xffff));
}

Napi::Value set_scratch(const Napi::CallbackInfo& info) {
  g_scratch = static_cast<double*>(info[0].As<Napi::ArrayBuffer>().Data());
  return info.Env().Undefined();
}

Napi::Object init(Napi::Env env, Napi::Object exports) {
  exports.Set("wrapped", Napi::Function::New(env, call<0>));
  exports.Set("direct", Napi::Function::New(env, call<1>));
  exports.Set("scratch", Napi::Function::New(env, call<2>));
  exports.Set("setScratch", Napi::Function::New(env, set_scratch));
  return exports;
}

}  // namespace

NODE_API_MODULE(args, init)
