// ContextWrap: cuda device memory, streams, events, graph capture/replay, baselines, slow-wait reports and
// the test hook that occupies SMs.
#include "context.hpp"

#include "marshal.hpp"

namespace rankflow::binding {

// ---- cuda: device memory, streams, events, graphs, baselines ----

Napi::Value ContextWrap::DeviceAlloc(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t bytes = int_arg(info[0], "bytes", 0, int64_t(1) << 50);
  return big(env, guarded(env, [&] { return c.device("a device tensor").device_alloc(bytes); }));
}

Napi::Value ContextWrap::DeviceFree(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!ctx_ || !ctx_->alive()) return env.Undefined();  // destroyed: everything is freed already
  const uint64_t p = address_arg(info[0], "ptr");
  guarded(env, [&] { ctx_->device("free").device_free(p); });
  return env.Undefined();
}

Napi::Value ContextWrap::DeviceUpload(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const uint64_t p = address_arg(info[0], "ptr");
  if (!info[1].IsTypedArray()) throw_einval(env, "data must be a typed array");
  const auto ta = info[1].As<Napi::TypedArray>();
  guarded(env, [&] { c.device("upload").upload(p, bytes_of(ta), int64_t(ta.ByteLength())); });
  return env.Undefined();
}

Napi::Value ContextWrap::DeviceZero(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const uint64_t p = address_arg(info[0], "ptr");
  const int64_t n = int_arg(info[1], "bytes", 0, int64_t(1) << 40);
  guarded(env, [&] { c.device("a device tensor").zero(p, n); });
  return env.Undefined();
}

Napi::Value ContextWrap::DeviceDownload(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const uint64_t p = address_arg(info[0], "ptr");
  const int64_t n = int_arg(info[1], "bytes", 0, int64_t(1) << 40);
  auto out = Napi::Uint8Array::New(env, size_t(n));
  guarded(env, [&] { c.device("toHost").download(out.Data(), p, n); });
  return out;
}

Napi::Value ContextWrap::DeviceSync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  guarded(env, [&] { c.device("sync").sync(); });
  return env.Undefined();
}

Napi::Value ContextWrap::EventRecord(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  return big(env, guarded(env, [&] { return c.device("recordEvent").record_event(); }));
}

Napi::Value ContextWrap::EventElapsed(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const uint64_t a = address_arg(info[0], "start"), b = address_arg(info[1], "end");
  return Napi::Number::New(env, guarded(env, [&] { return c.device("elapsedMs").elapsed_ms(a, b); }));
}

Napi::Value ContextWrap::EventDestroy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!ctx_ || !ctx_->alive()) return env.Undefined();
  const uint64_t e = address_arg(info[0], "event");
  guarded(env, [&] { ctx_->device("destroyEvent").destroy_event(e); });
  return env.Undefined();
}

Napi::Value ContextWrap::SetOpTiming(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const bool on = info.Length() > 0 && info[0].ToBoolean().Value();
  guarded(env, [&] { c.device("timeOps").set_op_timing(on); });
  return env.Undefined();
}

Napi::Value ContextWrap::LastOpMs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  return Napi::Number::New(env, guarded(env, [&] { return c.device("lastOpDeviceMs").last_op_ms(); }));
}

// (bytes per rank, iters, warmup) -> ms per ncclAlltoAll (every rank calls it together)
Napi::Value ContextWrap::BenchAlltoAll(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t bytes = int_arg(info[0], "bytes", 1, int64_t(1) << 40);
  const int iters = int(int_arg(info[1], "iters", 1, 1 << 20)), warmup = int(int_arg(info[2], "warmup", 0, 1 << 20));
  return Napi::Number::New(env, guarded(env, [&] { return c.device("benchAlltoAll").bench_all_to_all(bytes, iters, warmup); }));
}

Napi::Value ContextWrap::BenchPeerCopy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t bytes = int_arg(info[0], "bytes", 1, int64_t(1) << 40);
  const int iters = int(int_arg(info[1], "iters", 1, 1 << 20)), warmup = int(int_arg(info[2], "warmup", 0, 1 << 20));
  return Napi::Number::New(env, guarded(env, [&] { return c.device("benchPeerCopy").bench_peer_copy(bytes, iters, warmup); }));
}

// (op, engine, bytes, iters) -> microseconds per call on device-resident data (bench/gpu-agrs)
Napi::Value ContextWrap::BenchAgrs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  if (!info[0].IsString() || !info[1].IsString()) throw_einval(env, "benchAgrs(op, engine, bytes, iters)");
  const std::string op = info[0].As<Napi::String>().Utf8Value();
  const std::string engine = info[1].As<Napi::String>().Utf8Value();
  const int64_t bytes = int_arg(info[2], "bytes", 0, int64_t(1) << 40);
  const int64_t iters = int_arg(info[3], "iters", 1, 1 << 20);
  return Napi::Number::New(env, guarded(env, [&] { return c.device("benchAgrs").bench_agrs(op, engine, bytes, iters); }));
}

