// layout(), alignment and closeFds (layout.hpp).
#include "layout.hpp"

#include <unistd.h>

#include <initializer_list>
#include <utility>

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
  w.Set("live", double(ws.live));
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

// A plain object of named numbers (the ABI's word indices and constants).
Napi::Object numbers_object(Napi::Env env, std::initializer_list<std::pair<const char*, double>> entries) {
  Napi::Object o = Napi::Object::New(env);
  for (const auto& [name, value] : entries) o.Set(name, value);
  return o;
}

// The word indices and numbers JS shares with the binding and the kernels (actors/core/addon.ts keeps
// its copies as literal types; test/abi.test.ts compares every one with these).
Napi::Object abi_object(Napi::Env env) {
  using W = AbortWords;
  Napi::Array phases = Napi::Array::New(env, size_t(kPhaseCount));
  for (uint64_t p = 0; p < kPhaseCount; ++p) phases.Set(uint32_t(p), phase_name(p));
  Napi::Object o = Napi::Object::New(env);
  o.Set("scratch", numbers_object(env, {{"layoutId", kScratchLayoutId}, {"numRecv", kScratchNumRecv}, {"graphOps", kScratchGraphOps}, {"maskedSlots", kScratchMaskedSlots},
                                        {"addresses", kScratchAddresses}, {"args", kScratchArgs}, {"tokensPerExpert", kScratchTokensPerExpert}}));
  o.Set("dispatchArg", numbers_object(env, {{"numTokens", dispatch_arg::kNumTokens}, {"xElemBytes", dispatch_arg::kXElemBytes},
                                            {"expertAlignment", dispatch_arg::kExpertAlignment}, {"handle", dispatch_arg::kHandle},
                                            {"numSms", dispatch_arg::kNumSms}, {"mode", dispatch_arg::kMode}}));
  o.Set("combineArg", numbers_object(env, {{"handle", combine_arg::kHandle}, {"numSms", combine_arg::kNumSms}, {"xRows", combine_arg::kXRows}}));
  o.Set("dispatchModes", numbers_object(env, {{"host", kDispatchHost}, {"deviceAlloc", kDispatchDeviceAlloc},
                                              {"inBuffer", kDispatchInBuffer}, {"pending", kDispatchPending}}));
  o.Set("phases", phases);
  o.Set("abortWords", numbers_object(env, {{"failedRank", W::kFailedRank}, {"stopping", W::kStopping},
                                           {"failureReasonBytes", W::kFailureReasonBytes}, {"releaseOrigin", W::kReleaseOrigin},
                                           {"releasedAbove", W::kReleasedAbove}, {"releaseReasonBytes", W::kReleaseReasonBytes}, {"leftRank", W::kLeftRank},
                                           {"words", W::kWords}, {"maxReason", W::kMaxReason}, {"failureReasonAt", W::kFailureReasonAt},
                                           {"releaseReasonAt", W::kReleaseReasonAt}, {"bytes", W::kBytes}}));
  return o;
}

}  // namespace

void RegisterLayout(Napi::Env env, Napi::Object exports) {
  exports.Set("abi", abi_object(env));
  exports.Set("layout", Napi::Function::New(env, Layout));
  exports.Set("closeFds", Napi::Function::New(env, CloseFds));
  exports.Set("alignment", Napi::Number::New(env, double(kAlignment)));
}

}  // namespace rankflow::binding
