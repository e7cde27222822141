// The binding of the scale-out leg (runtime/scaleout.hpp): a rank's listener and its connections to
// its rail peers (made while its world forms, actors/world/scaleout.ts), the traffic words that
// group.traffic() reads, and the addon's HMAC-SHA256 (for the tests, against node:crypto).
#include <cstring>

#include "backends/host/hmac.hpp"
#include "context.hpp"
#include "marshal.hpp"

namespace rankflow::binding {

// (host) -> the port this rank's scale-out listener got on host.
Napi::Value ContextWrap::ScaleoutListen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  if (!info[0].IsString()) throw_einval(env, "scaleoutListen needs a host address (a string)");
  const std::string host = info[0].As<Napi::String>().Utf8Value();
  return Napi::Number::New(env, guarded(env, [&] { return c.backend().scaleout_listen(host); }));
}

// (endpoints: Array<{ host, port }> one per global rank, key: Uint8Array(32), timeoutMs)
Napi::Value ContextWrap::ScaleoutConnect(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  if (!info[0].IsArray()) throw_einval(env, "scaleoutConnect needs an array of endpoints, one per rank");
  const auto arr = info[0].As<Napi::Array>();
  std::vector<ScaleoutEndpoint> ends(arr.Length());
  for (uint32_t i = 0; i < arr.Length(); ++i) {
    if (!arr.Get(i).IsObject()) throw_einval(env, "scaleoutConnect: endpoint " + std::to_string(i) + " is not an object");
    const auto o = arr.Get(i).As<Napi::Object>();
    ends[i].host = str_prop(o, "host");
    ends[i].port = int(int_prop(o, "port", 0, 0, 65535));
  }
  if (!info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().ByteLength() != 32)
    throw_einval(env, "scaleoutConnect needs the world's rail key (a Uint8Array of 32 bytes)");
  RailKey key;
  std::memcpy(key.data(), bytes_of(info[1].As<Napi::TypedArray>()), key.size());
  const int64_t timeout_ms = int_arg(info[2], "timeoutMs", 1, int64_t(1) << 40);
  guarded(env, [&] { c.backend().scaleout_connect(ends, key, double(timeout_ms) / 1000.0); });
  return env.Undefined();
}

// (words: BigUint64Array over a SharedArrayBuffer, Traffic::kWords long): where the rank counts its traffic.
Napi::Value ContextWrap::TrafficWords(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  if (!info[0].IsTypedArray()) throw_einval(env, "trafficWords needs a BigUint64Array");
  const auto ta = info[0].As<Napi::TypedArray>();
  if (ta.TypedArrayType() != napi_biguint64_array || ta.ElementLength() < size_t(Traffic::kWords))
    throw_einval(env, "trafficWords needs a BigUint64Array of at least " + std::to_string(Traffic::kWords) + " words");
  traffic_words_ = Napi::Persistent(info[0]);
  c.traffic.attach(reinterpret_cast<uint64_t*>(bytes_of(ta)));
  return env.Undefined();
}

// In the method table (ContextWrap::Define).
void ContextWrap::scaleout_methods(Methods& m) {
  m.push_back(InstanceMethod<&ContextWrap::ScaleoutListen>("scaleoutListen"));
  m.push_back(InstanceMethod<&ContextWrap::ScaleoutConnect>("scaleoutConnect"));
  m.push_back(InstanceMethod<&ContextWrap::TrafficWords>("trafficWords"));
}

}  // namespace rankflow::binding

// addon.hmacSha256(key: Uint8Array, message: Uint8Array) -> Uint8Array(32)
void RegisterScaleout(Napi::Env env, Napi::Object exports) {
  exports.Set("hmacSha256", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    Napi::Env e = info.Env();
    if (!info[0].IsTypedArray() || !info[1].IsTypedArray()) rankflow::binding::throw_einval(e, "hmacSha256(key, message) takes two Uint8Arrays");
    const auto key = info[0].As<Napi::TypedArray>(), msg = info[1].As<Napi::TypedArray>();
    const rankflow::host::Part part{rankflow::binding::bytes_of(msg), msg.ByteLength()};
    const rankflow::host::Digest d = rankflow::host::hmac_sha256(rankflow::binding::bytes_of(key), key.ByteLength(), &part, 1);
    auto out = Napi::Uint8Array::New(e, d.size());
    std::memcpy(out.Data(), d.data(), d.size());
    return out;
  }));
}
