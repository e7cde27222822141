// ContextWrap: construction from the worker's config, and one method per operation (see context.hpp).
#include "context.hpp"

#include <unistd.h>

#include <cstring>

#include "marshal.hpp"

namespace rankflow::binding {

namespace {

ContextConfig config_from(const Napi::Object& o) {
  Napi::Env env = o.Env();
  ContextConfig c;
  const std::string backend = str_prop(o, "backend");
  if (!backend.empty() && backend != "host" && backend != "cuda") throw_einval(env, "backend must be 'host' or 'cuda'");
  c.backend = backend == "cuda" ? BackendKind::Cuda : BackendKind::Host;
  c.device = int(int_prop(o, "device", -1, -1, 1 << 20));
  c.device_share = int(int_prop(o, "deviceShare", 1, 1, kMaxRanks));
  c.nccl = bool_prop(o, "nccl", true);
  c.cooperative = bool_prop(o, "cooperative", true);
  c.world_size = int(int_prop(o, "worldSize", 1, 1, kMaxRanks));
  c.rank = int(int_prop(o, "rank", 0, 0, c.world_size - 1));
  c.ranks_per_node = int(int_prop(o, "ranksPerNode", 0, 0, kMaxRanks));
  c.scale_out = bool_prop(o, "scaleOut", false);
  c.ep.world_size = c.world_size;
  c.ep.max_tokens_per_rank = int_prop(o, "maxTokensPerRank", 0, 0, int64_t(1) << 31);
  c.ep.hidden = int_prop(o, "hidden", 0, 0, int64_t(1) << 24);
  c.ep.topk = int_prop(o, "topk", 0, 0, 64);
  c.ep.num_experts = int_prop(o, "numExperts", 0, 0, int64_t(1) << 24);
  c.ep.fp8 = bool_prop(o, "fp8Dispatch", false);
  c.num_bytes = int_prop(o, "bytes", 0, 0, int64_t(1) << 50);
  c.cpu_bytes = int_prop(o, "cpuBytes", 0, 0, int64_t(1) << 50);
  c.hybrid = bool_prop(o, "hybrid", true);
  c.cpu_timeout_s = num_prop(o, "cpuSeconds", 300);
  c.gpu_timeout_s = num_prop(o, "gpuSeconds", 100);
  c.ce_min_bytes = int_prop(o, "ceMinBytes", c.ce_min_bytes, 0, int64_t(1) << 50);
  c.nccl_home = str_prop(o, "ncclHome");
  c.first_seq = uint64_t(int_prop(o, "firstSeq", 0, 0, int64_t(1) << 53));
  return c;
}

Napi::Value big(Napi::Env env, uint64_t v) { return Napi::BigInt::New(env, v); }

}  // namespace

Napi::Function ContextWrap::Define(Napi::Env env) {
  return DefineClass(env, "Context",
                     {
                         InstanceMethod<&ContextWrap::Exported>("exported"),
                         InstanceMethod<&ContextWrap::ImportPeers>("importPeers"),
                         InstanceMethod<&ContextWrap::NcclUniqueId>("ncclUniqueId"),
                         InstanceMethod<&ContextWrap::NcclInit>("ncclInit"),
                         InstanceMethod<&ContextWrap::Info>("info"),
                         InstanceMethod<&ContextWrap::ReadWindow>("readWindow"),
                         InstanceMethod<&ContextWrap::WritePeer>("writePeer"),
                         InstanceMethod<&ContextWrap::Destroy>("destroy"),
                         InstanceMethod<&ContextWrap::Barrier>("barrier"),
                         InstanceMethod<&ContextWrap::AllGather>("allGather"),
                         InstanceMethod<&ContextWrap::Dispatch>("dispatch"),
                         InstanceMethod<&ContextWrap::DispatchResume>("dispatchResume"),
                         InstanceMethod<&ContextWrap::Combine>("combine"),
                         InstanceMethod<&ContextWrap::SessionOpen>("sessionOpen"),
                         InstanceMethod<&ContextWrap::SessionClose>("sessionClose"),
                         InstanceMethod<&ContextWrap::SessionAllGather>("sessionAllGather"),
                         InstanceMethod<&ContextWrap::SessionReduceScatter>("sessionReduceScatter"),
                         InstanceMethod<&ContextWrap::EngramWrite>("engramWrite"),
                         InstanceMethod<&ContextWrap::EngramFetch>("engramFetch"),
                         InstanceMethod<&ContextWrap::PpExchange>("ppExchange"),
                         InstanceMethod<&ContextWrap::SessionTensor>("sessionTensor"),
                         InstanceMethod<&ContextWrap::WindowView>("windowView"),
                         InstanceMethod<&ContextWrap::SessionIssue>("sessionIssue"),
                         InstanceMethod<&ContextWrap::EngramFetchIssue>("engramFetchIssue"),
                         InstanceMethod<&ContextWrap::InflightWait>("inflightWait"),
                         InstanceMethod<&ContextWrap::DeviceAlloc>("deviceAlloc"),
                         InstanceMethod<&ContextWrap::DeviceFree>("deviceFree"),
                         InstanceMethod<&ContextWrap::DeviceUpload>("deviceUpload"),
                         InstanceMethod<&ContextWrap::DeviceDownload>("deviceDownload"),
                         InstanceMethod<&ContextWrap::DeviceSync>("deviceSync"),
                         InstanceMethod<&ContextWrap::EventRecord>("eventRecord"),
                         InstanceMethod<&ContextWrap::EventElapsed>("eventElapsed"),
                         InstanceMethod<&ContextWrap::EventDestroy>("eventDestroy"),
                         InstanceMethod<&ContextWrap::LastOpMs>("lastOpMs"),
                         InstanceMethod<&ContextWrap::BenchAlltoAll>("benchAlltoAll"),
                         InstanceMethod<&ContextWrap::BenchPeerCopy>("benchPeerCopy"),
                         InstanceMethod<&ContextWrap::BenchAgrs>("benchAgrs"),
                         InstanceMethod<&ContextWrap::CaptureBegin>("captureBegin"),
                         InstanceMethod<&ContextWrap::CaptureEnd>("captureEnd"),
                         InstanceMethod<&ContextWrap::Replay>("replay"),
                         InstanceMethod<&ContextWrap::GraphFree>("graphFree"),
                         InstanceMethod<&ContextWrap::Occupy>("occupy"),
                         InstanceMethod<&ContextWrap::OnSlowWait>("onSlowWait"),
                         // interop.cc
                         InstanceMethod<&ContextWrap::CudaStream>("cudaStream"),
                         InstanceMethod<&ContextWrap::CudaContext>("cudaContext"),
                         InstanceMethod<&ContextWrap::EventWait>("eventWait"),
                         InstanceMethod<&ContextWrap::DeviceCheck>("deviceCheck"),
                         // scaleout.cc
                         InstanceMethod<&ContextWrap::ScaleoutListen>("scaleoutListen"),
                         InstanceMethod<&ContextWrap::ScaleoutConnect>("scaleoutConnect"),
                         InstanceMethod<&ContextWrap::TrafficWords>("trafficWords"),
                     });
}

ContextWrap::ContextWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ContextWrap>(info) {
  Napi::Env env = info.Env();
  if (!info[0].IsObject()) throw_einval(env, "Context needs a config object");
  const ContextConfig cfg = config_from(info[0].As<Napi::Object>());
  // The abort words: an Int32Array over a SharedArrayBuffer the main thread writes. Where it holds a
  // whole page, the words sit at its first page boundary, so that the cuda backend can map that page
  // into the GPU (kernels then see an abort directly); `abortOffset` tells the worker where.
  int32_t* words = nullptr;
  int64_t words_offset = 0;
  if (info.Length() > 1 && info[1].IsTypedArray()) {
    const auto ta = info[1].As<Napi::TypedArray>();
    if (ta.TypedArrayType() != napi_int32_array || ta.ElementLength() < size_t(Abort::kWords))
      throw_einval(env, "the abort words must be an Int32Array of at least " + std::to_string(Abort::kWords));
    uint8_t* base = bytes_of(ta);
    constexpr uintptr_t kPage = 4096;
    const uintptr_t aligned = (reinterpret_cast<uintptr_t>(base) + kPage - 1) & ~(kPage - 1);
    if (ta.ByteLength() >= 2 * kPage) words_offset = int64_t(aligned - reinterpret_cast<uintptr_t>(base));
    words = reinterpret_cast<int32_t*>(base + words_offset);
    abort_words_ = Napi::Persistent(info[1]);
  }
  try {
    ctx_ = std::make_unique<Context>(cfg, words);
  } catch (const Error& e) {
    throw js_error(env, e);
  } catch (const std::exception& e) {
    throw js_error(env, "BACKEND_UNAVAILABLE", e.what());
  }
  const int64_t epr = ctx_->experts_per_rank();
  auto scratch = Napi::ArrayBuffer::New(env, size_t(8 * (kScratchTokensPerExpert + (epr > 0 ? epr : 1))));
  scratch_f64_ = static_cast<double*>(scratch.Data());
  scratch_u64_ = static_cast<uint64_t*>(scratch.Data());
  scratch_ = Napi::Persistent(scratch);
  info.This().As<Napi::Object>().Set("scratch", scratch);
  info.This().As<Napi::Object>().Set("abortOffset", Napi::Number::New(env, double(words_offset)));
  // A terminated worker never calls destroy(): tear down when its environment goes away.
  env_ = env;
  napi_add_env_cleanup_hook(env, OnEnvCleanup, this);
}

ContextWrap::~ContextWrap() {
  if (!cleanup_ran_) napi_remove_env_cleanup_hook(env_, OnEnvCleanup, this);
  teardown();
}

void ContextWrap::OnEnvCleanup(void* arg) {
  auto* self = static_cast<ContextWrap*>(arg);
  self->cleanup_ran_ = true;
  // The worker ended without destroy() (terminate, crash): nobody waits for this rank's teardown.
  if (self->ctx_) self->ctx_->abort.abandoned = true;
  self->pending_.reset();
  self->teardown();
  self->abort_words_.SuppressDestruct();
  self->scratch_.SuppressDestruct();
  self->slow_wait_.SuppressDestruct();
  self->traffic_words_.SuppressDestruct();
}

void ContextWrap::teardown() noexcept {
  if (ctx_) ctx_->destroy();
  ctx_.reset();
}

Context& ContextWrap::ctx(Napi::Env env) {
  if (!ctx_ || !ctx_->alive()) throw js_error(env, "STATE", "the rank's context is destroyed");
  return *ctx_;
}

// ---- lifecycle and probes ----

Napi::Value ContextWrap::Exported(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const ExportedSegments e = guarded(env, [&] { return ctx(env).backend().exported(); });
  Napi::Object o = Napi::Object::New(env);
  o.Set("deviceFd", e.device_fd);
  o.Set("hostFd", e.host_fd);
  o.Set("pid", Napi::Number::New(env, getpid()));
  return o;
}

Napi::Value ContextWrap::ImportPeers(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  if (!info[0].IsArray()) throw_einval(env, "importPeers needs an array of exported segments");
  const auto arr = info[0].As<Napi::Array>();
  std::vector<ExportedSegments> peers(arr.Length());
  for (uint32_t i = 0; i < arr.Length(); ++i) {
    if (!arr.Get(i).IsObject()) throw_einval(env, "importPeers: entry " + std::to_string(i) + " is not an object");
    const auto o = arr.Get(i).As<Napi::Object>();
    peers[i] = {int(int_prop(o, "deviceFd", -1, -1, INT32_MAX)), int(int_prop(o, "hostFd", -1, -1, INT32_MAX))};
  }
  guarded(env, [&] { ops::register_window(c, peers); });
  return env.Undefined();
}

Napi::Value ContextWrap::NcclUniqueId(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const std::vector<uint8_t> id = guarded(env, [&] { return ctx(env).backend().nccl_unique_id(); });
  if (id.empty()) return env.Null();
  auto out = Napi::Uint8Array::New(env, id.size());
  std::memcpy(out.Data(), id.data(), id.size());
  return out;
}

Napi::Value ContextWrap::NcclInit(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsTypedArray()) throw_einval(env, "ncclInit needs rank 0's unique id (a Uint8Array)");
  const auto in = info[0].As<Napi::TypedArray>();
  const uint8_t* p = bytes_of(in);
  std::vector<uint8_t> id(p, p + in.ByteLength());
  guarded(env, [&] { ctx(env).backend().nccl_init(id); });
  return env.Undefined();
}

