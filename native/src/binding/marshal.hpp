// JS values <-> the runtime's values, for the binding only: numbers checked as integers, typed arrays
// as host Refs, BigInts as device Refs, and the runtime's Error as a JS error carrying rankflow's
// code, rank and phase (actors/core/errors.ts turns it into a RankflowError).
#pragma once

#include <napi.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "runtime/backend.hpp"
#include "runtime/errors.hpp"

namespace rankflow::binding {

inline Napi::Value big(Napi::Env env, uint64_t v) { return Napi::BigInt::New(env, v); }

inline Napi::Error js_error(Napi::Env env, const std::string& code, const std::string& message, int rank = -1,
                            const std::string& phase = {}) {
  Napi::Error e = Napi::Error::New(env, message);
  e.Set("code", Napi::String::New(env, code));
  if (rank >= 0) e.Set("rank", Napi::Number::New(env, rank));
  if (!phase.empty()) e.Set("phase", Napi::String::New(env, phase));
  return e;
}
inline Napi::Error js_error(Napi::Env env, const Error& e) { return js_error(env, e.code, e.what(), e.rank, e.phase); }

[[noreturn]] inline void throw_einval(Napi::Env env, const std::string& message) { throw js_error(env, "EINVAL", message); }

// Runs f and turns the runtime's errors into JS errors (anything else: EINVAL with its message).
template <typename F>
auto guarded(Napi::Env env, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    throw js_error(env, e);
  } catch (const Napi::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw js_error(env, "EINVAL", e.what());
  }
}

// A number that must be an integer in [lo, hi]; `name` is in the message.
inline int64_t int_of(Napi::Env env, double d, const char* name, int64_t lo = INT64_MIN / 2, int64_t hi = INT64_MAX / 2) {
  if (!std::isfinite(d) || d != std::floor(d) || d < double(lo) || d > double(hi))
    throw_einval(env, std::string(name) + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                          "] (got " + Napi::Number::New(env, d).ToString().Utf8Value() + ")");
  return int64_t(d);
}

// An integer argument: a finite number with no fraction, in [lo, hi]; `name` is in the message.
// One Node-API call on the way that succeeds (napi_get_value_double refuses what is not a number).
inline int64_t int_arg(const Napi::Value& v, const char* name, int64_t lo = INT64_MIN / 2, int64_t hi = INT64_MAX / 2) {
  double d = 0;
  if (napi_get_value_double(v.Env(), v, &d) != napi_ok) throw_einval(v.Env(), std::string(name) + " must be a number");
  return int_of(v.Env(), d, name, lo, hi);
}

// A property of a config object: an integer, or `fallback` when absent.
inline int64_t int_prop(const Napi::Object& o, const char* key, int64_t fallback, int64_t lo = INT64_MIN / 2,
                        int64_t hi = INT64_MAX / 2) {
  const Napi::Value v = o.Get(key);
  if (v.IsUndefined() || v.IsNull()) return fallback;
  return int_arg(v, key, lo, hi);
}
inline double num_prop(const Napi::Object& o, const char* key, double fallback) {
  const Napi::Value v = o.Get(key);
  return v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : fallback;
}
inline bool bool_prop(const Napi::Object& o, const char* key, bool fallback) {
  const Napi::Value v = o.Get(key);
  return v.IsBoolean() ? v.As<Napi::Boolean>().Value() : fallback;
}
inline std::string str_prop(const Napi::Object& o, const char* key) {
  const Napi::Value v = o.Get(key);
  return v.IsString() ? v.As<Napi::String>().Utf8Value() : std::string();
}

// A typed array's bytes (V8 may back an empty array with no memory: it is still given, never absent).
// napi_get_typedarray_info's own data pointer, not the ArrayBuffer's: it also works for views of a
// SharedArrayBuffer (the abort words), which napi_get_arraybuffer_info refuses.
inline uint8_t* bytes_of(const Napi::TypedArray& ta) {
  alignas(16) static uint8_t empty[16];
  if (ta.ByteLength() == 0) return empty;
  void* data = nullptr;
  const napi_status s = napi_get_typedarray_info(ta.Env(), ta, nullptr, nullptr, &data, nullptr, nullptr);
  if (s != napi_ok || data == nullptr) throw Napi::Error::New(ta.Env(), "cannot read a typed array's memory");
  return static_cast<uint8_t*>(data);
}

// A tensor argument: a typed array (host memory, length checked when expect_bytes >= 0), a BigInt
// (a device address; 0n = absent), or undefined / null (absent). A device address takes two Node-API
// calls (its type, its value).
inline Mem ref_arg(const Napi::Value& v, const char* name, int64_t expect_bytes = -1) {
  napi_valuetype type = napi_undefined;
  if (napi_typeof(v.Env(), v, &type) != napi_ok) throw_einval(v.Env(), std::string(name) + ": cannot read its type");
  if (type == napi_undefined || type == napi_null) return Mem{};
  if (type == napi_bigint) {
    bool lossless = true;
    uint64_t p = 0;
    if (napi_get_value_bigint_uint64(v.Env(), v, &p, &lossless) != napi_ok || !lossless)
      throw_einval(v.Env(), std::string(name) + " is not a device address");
    return Mem{reinterpret_cast<void*>(uintptr_t(p)), true};
  }
  if (!v.IsTypedArray()) throw_einval(v.Env(), std::string(name) + " must be a typed array or a device tensor's address");
  const auto ta = v.As<Napi::TypedArray>();
  if (expect_bytes >= 0 && int64_t(ta.ByteLength()) != expect_bytes)
    throw_einval(v.Env(), std::string(name) + " has " + std::to_string(ta.ByteLength()) + " bytes, expected " +
                              std::to_string(expect_bytes));
  return Mem{bytes_of(ta), false};
}

inline uint64_t address_arg(const Napi::Value& v, const char* name) {
  if (!v.IsBigInt()) throw_einval(v.Env(), std::string(name) + " must be a device address (BigInt)");
  bool lossless = true;
  return v.As<Napi::BigInt>().Uint64Value(&lossless);
}

inline uint64_t address_of(const void* p) { return uint64_t(reinterpret_cast<uintptr_t>(p)); }

}  // namespace rankflow::binding
