// ContextWrap: construction from the worker's config, the method table, lifecycle, and the probes of the window
// (info, readWindow, writePeer). The op methods are in context_collectives.cc, context_moe.cc and
// context_device.cc (see context.hpp).
#include "context.hpp"

#include <cstring>
#include <thread>

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
  c.graph_launch = bool_prop(o, "graphLaunch", true);
  c.fused_dispatch = bool_prop(o, "fusedDispatch", true);
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
  c.nccl_host_id = str_prop(o, "ncclHostId");
  c.first_seq = uint64_t(int_prop(o, "firstSeq", 0, 0, int64_t(1) << 53));
  return c;
}

}  // namespace

// The method table: each file's methods are listed beside their definitions (context.hpp).
Napi::Function ContextWrap::Define(Napi::Env env) {
  Methods m;
  lifecycle_methods(m);
  collective_methods(m);
  moe_methods(m);
  inflight_methods(m);
  device_methods(m);
  interop_methods(m);
  scaleout_methods(m);
  return DefineClass(env, "Context", m);
}

void ContextWrap::lifecycle_methods(Methods& m) {
  m.push_back(InstanceMethod<&ContextWrap::Exported>("exported"));
  m.push_back(InstanceMethod<&ContextWrap::ImportPeers>("importPeers"));
  m.push_back(InstanceMethod<&ContextWrap::NcclUniqueId>("ncclUniqueId"));
  m.push_back(InstanceMethod<&ContextWrap::NcclInit>("ncclInit"));
  m.push_back(InstanceMethod<&ContextWrap::Info>("info"));
  m.push_back(InstanceMethod<&ContextWrap::Seq>("seq"));
  m.push_back(InstanceMethod<&ContextWrap::SessionCount>("sessionCount"));
  m.push_back(InstanceMethod<&ContextWrap::Recover>("recover"));
  m.push_back(InstanceMethod<&ContextWrap::Remask>("remask"));
  m.push_back(InstanceMethod<&ContextWrap::Rejoin>("rejoin"));
  m.push_back(InstanceMethod<&ContextWrap::ReadWindow>("readWindow"));
  m.push_back(InstanceMethod<&ContextWrap::WritePeer>("writePeer"));
  m.push_back(InstanceMethod<&ContextWrap::Destroy>("destroy"));
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
    if (ta.TypedArrayType() != napi_int32_array || ta.ByteLength() < size_t(AbortWords::kBytes))
      throw_einval(env, "the abort words must be an Int32Array of at least " + std::to_string(AbortWords::kBytes) + " bytes");
    uint8_t* base = bytes_of(ta);
    constexpr uintptr_t kPage = 4096;
    const uintptr_t aligned = (reinterpret_cast<uintptr_t>(base) + kPage - 1) & ~(kPage - 1);
    if (ta.ByteLength() >= 2 * kPage) words_offset = int64_t(aligned - reinterpret_cast<uintptr_t>(base));
    if ((reinterpret_cast<uintptr_t>(base) + uintptr_t(words_offset)) % 8 != 0) throw_einval(env, "the abort words must be 8-byte aligned");
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
  // cuda: the rank's kernels stopped and its stream drained here; the rest of its teardown may wait
  // for the whole device, whose other ranks wait for this one until the main thread sees this worker
  // end: it goes on a thread of its own (it touches no JS object; the abort words are not read again).
  if (self->ctx_ && self->ctx_->quiesce()) {
    std::thread([c = std::move(self->ctx_)]() mutable {
      c->destroy();
      c.reset();
    }).detach();
  }
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
    g.Set("graphLaunches", double(b.graph_launches));
    g.Set("directLaunches", double(b.direct_launches));
    g.Set("fusedDispatches", double(b.fused_dispatches));
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

// The rank's sequence number now (the last collective's), as a Number: exact up to 2^53.
Napi::Value ContextWrap::Seq(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), double(ctx(info.Env()).seq));
}

