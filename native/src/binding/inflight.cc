// ContextWrap's session tensors, views of the window and asynchronous ops (runtime/ops/inflight.cc):
// a session tensor is a window offset (host: viewed through an ArrayBuffer over the mapped window,
// detached when the session closes or the rank is destroyed; cuda: a device address), an async op is
// an id returned by its issue and passed to inflightWait().
#include <algorithm>

#include "context.hpp"
#include "marshal.hpp"

namespace rankflow::binding {

namespace {

Napi::Array pair(Napi::Env env, Napi::Value a, Napi::Value b) {
  Napi::Array out = Napi::Array::New(env, 2);
  out.Set(uint32_t(0), a);
  out.Set(uint32_t(1), b);
  return out;
}

}  // namespace

void ContextWrap::detach_views(Napi::Env env) noexcept {
  for (auto& ref : views_) {
    if (ref.IsEmpty()) continue;
    napi_value v = ref.Value();
    if (v != nullptr) {
      // napi_detach_arraybuffer: an ArrayBuffer we made over external memory is detachable.
      if (napi_detach_arraybuffer(env, v) != napi_ok) {
        napi_value ignored;
        napi_get_and_clear_last_exception(env, &ignored);
      }
    }
    ref.Reset();
  }
  views_.clear();
  views_prune_at_ = 64;
}

// (bytes) -> the window offset of my slot of a fresh session region (a session tensor)
Napi::Value ContextWrap::SessionTensor(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t bytes = int_arg(info[0], "bytes", 0, c.sym_bytes);
  const int64_t at = guarded(env, [&] { return ops::session_tensor(c, bytes); });
  return Napi::Number::New(env, double(c.ws.bytes + at));
}

// (window offset, bytes) -> an ArrayBuffer over those bytes of my window (host backend, inside the
// open session's part of the buffer); detached at session close and destroy.
Napi::Value ContextWrap::WindowView(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t offset = int_arg(info[0], "offset", 0, c.sym_bytes);
  const int64_t bytes = int_arg(info[1], "bytes", 0, c.sym_bytes);
  if (c.backend().info().device_memory) throw_einval(env, "windowView: host backend only (cuda views are device tensors)");
  if (!c.session.open) throw js_error(env, "STATE", "windowView: no AGRS session is open");
  if (offset < c.ws.bytes || offset + bytes > c.ws.bytes + c.session.cursor)
    throw_einval(env, "windowView: [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                          ") is outside the session's part of the buffer");
  const uint64_t window = guarded(env, [&] { return c.backend().info().windows.at(size_t(c.rank())); });
  auto* p = reinterpret_cast<uint8_t*>(uintptr_t(window)) + offset;
  Napi::ArrayBuffer ab = Napi::ArrayBuffer::New(env, p, size_t(bytes));
  // Forget the views that were collected meanwhile, so that a long session does not grow this list
  // (pruned when it doubled since the last time: amortised constant per view).
  if (views_.size() >= views_prune_at_) {
    std::vector<Napi::Reference<Napi::ArrayBuffer>> live;
    for (auto& r : views_)
      if (!r.IsEmpty() && !r.Value().IsEmpty()) live.push_back(std::move(r));
    views_ = std::move(live);
    views_prune_at_ = std::max<size_t>(64, 2 * views_.size());
  }
  views_.push_back(Napi::Reference<Napi::ArrayBuffer>::New(ab, 0));
  return ab;
}

// (reduce, input, bytes per rank | n per chunk, bf16) -> [id, window offset of the result]
Napi::Value ContextWrap::SessionIssue(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const bool reduce = info[0].ToBoolean().Value();
  const int64_t size = int_arg(info[2], reduce ? "n" : "bytes", 0, c.sym_bytes);
  const bool bf16 = info[3].ToBoolean().Value();
  const int64_t in_bytes = reduce ? size * c.world() * (bf16 ? 2 : 4) : size;
  const Mem in = ref_arg(info[1], "input", info[1].IsBigInt() ? -1 : in_bytes);
  int64_t at = 0;
  const uint64_t id = guarded(env, [&] { return ops::session_issue(c, reduce, in, size, bf16, &at); });
  return pair(env, Napi::Number::New(env, double(id)), Napi::Number::New(env, double(c.ws.bytes + at)));
}

// (ids: Int32Array) -> [id, device address of the rows (cuda) or 0n (host: inflightWait returns them)]
Napi::Value ContextWrap::EngramFetchIssue(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  if (!info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
    throw_einval(env, "indices must be an Int32Array");
  const auto ids = info[0].As<Napi::Int32Array>();
  uint64_t out = 0;
  const uint64_t id = guarded(env, [&] {
    return ops::engram_fetch_issue(c, reinterpret_cast<const int32_t*>(bytes_of(ids)), int64_t(ids.ElementLength()), &out);
  });
  return pair(env, Napi::Number::New(env, double(id)), big(env, out));
}

// (id) -> host fetches: an ArrayBuffer of the rows (it owns them); anything else: undefined
Napi::Value ContextWrap::InflightWait(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const uint64_t id = uint64_t(int_arg(info[0], "id", 1, int64_t(1) << 53));
  std::unique_ptr<InFlightOp> op = guarded(env, [&] { return ops::inflight_wait(c, id); });
  if (!op->host_out) return env.Undefined();
  const size_t bytes = size_t(op->host_out_bytes);
  uint8_t* p = op->host_out.release();
  return Napi::ArrayBuffer::New(env, p, bytes, [](Napi::Env, void* data) { std::free(data); });
}

// In the method table (ContextWrap::Define).
void ContextWrap::inflight_methods(Methods& m) {
  m.push_back(InstanceMethod<&ContextWrap::SessionTensor>("sessionTensor"));
  m.push_back(InstanceMethod<&ContextWrap::WindowView>("windowView"));
  m.push_back(InstanceMethod<&ContextWrap::SessionIssue>("sessionIssue"));
  m.push_back(InstanceMethod<&ContextWrap::EngramFetchIssue>("engramFetchIssue"));
  m.push_back(InstanceMethod<&ContextWrap::InflightWait>("inflightWait"));
}

}  // namespace rankflow::binding
