// ContextWrap: MoE dispatch (with its CPU-sync resume) and combine; the counts written to the scratch.
#include "context.hpp"

#include "marshal.hpp"

namespace rankflow::binding {

void ContextWrap::write_counts(const DispatchLayout& l) {
  scratch_f64_[kScratchNumRecv] = l.counts_known ? double(l.num_recv) : -1.0;
  if (!l.counts_known) return;
  ops::aligned_tokens_per_expert(l, scratch_f64_ + kScratchTokensPerExpert);
}

// (x, scales, topkIdx, topkWeights); in the scratch's args: numTokens, xElemBytes, expertAlignment,
// handle, numSms, mode.
//   mode 0: host tensors, outputs made here (returned); 1: device tensors, outputs allocated on the
//   rank's GPU after the CPU sync (addresses in the scratch); 2: device tensors, outputs left in the
//   buffer, no CPU sync. Returns the host outputs (mode 0), 1 = the CPU-sync wait is pending
//   (dispatchResume), or undefined.
Napi::Value ContextWrap::Dispatch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  if (pending_) throw js_error(env, "STATE", "a dispatch is waiting for its counts: dispatchResume() first");
  const EpConfig& ep = c.cfg.ep;
  // Here, not on the heap: it moves there only if its CPU-sync wait is pending.
  PendingDispatch p;
  DispatchInput& in = p.in;
  const double* args = scratch_f64_ + kScratchArgs;
  // The count only as a number here: the runtime refuses one above buffer.maxTokensPerRank (ops/dispatch.cc).
  in.num_tokens = int_of(env, args[dispatch_arg::kNumTokens], "numTokens", 0, INT32_MAX);
  in.x_elem_bytes = int_of(env, args[dispatch_arg::kXElemBytes], "xElemBytes", 1, 2);
  in.expert_alignment = int_of(env, args[dispatch_arg::kExpertAlignment], "expertAlignment", 1, 1 << 16);
  in.handle = uint32_t(int_of(env, args[dispatch_arg::kHandle], "handle", 0, UINT32_MAX));
  in.num_sms = int(int_of(env, args[dispatch_arg::kNumSms], "numSms", 0, 1 << 16));
  p.mode = int(int_of(env, args[dispatch_arg::kMode], "mode", kDispatchHost, kDispatchInBuffer));
  in.cpu_sync = p.mode != kDispatchInBuffer;
  const int64_t T = in.num_tokens, K = ep.topk, H = ep.hidden;
  const bool device = p.mode != kDispatchHost;
  auto tensor = [&](int i, const char* name, int64_t bytes) {
    const Mem r = ref_arg(info[i], name, device ? -1 : bytes);
    if (r && r.device != device)
      throw_einval(env, std::string(name) + (device ? " must be a device tensor" : " must be a host tensor"));
    if (r && !device) p.keep.push_back(Napi::Persistent(info[i]));
    return r;
  };
  in.x = tensor(0, "x", T * H * in.x_elem_bytes);
  in.scales = tensor(1, "scales", T * c.buf.scales_per_token * 4);
  in.topk_idx = tensor(2, "topkIdx", T * K * 4);
  in.topk_weights = tensor(3, "topkWeights", T * K * 4);
  if (!in.x && T > 0) throw_einval(env, "x is required");
  return guarded(env, [&]() -> Napi::Value {
    p.layout = ops::dispatch_begin(c, in);
    if (p.mode != kDispatchInBuffer && !ops::dispatch_counts(c, *p.layout, /*block=*/false)) {
      pending_ = std::make_unique<PendingDispatch>(std::move(p));
      return Napi::Number::New(env, kDispatchPending);
    }
    return finish_dispatch(env, p);
  });
}

Napi::Value ContextWrap::DispatchResume(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  if (!pending_) throw js_error(env, "STATE", "no dispatch is waiting for its counts");
  std::unique_ptr<PendingDispatch> p = std::move(pending_);
  return guarded(env, [&]() -> Napi::Value {
    ops::dispatch_counts(c, *p->layout, /*block=*/true);
    return finish_dispatch(env, *p);
  });
}

