// layout(), alignment and closeFds (layout.hpp).
#include "layout.hpp"

#include <unistd.h>

#include "context.hpp"
#include "marshal.hpp"
#include "protocol.hpp"

namespace rankflow::binding {

namespace {

Napi::Object layout_object(Napi::Env env, const EpConfig& c) {
  const auto ws = WorkspaceLayout::make(c.world_size, int32_t(c.num_experts / c.world_size));
  const auto b = BufferLayout::make(c);
  Napi::Object w = Napi::Object::New(env);
  w.Set("barrier", double(ws.barrier));
  w.Set("cpuBarrier", double(ws.cpu_barrier));
  w.Set("enter", double(ws.enter));
  w.Set("done", double(ws.done));
  w.Set("rankCount", double(ws.rank_count));
  w.Set("expertCount", double(ws.expert_count));
  w.Set("session", double(ws.session));
  w.Set("slotBytes", double(kSlotBytes));
  w.Set("seqWord", double(kSignalSeqWord));
  w.Set("payloadWord", double(kSignalPayloadWord));
  w.Set("tagWord", double(kSignalTagWord));
  w.Set("bytes", double(ws.bytes));
  Napi::Object bo = Napi::Object::New(env);
  bo.Set("slots", double(b.slots));
  bo.Set("x", double(b.x));
  bo.Set("scales", double(b.scales));
  bo.Set("topkIdx", double(b.topk_idx));
  bo.Set("topkWeights", double(b.topk_weights));
  bo.Set("srcToken", double(b.src_token));
  bo.Set("srcRank", double(b.src_rank));
  bo.Set("dispatchBytes", double(b.dispatch_bytes));
  bo.Set("combineX", double(b.combine_x));
  bo.Set("combineWeights", double(b.combine_weights));
  bo.Set("combineFlags", double(b.combine_flags));
  bo.Set("combineBytes", double(b.combine_bytes));
  bo.Set("bytes", double(b.bytes));
  Napi::Object o = Napi::Object::New(env);
  o.Set("workspace", w);
  o.Set("buffer", bo);
  o.Set("alignment", double(kAlignment));
  o.Set("sizeHint", double(size_hint(c)));
  return o;
}

// layout({ maxTokensPerRank, hidden, topk, numExperts, fp8Dispatch }, worldSize)
Napi::Value Layout(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsObject()) throw_einval(env, "layout(config, worldSize)");
  const Napi::Object o = info[0].As<Napi::Object>();
  EpConfig c;
  c.world_size = int32_t(int_arg(info[1], "worldSize", 1, kMaxRanks));
  c.max_tokens_per_rank = int_prop(o, "maxTokensPerRank", 0, 0, int64_t(1) << 31);
  c.hidden = int_prop(o, "hidden", 0, 0, int64_t(1) << 24);
  c.topk = int_prop(o, "topk", 0, 0, 64);
  c.num_experts = int_prop(o, "numExperts", 0, 0, int64_t(1) << 24);
  c.fp8 = bool_prop(o, "fp8Dispatch", false);
  return layout_object(env, c);
}

// Closes fds received from other processes once every local rank has mapped them.
Napi::Value CloseFds(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsArray()) throw_einval(env, "closeFds needs an array of fds");
  const auto arr = info[0].As<Napi::Array>();
  for (uint32_t i = 0; i < arr.Length(); ++i) close(int(int_arg(arr.Get(i), "fd", 0, INT32_MAX)));
  return env.Undefined();
}

}  // namespace

// The abort words' layout (protocol.hpp AbortWords), for the one copy in TypeScript to be checked against.
Napi::Object abort_words_object(Napi::Env env) {
  using W = AbortWords;
  Napi::Object o = Napi::Object::New(env);
  o.Set("failedRank", W::kFailedRank);
  o.Set("stopping", W::kStopping);
  o.Set("failureReasonBytes", W::kFailureReasonBytes);
  o.Set("releaseOrigin", W::kReleaseOrigin);
  o.Set("releasedAbove", W::kReleasedAbove);
  o.Set("releaseReasonBytes", W::kReleaseReasonBytes);
  o.Set("words", W::kWords);
  o.Set("maxReason", W::kMaxReason);
  o.Set("failureReasonAt", W::kFailureReasonAt);
  o.Set("releaseReasonAt", W::kReleaseReasonAt);
  o.Set("bytes", W::kBytes);
  return o;
}

// The word indices and numbers JS shares with the binding and the kernels (actors/core/addon.ts keeps
// its copies as literal types; test/abi.test.ts compares every one with these).
static Napi::Object abi_object(Napi::Env env) {
  Napi::Object scratch = Napi::Object::New(env);
  scratch.Set("layoutId", kScratchLayoutId);
  scratch.Set("numRecv", kScratchNumRecv);
  scratch.Set("graphOps", kScratchGraphOps);
  scratch.Set("addresses", kScratchAddresses);
  scratch.Set("args", kScratchArgs);
  scratch.Set("tokensPerExpert", kScratchTokensPerExpert);
  Napi::Object d = Napi::Object::New(env);
  d.Set("numTokens", dispatch_arg::kNumTokens);
  d.Set("xElemBytes", dispatch_arg::kXElemBytes);
  d.Set("expertAlignment", dispatch_arg::kExpertAlignment);
  d.Set("handle", dispatch_arg::kHandle);
  d.Set("numSms", dispatch_arg::kNumSms);
  d.Set("mode", dispatch_arg::kMode);
  Napi::Object cb = Napi::Object::New(env);
  cb.Set("handle", combine_arg::kHandle);
  cb.Set("numSms", combine_arg::kNumSms);
  cb.Set("xRows", combine_arg::kXRows);
  Napi::Object modes = Napi::Object::New(env);
  modes.Set("host", kDispatchHost);
  modes.Set("deviceAlloc", kDispatchDeviceAlloc);
  modes.Set("inBuffer", kDispatchInBuffer);
  modes.Set("pending", kDispatchPending);
  Napi::Array phases = Napi::Array::New(env, size_t(kPhaseCount));
  for (uint64_t p = 0; p < kPhaseCount; ++p) phases.Set(uint32_t(p), phase_name(p));
  Napi::Object o = Napi::Object::New(env);
  o.Set("scratch", scratch);
  o.Set("dispatchArg", d);
  o.Set("combineArg", cb);
  o.Set("dispatchModes", modes);
  o.Set("phases", phases);
  o.Set("abortWords", abort_words_object(env));
  return o;
}

void RegisterLayout(Napi::Env env, Napi::Object exports) {
  exports.Set("abi", abi_object(env));
  exports.Set("layout", Napi::Function::New(env, Layout));
  exports.Set("abortWords", abort_words_object(env));
  exports.Set("closeFds", Napi::Function::New(env, CloseFds));
  exports.Set("alignment", Napi::Number::New(env, double(kAlignment)));
}

}  // namespace rankflow::binding