Napi::Value ContextWrap::Info(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const BackendInfo b = guarded(env, [&] { return c.backend().info(); });
  Napi::Object o = Napi::Object::New(env);
  o.Set("rank", c.rank());
  o.Set("worldSize", c.world());
  o.Set("backend", b.backend);
  o.Set("memoryKind", memory_kind_name(b.memory_kind));
  o.Set("symmetricBytes", Napi::Number::New(env, double(c.sym_bytes)));
  o.Set("workspaceBytes", Napi::Number::New(env, double(c.ws.bytes)));
  o.Set("bufferBytes", Napi::Number::New(env, double(c.buffer_bytes())));
  o.Set("cpuBytes", Napi::Number::New(env, double(c.cpu_bytes)));
  o.Set("seq", Napi::Number::New(env, double(c.seq)));
  o.Set("stride", Napi::Number::New(env, double(b.stride)));
  o.Set("window", big(env, b.windows.at(size_t(c.rank()))));
  Napi::Array peers = Napi::Array::New(env, b.windows.size());
  for (size_t p = 0; p < b.windows.size(); ++p) peers.Set(uint32_t(p), big(env, b.windows[p]));
  o.Set("peerWindows", peers);
  if (b.device_ordinal >= 0) {
    Napi::Object g = Napi::Object::New(env);
    g.Set("ordinal", b.device_ordinal);
    g.Set("name", b.device_name);
    g.Set("nccl", b.nccl);
    g.Set("sms", b.sms);
    g.Set("smShare", b.sm_share);
    o.Set("device", g);
  }
  Napi::Object d = Napi::Object::New(env);
  d.Set("numNvlRanks", c.dom.num_nvl_ranks);
  d.Set("numRdmaRanks", c.dom.num_rdma_ranks);
  d.Set("nvlRankIdx", c.dom.nvl_rank_idx);
  d.Set("rdmaRankIdx", c.dom.rdma_rank_idx);
  d.Set("numScaleupRanks", c.dom.num_scaleup_ranks);
  d.Set("numScaleoutRanks", c.dom.num_scaleout_ranks);
  d.Set("scaleupRankIdx", c.dom.scaleup_rank_idx);
  d.Set("scaleoutRankIdx", c.dom.scaleout_rank_idx);
  d.Set("isScaleupNvlink", c.dom.is_scaleup_nvlink);
  o.Set("domains", d);
  return o;
}

