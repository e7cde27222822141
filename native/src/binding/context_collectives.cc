// ContextWrap: the collectives (barrier, allGather, allReduce), AGRS sessions, engram and pipeline exchange.
#include "context.hpp"

#include "marshal.hpp"

namespace rankflow::binding {

// ---- collectives ----

Napi::Value ContextWrap::Barrier(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const bool cpu = info[0].ToBoolean().Value();
  guarded(env, [&] { ops::barrier(c, cpu); });
  return env.Undefined();
}

// (in, bytes, out): typed arrays (host) or device addresses
Napi::Value ContextWrap::AllGather(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t bytes = int_arg(info[1], "bytes", 0, c.sym_bytes);
  const Mem in = ref_arg(info[0], "input", info[0].IsBigInt() ? -1 : bytes);
  const Mem out = ref_arg(info[2], "output", info[2].IsBigInt() ? -1 : bytes * c.world());
  guarded(env, [&] { ops::all_gather(c, in, bytes, out); });
  return env.Undefined();
}

// (in, n, bf16, out): n fp32 or bf16 elements; typed arrays (host) or device addresses; in == out: in place
Napi::Value ContextWrap::AllReduce(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t n = int_arg(info[1], "n", 0, c.sym_bytes);
  const bool bf16 = info[2].ToBoolean().Value();
  const int64_t bytes = n * (bf16 ? 2 : 4);
  const Mem in = ref_arg(info[0], "input", info[0].IsBigInt() ? -1 : bytes);
  const Mem out = ref_arg(info[3], "output", info[3].IsBigInt() ? -1 : bytes);
  guarded(env, [&] { ops::all_reduce(c, in, out, n, bf16); });
  return env.Undefined();
}

Napi::Value ContextWrap::SessionOpen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t max_bytes = int_arg(info[0], "maxBytes", 1, int64_t(1) << 50);
  const int64_t max_ag = int_arg(info[1], "maxAllGathers", 1, 1 << 16);
  guarded(env, [&] { ops::session_open(c, max_bytes, max_ag); });
  return env.Undefined();
}

Napi::Value ContextWrap::SessionClose(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  guarded(env, [&] { ops::session_close(c); });
  detach_views(env);  // the next session reuses the buffer: its views must not show that
  return env.Undefined();
}

// (in, bytes, out)
Napi::Value ContextWrap::SessionAllGather(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t bytes = int_arg(info[1], "bytes", 0, c.sym_bytes);
  const Mem in = ref_arg(info[0], "input", info[0].IsBigInt() ? -1 : bytes);
  const Mem out = ref_arg(info[2], "output", info[2].IsBigInt() ? -1 : bytes * c.world());
  guarded(env, [&] { ops::session_all_gather(c, in, bytes, out); });
  return env.Undefined();
}

// (in of W * n elements, n, bf16, out of n elements)
Napi::Value ContextWrap::SessionReduceScatter(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t n = int_arg(info[1], "n", 0, c.sym_bytes);
  const bool bf16 = info[2].ToBoolean().Value();
  const int64_t esz = bf16 ? 2 : 4;
  const Mem in = ref_arg(info[0], "input", info[0].IsBigInt() ? -1 : n * c.world() * esz);
  const Mem out = ref_arg(info[3], "output", info[3].IsBigInt() ? -1 : n * esz);
  guarded(env, [&] { ops::session_reduce_scatter(c, in, n, bf16, out); });
  return env.Undefined();
}

// (table, entries, rowBytes)
Napi::Value ContextWrap::EngramWrite(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t entries = int_arg(info[1], "entries", 0, INT32_MAX);
  const int64_t row_bytes = int_arg(info[2], "rowBytes", 1, int64_t(1) << 30);
  const Mem table = ref_arg(info[0], "storage", info[0].IsBigInt() ? -1 : entries * row_bytes);
  guarded(env, [&] { ops::engram_write(c, table, entries, row_bytes); });
  return env.Undefined();
}

// (ids: Int32Array, out: typed array of ids.length rows)
Napi::Value ContextWrap::EngramFetch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  if (!info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
    throw_einval(env, "indices must be an Int32Array");
  const auto ids = info[0].As<Napi::Int32Array>();
  const int64_t n = int64_t(ids.ElementLength());
  const Mem out = ref_arg(info[1], "output", info[1].IsBigInt() ? -1 : n * std::max<int64_t>(c.engram_row_bytes, 0));
  guarded(env, [&] { ops::engram_fetch(c, reinterpret_cast<const int32_t*>(bytes_of(ids)), n, out); });
  return env.Undefined();
}

// (in, bytes, out)
Napi::Value ContextWrap::PpExchange(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t bytes = int_arg(info[1], "bytes", 0, c.sym_bytes);
  const Mem in = ref_arg(info[0], "input", info[0].IsBigInt() ? -1 : bytes);
  const Mem out = ref_arg(info[2], "output", info[2].IsBigInt() ? -1 : bytes);
  guarded(env, [&] { ops::pp_exchange(c, in, bytes, out); });
  return env.Undefined();
}

// In the method table (ContextWrap::Define).
void ContextWrap::collective_methods(Methods& m) {
  m.push_back(InstanceMethod<&ContextWrap::Barrier>("barrier"));
  m.push_back(InstanceMethod<&ContextWrap::AllGather>("allGather"));
  m.push_back(InstanceMethod<&ContextWrap::AllReduce>("allReduce"));
  m.push_back(InstanceMethod<&ContextWrap::SessionOpen>("sessionOpen"));
  m.push_back(InstanceMethod<&ContextWrap::SessionClose>("sessionClose"));
  m.push_back(InstanceMethod<&ContextWrap::SessionAllGather>("sessionAllGather"));
  m.push_back(InstanceMethod<&ContextWrap::SessionReduceScatter>("sessionReduceScatter"));
  m.push_back(InstanceMethod<&ContextWrap::EngramWrite>("engramWrite"));
  m.push_back(InstanceMethod<&ContextWrap::EngramFetch>("engramFetch"));
  m.push_back(InstanceMethod<&ContextWrap::PpExchange>("ppExchange"));
}

}  // namespace rankflow::binding