Napi::Value ContextWrap::CaptureBegin(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  guarded(env, [&] { ops::capture_begin(c); });
  return env.Undefined();
}

// -> the graph id (a BigInt); the number of ops it holds in the scratch
Napi::Value ContextWrap::CaptureEnd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  int64_t ops = 0;
  const uint64_t g = guarded(env, [&] { return ops::capture_end(c, &ops); });
  scratch_f64_[kScratchGraphOps] = double(ops);
  return big(env, g);
}

// (graph, ops)
Napi::Value ContextWrap::Replay(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const uint64_t g = address_arg(info[0], "graph");
  const int64_t n = int_arg(info[1], "ops", 0, 1 << 20);
  guarded(env, [&] { ops::replay(c, g, n); });
  return env.Undefined();
}

Napi::Value ContextWrap::GraphFree(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!ctx_ || !ctx_->alive()) return env.Undefined();
  const uint64_t g = address_arg(info[0], "graph");
  guarded(env, [&] { ctx_->device("graph.free").free_graph(g); });
  return env.Undefined();
}

// (fn): called, on this thread, by any wait of this rank that has lasted a millisecond.
Napi::Value ContextWrap::OnSlowWait(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  if (!info[0].IsFunction()) throw_einval(env, "onSlowWait needs a function");
  slow_wait_ = Napi::Persistent(info[0].As<Napi::Function>());
  c.rules.slow = &ContextWrap::slow_wait;
  c.rules.slow_arg = this;
  return env.Undefined();
}

void ContextWrap::slow_wait(void* self) {
  auto* w = static_cast<ContextWrap*>(self);
  if (w->slow_wait_.IsEmpty() || w->cleanup_ran_) return;
  // A report that cannot be posted (the worker is being terminated) must not end the wait.
  napi_value fn = w->slow_wait_.Value();
  napi_value global = nullptr, result = nullptr;
  if (napi_get_global(w->env_, &global) != napi_ok) return;
  if (napi_call_function(w->env_, global, fn, 0, nullptr, &result) != napi_ok) {
    napi_value ignored;
    napi_get_and_clear_last_exception(w->env_, &ignored);
  }
}

// Tests: (sms, ms) occupy SMs of the rank's GPU on a stream of their own.
Napi::Value ContextWrap::Occupy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int sms = int(int_arg(info[0], "sms", 1, 1 << 16));
  const double ms = info[1].ToNumber().DoubleValue();
  guarded(env, [&] { c.device("occupy").occupy(sms, ms); });
  return env.Undefined();
}


// In the method table (ContextWrap::Define).
void ContextWrap::device_methods(Methods& m) {
  m.push_back(InstanceMethod<&ContextWrap::DeviceAlloc>("deviceAlloc"));
  m.push_back(InstanceMethod<&ContextWrap::DeviceFree>("deviceFree"));
  m.push_back(InstanceMethod<&ContextWrap::DeviceUpload>("deviceUpload"));
  m.push_back(InstanceMethod<&ContextWrap::DeviceZero>("deviceZero"));
  m.push_back(InstanceMethod<&ContextWrap::DeviceDownload>("deviceDownload"));
  m.push_back(InstanceMethod<&ContextWrap::DeviceSync>("deviceSync"));
  m.push_back(InstanceMethod<&ContextWrap::EventRecord>("eventRecord"));
  m.push_back(InstanceMethod<&ContextWrap::EventElapsed>("eventElapsed"));
  m.push_back(InstanceMethod<&ContextWrap::EventDestroy>("eventDestroy"));
  m.push_back(InstanceMethod<&ContextWrap::LastOpMs>("lastOpMs"));
  m.push_back(InstanceMethod<&ContextWrap::SetOpTiming>("setOpTiming"));
  m.push_back(InstanceMethod<&ContextWrap::BenchAlltoAll>("benchAlltoAll"));
  m.push_back(InstanceMethod<&ContextWrap::BenchPeerCopy>("benchPeerCopy"));
  m.push_back(InstanceMethod<&ContextWrap::BenchAgrs>("benchAgrs"));
  m.push_back(InstanceMethod<&ContextWrap::CaptureBegin>("captureBegin"));
  m.push_back(InstanceMethod<&ContextWrap::CaptureEnd>("captureEnd"));
  m.push_back(InstanceMethod<&ContextWrap::Replay>("replay"));
  m.push_back(InstanceMethod<&ContextWrap::GraphFree>("graphFree"));
  m.push_back(InstanceMethod<&ContextWrap::Occupy>("occupy"));
  m.push_back(InstanceMethod<&ContextWrap::OnSlowWait>("onSlowWait"));
}

}  // namespace rankflow::binding