// Probes of the window (tests): ranges inside the device segment, which every rank maps of every peer.
Napi::Value ContextWrap::ReadWindow(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t offset = int_arg(info[0], "offset", 0, c.sym_bytes);
  const int64_t len = int_arg(info[1], "length", 0, c.sym_bytes - offset);
  auto out = Napi::Uint8Array::New(env, size_t(len));
  guarded(env, [&] {
    c.backend().check_alive("readWindow");
    if (len > 0) c.backend().read_window(offset, len, out.Data());
  });
  return out;
}

Napi::Value ContextWrap::WritePeer(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int peer = int(int_arg(info[0], "peer", 0, c.world() - 1));
  if (!info[2].IsTypedArray()) throw_einval(env, "bytes must be a Uint8Array");
  const auto bytes = info[2].As<Napi::TypedArray>();
  const int64_t n = int64_t(bytes.ByteLength());
  const int64_t offset = int_arg(info[1], "offset", 0, c.sym_bytes - n);
  return big(env, guarded(env, [&] {
    c.backend().check_alive("writePeer");
    return c.backend().write_peer(peer, offset, bytes_of(bytes), n);
  }));
}

Napi::Value ContextWrap::Destroy(const Napi::CallbackInfo& info) {
  pending_.reset();
  detach_views(info.Env());
  teardown();
  return info.Env().Undefined();
}

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