// AGRS sessions opened so far (a run's recovery sets every rank's to the group's largest).
Napi::Value ContextWrap::SessionCount(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), double(ctx(info.Env()).session.index));
}

// recover(seq, sessionCount): after a run's release, the rank in step with the group (ops.hpp recover).
// Views of the session's buffer handed out are detached: the session they belong to is closed.
Napi::Value ContextWrap::Recover(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const uint64_t seq = uint64_t(int_arg(info[0], "seq", 0, int64_t(1) << 53));
  const uint32_t sessions = uint32_t(int_arg(info[1], "sessionCount", 0, UINT32_MAX));
  pending_.reset();
  detach_views(env);
  guarded(env, [&] { ops::recover(c, seq, sessions); });
  return env.Undefined();
}

// The live mask of an elastic group: a BigInt (bit p: rank p serves).
static uint64_t mask_arg(const Napi::Value& v) {
  bool lossless = false;
  const uint64_t m = v.IsBigInt() ? v.As<Napi::BigInt>().Uint64Value(&lossless) : 0;
  if (!lossless) throw_einval(v.Env(), "liveMask must be a BigInt of 64 bits at most");
  return m;
}

// remask(seq, sessionCount, liveMask, epoch): an elastic group goes on with the ranks of liveMask (ops.hpp remask).
Napi::Value ContextWrap::Remask(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  const uint64_t seq = uint64_t(int_arg(info[0], "seq", 0, int64_t(1) << 53));
  const uint32_t sessions = uint32_t(int_arg(info[1], "sessionCount", 0, UINT32_MAX));
  const uint64_t mask = mask_arg(info[2]);
  const uint64_t epoch = uint64_t(int_arg(info[3], "epoch", 0, int64_t(1) << 53));
  pending_.reset();
  detach_views(env);
  guarded(env, [&] { ops::remask(c, seq, sessions, mask, epoch); });
  return env.Undefined();
}

// rejoin(peers, segments, liveMask, epoch): the replacements of ranks `peers` (a rank, or an array of
// them, with one { deviceFd, hostFd } each) are mapped and join (ops.hpp rejoin).
Napi::Value ContextWrap::Rejoin(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Context& c = ctx(env);
  std::vector<int> peers;
  std::vector<ExportedSegments> segs;
  const auto segment = [&](const Napi::Value& v) {
    if (!v.IsObject()) throw_einval(env, "rejoin needs the replacements' exported segments");
    const auto o = v.As<Napi::Object>();
    segs.push_back({int(int_prop(o, "deviceFd", -1, -1, INT32_MAX)), int(int_prop(o, "hostFd", -1, -1, INT32_MAX))});
  };
  if (info[0].IsArray()) {
    const auto ranks = info[0].As<Napi::Array>();
    if (!info[1].IsArray() || info[1].As<Napi::Array>().Length() != ranks.Length() || ranks.Length() > 64)
      throw_einval(env, "rejoin: one exported segment per joining rank (at most 64 ranks)");
    const auto list = info[1].As<Napi::Array>();
    for (uint32_t i = 0; i < ranks.Length(); ++i) {
      peers.push_back(int(int_arg(ranks.Get(i), "peers[i]", 0, c.world() - 1)));
      segment(list.Get(i));
    }
  } else {
    peers.push_back(int(int_arg(info[0], "peer", 0, c.world() - 1)));
    segment(info[1]);
  }
  const uint64_t mask = mask_arg(info[2]);
  const uint64_t epoch = uint64_t(int_arg(info[3], "epoch", 0, int64_t(1) << 53));
  guarded(env, [&] { ops::rejoin(c, peers, segs, mask, epoch); });
  return env.Undefined();
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
  if (c.nodes.two_level() && !c.nodes.same_node(peer))
    throw_einval(env, "peer: rank " + std::to_string(peer) + " is on node " + std::to_string(c.nodes.node_of(peer)) +
                          " and rank " + std::to_string(c.rank()) + " on node " + std::to_string(c.nodes.node) +
                          ": nodes share no memory, so its window is not mapped here");
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

}  // namespace rankflow::binding