Napi::Value ContextWrap::finish_dispatch(Napi::Env env, PendingDispatch& p) {
  Context& c = *ctx_;
  DispatchLayout& l = *p.layout;
  const EpConfig& ep = c.cfg.ep;
  const int64_t K = ep.topk, H = ep.hidden, S = c.buf.scales_per_token;
  const bool fp8 = p.in.x_elem_bytes == 1;
  DispatchOutput out;
  scratch_f64_[kScratchLayoutId] = double(l.id);
  scratch_f64_[kScratchMaskedSlots] = double(l.masked_slots);
  if (p.mode == kDispatchInBuffer) {
    out.in_buffer = true;
    ops::dispatch_finish(c, l, p.in, out);
    write_counts(l);
    return env.Undefined();
  }
  const int64_t R = l.num_recv;
  if (p.mode == kDispatchDeviceAlloc) {
    DeviceOps& b = c.device("dispatch outputs");
    std::vector<uint64_t> owned;
    auto take = [&](int64_t bytes) {
      owned.push_back(b.device_alloc(bytes));
      return Mem{reinterpret_cast<void*>(uintptr_t(owned.back())), true};
    };
    try {
      out.x = take(R * H * p.in.x_elem_bytes);
      if (fp8) out.scales = take(R * S * 4);
      out.topk_idx = take(R * K * 4);
      out.topk_weights = take(R * K * 4);
      out.src_rank = take(R * 4);
      out.src_token = take(R * 4);
      ops::dispatch_finish(c, l, p.in, out);
    } catch (...) {
      for (const uint64_t a : owned) b.device_free(a);
      throw;
    }
    const Mem* refs[6] = {&out.x, &out.scales, &out.topk_idx, &out.topk_weights, &out.src_rank, &out.src_token};
    for (int i = 0; i < 6; ++i) scratch_u64_[kScratchAddresses + i] = address_of(refs[i]->ptr);
    write_counts(l);
    return env.Undefined();
  }
  Napi::Object o = Napi::Object::New(env);
  auto typed = [&](const char* name, Napi::TypedArray ta, Mem& ref) {
    ref = Mem{bytes_of(ta), false};
    o.Set(name, ta);
  };
  if (fp8) typed("x", Napi::Uint8Array::New(env, size_t(R * H)), out.x);
  else typed("x", Napi::Uint16Array::New(env, size_t(R * H)), out.x);
  if (fp8) typed("scales", Napi::Float32Array::New(env, size_t(R * S)), out.scales);
  typed("topkIdx", Napi::Int32Array::New(env, size_t(R * K)), out.topk_idx);
  typed("topkWeights", Napi::Float32Array::New(env, size_t(R * K)), out.topk_weights);
  typed("srcRank", Napi::Int32Array::New(env, size_t(R)), out.src_rank);
  typed("srcToken", Napi::Int32Array::New(env, size_t(R)), out.src_token);
  ops::dispatch_finish(c, l, p.in, out);
  write_counts(l);
  return o;
}

// (x, topkWeights, bias0, bias1, outX, outW): host typed arrays, or device addresses (outX = 0n: the
// outputs are allocated on the rank's GPU, addresses in the scratch); in the scratch's args: handle,
// numSms, xRows.
Napi::Value ContextWrap::Combine(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const double* args = scratch_f64_ + kScratchArgs;
  const uint32_t handle = uint32_t(int_of(env, args[combine_arg::kHandle], "handle", 0, UINT32_MAX));
  const int num_sms = int(int_of(env, args[combine_arg::kNumSms], "numSms", 0, 1 << 16));
  const EpConfig& ep = c.cfg.ep;
  const int64_t K = ep.topk, H = ep.hidden;
  const bool device = info[0].IsBigInt();
  auto l = guarded(env, [&] { return ops::handle_layout(c, handle, "input.handle"); });
  const int64_t T = l->num_tokens;
  const int64_t x_rows = device ? int_of(env, args[combine_arg::kXRows], "x rows", 0, INT32_MAX) : -1;
  if (device) {
    // Without a CPU sync the received count is unknown here: x must have room for every row that can come.
    const int64_t need = l->counts_known ? l->num_recv : int64_t(c.world()) * ep.max_tokens_per_rank;
    if (x_rows < need)
      throw_einval(env, "input.x.shape[0]: is " + std::to_string(x_rows) + "; the dispatch " +
                            (l->counts_known ? "received " + std::to_string(need) + " rows"
                                             : "ran without a CPU sync, so x needs its worst case of " +
                                                   std::to_string(need) + " rows (W * maxTokensPerRank)"));
  }
  const int64_t R = l->counts_known ? l->num_recv : 0;
  CombineInput in;
  in.num_sms = num_sms;
  auto tensor = [&](int i, const char* name, int64_t bytes) {
    const Mem r = ref_arg(info[i], name, device ? -1 : bytes);
    if (r && r.device != device) throw_einval(env, std::string(name) + (device ? " must be a device tensor" : " must be a host tensor"));
    return r;
  };
  in.x = tensor(0, "x", R * H * 2);
  in.topk_weights = tensor(1, "topkWeights", R * K * 4);
  in.bias[0] = tensor(2, "bias[0]", T * H * 2);
  in.bias[1] = tensor(3, "bias[1]", T * H * 2);
  CombineOutput out;
  const bool alloc = device && info[4].IsBigInt() && address_arg(info[4], "out.x") == 0;
  if (!alloc) {
    out.x = tensor(4, "out.x", T * H * 2);
    out.topk_weights = tensor(5, "out.topkWeights", T * K * 4);
    if (!out.x || !out.topk_weights) throw_einval(env, "combine needs out.x and out.topkWeights");
  }
  guarded(env, [&] {
    uint64_t ax = 0, aw = 0;
    DeviceOps* b = alloc ? &c.device("combine outputs") : nullptr;
    if (alloc) {
      ax = b->device_alloc(T * H * 2);
      try {
        aw = b->device_alloc(T * K * 4);
      } catch (...) {
        b->device_free(ax);
        throw;
      }
      out.x = Mem{reinterpret_cast<void*>(uintptr_t(ax)), true};
      out.topk_weights = Mem{reinterpret_cast<void*>(uintptr_t(aw)), true};
    }
    try {
      ops::combine(c, handle, in, out);
    } catch (...) {
      if (alloc) b->device_free(ax), b->device_free(aw);
      throw;
    }
    scratch_u64_[kScratchAddresses + 6] = address_of(out.x.ptr);
    scratch_u64_[kScratchAddresses + 7] = address_of(out.topk_weights.ptr);
  });
  return env.Undefined();
}

// In the method table (ContextWrap::Define).
void ContextWrap::moe_methods(Methods& m) {
  m.push_back(InstanceMethod<&ContextWrap::Dispatch>("dispatch"));
  m.push_back(InstanceMethod<&ContextWrap::DispatchResume>("dispatchResume"));
  m.push_back(InstanceMethod<&ContextWrap::Combine>("combine"));
}

}  // namespace rankflow::binding