void ContextWrap::write_counts(const DispatchLayout& l) {
  scratch_f64_[kScratchNumRecv] = l.counts_known ? double(l.num_recv) : -1.0;
  if (!l.counts_known) return;
  const std::vector<int64_t> tpe = ops::aligned_tokens_per_expert(l);
  for (size_t e = 0; e < tpe.size(); ++e) scratch_f64_[kScratchTokensPerExpert + e] = double(tpe[e]);
}

// (x, scales, topkIdx, topkWeights, numTokens, xElemBytes, expertAlignment, handle, numSms, mode)
//   mode 0: host tensors, outputs made here (returned); 1: device tensors, outputs allocated on the
//   rank's GPU after the CPU sync (addresses in the scratch); 2: device tensors, outputs left in the
//   buffer, no CPU sync. Returns the host outputs (mode 0), 1 = the CPU-sync wait is pending
//   (dispatchResume), or undefined.
Napi::Value ContextWrap::Dispatch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  if (pending_) throw js_error(env, "STATE", "a dispatch is waiting for its counts: dispatchResume() first");
  const EpConfig& ep = c.cfg.ep;
  auto p = std::make_unique<PendingDispatch>();
  DispatchInput& in = p->in;
  in.num_tokens = int_arg(info[4], "numTokens", 0, ep.max_tokens_per_rank);
  in.x_elem_bytes = int_arg(info[5], "xElemBytes", 1, 2);
  in.expert_alignment = int_arg(info[6], "expertAlignment", 1, 1 << 16);
  in.handle = uint32_t(int_arg(info[7], "handle", 0, UINT32_MAX));
  in.num_sms = int(int_arg(info[8], "numSms", 0, 1 << 16));
  p->mode = int(int_arg(info[9], "mode", 0, 2));
  const int64_t T = in.num_tokens, K = ep.topk, H = ep.hidden;
  const bool device = p->mode != 0;
  auto tensor = [&](int i, const char* name, int64_t bytes) {
    const Mem r = ref_arg(info[i], name, device ? -1 : bytes);
    if (r && r.device != device)
      throw_einval(env, std::string(name) + (device ? " must be a device tensor" : " must be a host tensor"));
    if (r && !device) p->keep.push_back(Napi::Persistent(info[i]));
    return r;
  };
  in.x = tensor(0, "x", T * H * in.x_elem_bytes);
  in.scales = tensor(1, "scales", T * c.buf.scales_per_token * 4);
  in.topk_idx = tensor(2, "topkIdx", T * K * 4);
  in.topk_weights = tensor(3, "topkWeights", T * K * 4);
  if (!in.x && T > 0) throw_einval(env, "x is required");
  return guarded(env, [&]() -> Napi::Value {
    p->layout = ops::dispatch_begin(c, in);
    if (p->mode != 2 && !ops::dispatch_counts(c, *p->layout, /*block=*/false)) {
      pending_ = std::move(p);
      return Napi::Number::New(env, 1);
    }
    return finish_dispatch(env, *p);
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
  if (p.mode == 2) {
    out.in_buffer = true;
    ops::dispatch_finish(c, l, p.in, out);
    write_counts(l);
    return env.Undefined();
  }
  const int64_t R = l.num_recv;
  if (p.mode == 1) {
    Backend& b = c.backend();
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

// (x, topkWeights, bias0, bias1, handle, numSms, outX, outW, xRows): host typed arrays, or device
// addresses (outX = 0n: the outputs are allocated on the rank's GPU, addresses in the scratch).
Napi::Value ContextWrap::Combine(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const uint32_t handle = uint32_t(int_arg(info[4], "handle", 0, UINT32_MAX));
  const int num_sms = int(int_arg(info[5], "numSms", 0, 1 << 16));
  const EpConfig& ep = c.cfg.ep;
  const int64_t K = ep.topk, H = ep.hidden;
  const bool device = info[0].IsBigInt();
  auto l = guarded(env, [&] { return ops::handle_layout(c, handle, "input.handle"); });
  const int64_t T = l->num_tokens;
  const int64_t x_rows = device ? int_arg(info[8], "x rows", 0, INT32_MAX) : -1;
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
  const bool alloc = device && info[6].IsBigInt() && address_arg(info[6], "out.x") == 0;
  if (!alloc) {
    out.x = tensor(6, "out.x", T * H * 2);
    out.topk_weights = tensor(7, "out.topkWeights", T * K * 4);
    if (!out.x || !out.topk_weights) throw_einval(env, "combine needs out.x and out.topkWeights");
  }
  guarded(env, [&] {
    Backend& b = c.backend();
    uint64_t ax = 0, aw = 0;
    if (alloc) {
      ax = b.device_alloc(T * H * 2);
      try {
        aw = b.device_alloc(T * K * 4);
      } catch (...) {
        b.device_free(ax);
        throw;
      }
      out.x = Mem{reinterpret_cast<void*>(uintptr_t(ax)), true};
      out.topk_weights = Mem{reinterpret_cast<void*>(uintptr_t(aw)), true};
    }
    try {
      ops::combine(c, handle, in, out);
    } catch (...) {
      if (alloc) b.device_free(ax), b.device_free(aw);
      throw;
    }
    scratch_u64_[kScratchAddresses + 6] = address_of(out.x.ptr);
    scratch_u64_[kScratchAddresses + 7] = address_of(out.topk_weights.ptr);
  });
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

// ---- cuda: device memory, streams, events, graphs, baselines ----

Napi::Value ContextWrap::DeviceAlloc(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t bytes = int_arg(info[0], "bytes", 0, int64_t(1) << 50);
  return big(env, guarded(env, [&] { return c.backend().device_alloc(bytes); }));
}

Napi::Value ContextWrap::DeviceFree(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!ctx_ || !ctx_->alive()) return env.Undefined();  // destroyed: everything is freed already
  const uint64_t p = address_arg(info[0], "ptr");
  guarded(env, [&] { ctx_->backend().device_free(p); });
  return env.Undefined();
}

Napi::Value ContextWrap::DeviceUpload(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const uint64_t p = address_arg(info[0], "ptr");
  if (!info[1].IsTypedArray()) throw_einval(env, "data must be a typed array");
  const auto ta = info[1].As<Napi::TypedArray>();
  guarded(env, [&] { c.backend().upload(p, bytes_of(ta), int64_t(ta.ByteLength())); });
  return env.Undefined();
}

Napi::Value ContextWrap::DeviceDownload(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const uint64_t p = address_arg(info[0], "ptr");
  const int64_t n = int_arg(info[1], "bytes", 0, int64_t(1) << 40);
  auto out = Napi::Uint8Array::New(env, size_t(n));
  guarded(env, [&] { c.backend().download(out.Data(), p, n); });
  return out;
}

Napi::Value ContextWrap::DeviceSync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  guarded(env, [&] { c.backend().sync(); });
  return env.Undefined();
}

Napi::Value ContextWrap::EventRecord(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  return big(env, guarded(env, [&] { return c.backend().record_event(); }));
}

Napi::Value ContextWrap::EventElapsed(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const uint64_t a = address_arg(info[0], "start"), b = address_arg(info[1], "end");
  return Napi::Number::New(env, guarded(env, [&] { return c.backend().elapsed_ms(a, b); }));
}

Napi::Value ContextWrap::EventDestroy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!ctx_ || !ctx_->alive()) return env.Undefined();
  const uint64_t e = address_arg(info[0], "event");
  guarded(env, [&] { ctx_->backend().destroy_event(e); });
  return env.Undefined();
}

Napi::Value ContextWrap::LastOpMs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  return Napi::Number::New(env, guarded(env, [&] { return c.backend().last_op_ms(); }));
}

// (bytes per rank, iters, warmup) -> ms per ncclAlltoAll (every rank calls it together)
Napi::Value ContextWrap::BenchAlltoAll(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t bytes = int_arg(info[0], "bytes", 1, int64_t(1) << 40);
  const int iters = int(int_arg(info[1], "iters", 1, 1 << 20)), warmup = int(int_arg(info[2], "warmup", 0, 1 << 20));
  return Napi::Number::New(env, guarded(env, [&] { return c.backend().bench_all_to_all(bytes, iters, warmup); }));
}

Napi::Value ContextWrap::BenchPeerCopy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const int64_t bytes = int_arg(info[0], "bytes", 1, int64_t(1) << 40);
  const int iters = int(int_arg(info[1], "iters", 1, 1 << 20)), warmup = int(int_arg(info[2], "warmup", 0, 1 << 20));
  return Napi::Number::New(env, guarded(env, [&] { return c.backend().bench_peer_copy(bytes, iters, warmup); }));
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
  return Napi::Number::New(env, guarded(env, [&] { return c.backend().bench_agrs(op, engine, bytes, iters); }));
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
  guarded(env, [&] { ctx_->backend().free_graph(g); });
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
  guarded(env, [&] { c.backend().occupy(sms, ms); });
  return env.Undefined();
}

}  // namespace rankflow::binding
