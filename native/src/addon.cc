// The Node-API surface of the native core: `Context` (one per rank, owned by the rank's worker
// thread) whose operations run on the rank's executor thread and settle Promises, plus the pure
// functions `layout()` and `sizeHint()` that expose the layouts defined in layout.hpp.
#include <napi.h>

#include <unistd.h>

#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "context.hpp"
#include "executor.hpp"
#include "moe_device.hpp"
#include "ops/ops.hpp"

// Optional parts linked in when their sources are built (fd passing across processes, the CUDA backend).
void RegisterFdPass(Napi::Env env, Napi::Object exports) __attribute__((weak));
void RegisterCuda(Napi::Env env, Napi::Object exports) __attribute__((weak));

namespace rankflow {
namespace {

Napi::Error to_js_error(Napi::Env env, const std::string& code, const std::string& message, int rank,
                        const std::string& phase) {
  Napi::Error e = Napi::Error::New(env, message);
  e.Set("code", Napi::String::New(env, code));
  if (rank >= 0) e.Set("rank", Napi::Number::New(env, rank));
  if (!phase.empty()) e.Set("phase", Napi::String::New(env, phase));
  return e;
}

[[noreturn]] void throw_einval(Napi::Env env, const std::string& message) {
  throw to_js_error(env, "EINVAL", message, -1, "");
}

int64_t get_int(const Napi::Object& o, const char* key, int64_t fallback) {
  const Napi::Value v = o.Get(key);
  if (v.IsUndefined() || v.IsNull()) return fallback;
  if (!v.IsNumber()) throw_einval(o.Env(), std::string(key) + " must be a number");
  return v.As<Napi::Number>().Int64Value();
}
double get_double(const Napi::Object& o, const char* key, double fallback) {
  const Napi::Value v = o.Get(key);
  return v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : fallback;
}
bool get_bool(const Napi::Object& o, const char* key, bool fallback) {
  const Napi::Value v = o.Get(key);
  return v.IsBoolean() ? v.As<Napi::Boolean>().Value() : fallback;
}

// Data pointer of a typed array (or null for undefined/null), with its length checked in bytes.
template <typename T>
T* data_of(const Napi::Value& v, const char* name, int64_t expect_bytes = -1) {
  if (v.IsUndefined() || v.IsNull()) return nullptr;
  if (!v.IsTypedArray()) throw_einval(v.Env(), std::string(name) + " must be a typed array");
  const auto ta = v.As<Napi::TypedArray>();
  if (expect_bytes >= 0 && int64_t(ta.ByteLength()) != expect_bytes)
    throw_einval(v.Env(), std::string(name) + " has " + std::to_string(ta.ByteLength()) + " bytes, expected " +
                              std::to_string(expect_bytes));
  // An empty array is still given (V8 may back it with no memory): never confuse it with an absent one.
  alignas(16) static uint8_t empty[16];
  if (ta.ByteLength() == 0) return reinterpret_cast<T*>(empty);
  return reinterpret_cast<T*>(static_cast<uint8_t*>(ta.ArrayBuffer().Data()) + ta.ByteOffset());
}

// A device address (BigInt) of a cuda rank program's tensor, or null for undefined/null/0n.
template <typename T>
T* ptr_of(const Napi::Value& v, const char* name) {
  if (v.IsUndefined() || v.IsNull()) return nullptr;
  if (!v.IsBigInt()) throw_einval(v.Env(), std::string(name) + " must be a device tensor's address (BigInt)");
  bool lossless = true;
  return reinterpret_cast<T*>(uintptr_t(v.As<Napi::BigInt>().Uint64Value(&lossless)));
}

EpConfig ep_from(const Napi::Object& o, int world) {
  EpConfig c;
  c.world_size = world;
  c.max_tokens_per_rank = get_int(o, "maxTokensPerRank", 0);
  c.hidden = get_int(o, "hidden", 0);
  c.topk = get_int(o, "topk", 0);
  c.num_experts = get_int(o, "numExperts", 0);
  c.fp8 = get_bool(o, "fp8Dispatch", false);
  return c;
}

// One asynchronous call: work on the executor, then `finish` on the JS thread. JS values the work
// reads or writes are pinned by references until the call settles. Every call of a Context settles
// through the Context's one thread-safe function (its Hub), ref'd while calls are pending and unref'd
// when idle so that an idle worker can exit; a call may also report progress (`emit(stage)`) to a JS
// callback without waiting for JS: deliveries are FIFO, so every stage arrives before the settle.
struct Call;
struct Hub;
struct Delivery {
  Call* call;
  int stage;  // < 0: the call settles
};
void deliver(Napi::Env env, Napi::Function, Hub* hub, Delivery* d);
using Tsfn = Napi::TypedThreadSafeFunction<Hub, Delivery, deliver>;

struct Hub {
  Tsfn tsfn;
  int64_t pending = 0;    // calls not yet settled (JS thread only)
  bool released = false;  // the Context is torn down: no Ref/Unref any more
};

struct Call {
  Call(Napi::Env env, Hub* h) : deferred(Napi::Promise::Deferred::New(env)), hub(h), settle{this, -1} {}
  Napi::Promise::Deferred deferred;
  std::vector<Napi::Reference<Napi::Value>> keep;
  Napi::FunctionReference progress;  // progress(stage), if the call reports any
  std::function<void()> work;
  std::function<void(Call&)> staged;  // instead of work: a job that reports stages (emit)
  std::function<Napi::Value(Napi::Env, Call&)> finish;
  std::optional<Error> error;
  Hub* hub;
  Delivery settle;
  // Executor thread: reports a stage to the JS callback without blocking (dropped if JS is closing).
  void emit(int stage) {
    auto* d = new Delivery{this, stage};
    if (hub->tsfn.NonBlockingCall(d) != napi_ok) delete d;
  }
};

void settle_call(Napi::Env env, Call* call) {
  if (env != nullptr) {
    // A worker being terminated (rank.terminate(), destroy()) refuses to run JS: every N-API call then
    // fails and node-addon-api throws. Nobody awaits this promise any more, and an exception escaping
    // this callback would abort the whole process.
    try {
      if (call->error) {
        call->deferred.Reject(to_js_error(env, call->error->code, call->error->what(), call->error->rank, call->error->phase).Value());
      } else {
        try {
          call->deferred.Resolve(call->finish ? call->finish(env, *call) : env.Undefined());
        } catch (const Napi::Error& e) {
          call->deferred.Reject(e.Value());
        }
      }
    } catch (const Napi::Error&) {
    }
    Hub* hub = call->hub;
    if (--hub->pending == 0 && !hub->released) hub->tsfn.Unref(env);
  } else {
    for (auto& r : call->keep) r.SuppressDestruct();  // the environment is gone: nothing to unref
    call->progress.SuppressDestruct();
  }
  delete call;
}

void deliver(Napi::Env env, Napi::Function, Hub*, Delivery* d) {
  if (d->stage < 0) return settle_call(env, d->call);
  const int stage = d->stage;
  Call* call = d->call;
  delete d;
  if (env == nullptr || call->progress.IsEmpty()) return;  // torn down: the call's settle frees it
  try {
    call->progress.Call({Napi::Number::New(env, stage)});
  } catch (const Napi::Error&) {
  }
}

// Runs f on the executor thread and waits for it: CUDA work of a rank happens on that thread only.
template <typename F>
auto run_on(Executor& ex, F f) -> decltype(f()) {
  std::packaged_task<decltype(f())()> task(std::move(f));
  auto result = task.get_future();
  ex.post([&task] { task(); });
  return result.get();
}

// Operations that produce a typed array pin it last and settle with it.
Napi::Value resolve_with_output(Napi::Env, Call& call) { return call.keep.back().Value(); }

class ContextWrap : public Napi::ObjectWrap<ContextWrap> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "Context",
                       {
                           InstanceMethod<&ContextWrap::Exported>("exported"),
                           InstanceMethod<&ContextWrap::ImportPeers>("importPeers"),
                           InstanceMethod<&ContextWrap::NcclUniqueId>("ncclUniqueId"),
                           InstanceMethod<&ContextWrap::NcclInit>("ncclInit"),
                           InstanceMethod<&ContextWrap::Info>("info"),
                           InstanceMethod<&ContextWrap::WritePeer>("writePeer"),
                           InstanceMethod<&ContextWrap::ReadWindow>("readWindow"),
                           InstanceMethod<&ContextWrap::FailPeer>("failPeer"),
                           InstanceMethod<&ContextWrap::Destroy>("destroy"),
                           InstanceMethod<&ContextWrap::Barrier>("barrier"),
                           InstanceMethod<&ContextWrap::AllGather>("allGather"),
                           InstanceMethod<&ContextWrap::DispatchNotify>("dispatchNotify"),
                           InstanceMethod<&ContextWrap::DispatchWait>("dispatchWait"),
                           InstanceMethod<&ContextWrap::DispatchData>("dispatchData"),
                           InstanceMethod<&ContextWrap::DispatchAbandon>("dispatchAbandon"),
                           InstanceMethod<&ContextWrap::DispatchRun>("dispatchRun"),
                           InstanceMethod<&ContextWrap::BarrierRun>("barrierRun"),
                           InstanceMethod<&ContextWrap::Combine>("combine"),
                           InstanceMethod<&ContextWrap::SessionOpen>("sessionOpen"),
                           InstanceMethod<&ContextWrap::SessionClose>("sessionClose"),
                           InstanceMethod<&ContextWrap::SessionAllGather>("sessionAllGather"),
                           InstanceMethod<&ContextWrap::SessionReduceScatter>("sessionReduceScatter"),
                           InstanceMethod<&ContextWrap::EngramWrite>("engramWrite"),
                           InstanceMethod<&ContextWrap::EngramFetch>("engramFetch"),
                           InstanceMethod<&ContextWrap::PpExchange>("ppExchange"),
                           InstanceMethod<&ContextWrap::BenchAgrs>("benchAgrs"),
                           // cuda rank programs: device tensors, stream sync, events, baselines
                           InstanceMethod<&ContextWrap::DeviceAlloc>("deviceAlloc"),
                           InstanceMethod<&ContextWrap::DeviceFree>("deviceFree"),
                           InstanceMethod<&ContextWrap::DeviceUpload>("deviceUpload"),
                           InstanceMethod<&ContextWrap::DeviceDownload>("deviceDownload"),
                           InstanceMethod<&ContextWrap::DeviceSync>("deviceSync"),
                           InstanceMethod<&ContextWrap::EventRecord>("eventRecord"),
                           InstanceMethod<&ContextWrap::EventElapsed>("eventElapsed"),
                           InstanceMethod<&ContextWrap::EventDestroy>("eventDestroy"),
                           InstanceMethod<&ContextWrap::BenchAlltoAll>("benchAlltoAll"),
                           InstanceMethod<&ContextWrap::BenchPeerCopy>("benchPeerCopy"),
                           InstanceMethod<&ContextWrap::LastOpMs>("lastOpMs"),
                       });
  }

  explicit ContextWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ContextWrap>(info) {
    Napi::Env env = info.Env();
    if (!info[0].IsObject()) throw_einval(env, "Context needs a config object");
    const Napi::Object o = info[0].As<Napi::Object>();
    ContextConfig cfg;
    const Napi::Value backend = o.Get("backend");
    if (!backend.IsUndefined() && !(backend.IsString() && (backend.As<Napi::String>().Utf8Value() == "host" ||
                                                           backend.As<Napi::String>().Utf8Value() == "cuda")))
      throw_einval(env, "backend must be 'host' or 'cuda'");
    cfg.backend = backend.IsString() && backend.As<Napi::String>().Utf8Value() == "cuda" ? Backend::Cuda : Backend::Host;
    cfg.device = int(get_int(o, "device", -1));
    cfg.rank = int(get_int(o, "rank", 0));
    cfg.world_size = int(get_int(o, "worldSize", 1));
    cfg.ranks_per_node = int(get_int(o, "ranksPerNode", 0));
    cfg.ep = ep_from(o, cfg.world_size);
    cfg.num_bytes = get_int(o, "bytes", 0);
    cfg.cpu_bytes = get_int(o, "cpuBytes", 0);
    cfg.hybrid = get_bool(o, "hybrid", true);
    cfg.cpu_timeout_s = get_double(o, "cpuSeconds", 300);
    cfg.gpu_timeout_s = get_double(o, "gpuSeconds", 100);
    // On cuda the executor spins briefly for the next job (a rank program's next op follows soon).
    executor_ = std::make_unique<Executor>(cfg.backend == Backend::Cuda ? 50 : 0);
    try {
      // On cuda the context is built on the executor thread: the rank's CUDA context is current there.
      if (cfg.backend == Backend::Cuda) ctx_ = run_on(*executor_, [&cfg] { return std::make_unique<Context>(cfg); });
      else ctx_ = std::make_unique<Context>(cfg);
    } catch (const Error& e) {
      executor_->stop();
      throw to_js_error(env, e.code, e.what(), e.rank, e.phase);
    } catch (const std::exception& e) {
      executor_->stop();
      throw to_js_error(env, "BACKEND_UNAVAILABLE", e.what(), -1, "");
    }
    // The Context's one thread-safe function, created before the cleanup hook below so that the hook
    // (which drains the executor into it) runs before Node tears the function down.
    hub_ = new Hub();
    hub_->tsfn = Tsfn::New(env, "rankflow-op", 0, 1, hub_, [](Napi::Env, void*, Hub* hub) { delete hub; });
    hub_->tsfn.Unref(env);
    // A terminated worker never calls destroy(): stop the executor and unmap when its env goes away.
    env_ = env;
    napi_add_env_cleanup_hook(env, OnEnvCleanup, this);
  }
  ~ContextWrap() override {
    if (!cleanup_ran_) napi_remove_env_cleanup_hook(env_, OnEnvCleanup, this);
    teardown();
  }

 private:
  void teardown() {
    if (ctx_) {
      ctx_->abort.stopping = true;
      if (ctx_->on_cuda()) {
        Context* c = ctx_.get();
        executor_->post([c] { c->destroy(); });  // CUDA and NCCL teardown on the rank's thread
      }
      executor_->stop();  // queued calls settle into the hub first
      ctx_.reset();
    }
    if (hub_ != nullptr) {
      // Calls still queued are delivered (or dropped at env teardown); the finalizer frees the hub.
      hub_->released = true;
      hub_->tsfn.Release();
      hub_ = nullptr;
    }
  }
  Context& ctx(Napi::Env env) {
    if (!ctx_) throw to_js_error(env, "STATE", "the rank's context is destroyed", -1, "");
    return *ctx_;
  }
  // A synchronous call into the rank's GPU side, on its executor thread.
  template <typename F>
  auto on_device(Napi::Env env, F f) -> decltype(f()) {
    try {
      return run_on(*executor_, std::move(f));
    } catch (const Error& e) {
      throw to_js_error(env, e.code, e.what(), e.rank, e.phase);
    }
  }

  // Schedules `work` on the executor; the returned Promise settles with `finish(env, call)`.
  Napi::Value schedule(Napi::Env env, std::vector<Napi::Value> pinned, std::function<void()> work,
                       std::function<Napi::Value(Napi::Env, Call&)> finish = nullptr) {
    return schedule_call(env, std::move(pinned), std::move(work), nullptr, std::move(finish), Napi::Value());
  }
  // One job that runs several phases back to back and reports each finished one to `progress(stage)`
  // (a JS function) without waiting for JS: the GPU work never waits on the rank machine.
  Napi::Value schedule_staged(Napi::Env env, std::vector<Napi::Value> pinned, Napi::Value progress,
                              std::function<void(Call&)> staged,
                              std::function<Napi::Value(Napi::Env, Call&)> finish = nullptr) {
    return schedule_call(env, std::move(pinned), nullptr, std::move(staged), std::move(finish), progress);
  }
  Napi::Value schedule_call(Napi::Env env, std::vector<Napi::Value> pinned, std::function<void()> work,
                            std::function<void(Call&)> staged, std::function<Napi::Value(Napi::Env, Call&)> finish,
                            Napi::Value progress) {
    ctx(env);
    auto* call = new Call(env, hub_);
    for (const auto& v : pinned)
      if (!v.IsUndefined() && !v.IsNull()) call->keep.push_back(Napi::Persistent(v));
    if (!progress.IsEmpty() && progress.IsFunction()) call->progress = Napi::Persistent(progress.As<Napi::Function>());
    call->work = std::move(work);
    call->staged = std::move(staged);
    call->finish = std::move(finish);
    Napi::Promise promise = call->deferred.Promise();
    if (hub_->pending++ == 0) hub_->tsfn.Ref(env);
    Hub* hub = hub_;
    executor_->post([call, hub] {
      try {
        if (call->staged) call->staged(*call);
        else call->work();
      } catch (const Error& e) {
        call->error = e;
      } catch (const std::exception& e) {
        call->error = Error("EINVAL", e.what());
      }
      if (hub->tsfn.BlockingCall(&call->settle) != napi_ok) {
        for (auto& r : call->keep) r.SuppressDestruct();
        call->progress.SuppressDestruct();
        delete call;  // the environment is closing; nobody waits for this promise any more
      }
    });
    return promise;
  }

  Napi::Value Exported(const Napi::CallbackInfo& info) {
    const Context& c = ctx(info.Env());
    const auto e = c.on_cuda() ? c.device->exported() : c.mem.exported();
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("deviceFd", e.device_fd);
    o.Set("hostFd", e.host_fd);
    o.Set("pid", Napi::Number::New(info.Env(), getpid()));
    return o;
  }

  Napi::Value ImportPeers(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    if (!info[0].IsArray()) throw_einval(env, "importPeers needs an array of exported segments");
    const auto arr = info[0].As<Napi::Array>();
    std::vector<ExportedSegments> peers(arr.Length());
    for (uint32_t i = 0; i < arr.Length(); ++i) {
      const auto o = arr.Get(i).As<Napi::Object>();
      peers[i] = {int(get_int(o, "deviceFd", -1)), int(get_int(o, "hostFd", -1))};
    }
    return schedule(env, {}, [&c, peers] {
      if (c.on_cuda()) return c.device->import_peers(peers);  // + NCCL window and a barrier
      c.mem.import_peers(peers);
      ops::barrier(c, false);  // every window is mapped before anyone writes into one
    });
  }

  // Rank 0's NCCL unique id (128 bytes), or null where NCCL is unavailable or on host.
  Napi::Value NcclUniqueId(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    auto id = std::make_shared<std::vector<uint8_t>>();
    return schedule(env, {}, [&c, id] { if (c.on_cuda()) *id = c.device->nccl_unique_id(); },
                    [id](Napi::Env e, Call&) -> Napi::Value {
                      if (id->empty()) return e.Null();
                      auto out = Napi::Uint8Array::New(e, id->size());
                      std::memcpy(out.Data(), id->data(), id->size());
                      return out;
                    });
  }

  // ncclCommInitRank with rank 0's id; every rank of the group calls it at the same time.
  Napi::Value NcclInit(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    if (!info[0].IsTypedArray()) throw_einval(env, "ncclInit needs rank 0's unique id (a Uint8Array)");
    const auto in = info[0].As<Napi::Uint8Array>();
    std::vector<uint8_t> id(in.Data(), in.Data() + in.ByteLength());
    if (!c.on_cuda()) throw_einval(env, "ncclInit: this rank runs on the host backend");
    return schedule(env, {}, [&c, id] { c.device->nccl_init(id); });
  }

  Napi::Value Info(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    const Context& c = ctx(env);
    Napi::Object o = Napi::Object::New(env);
    o.Set("rank", c.rank());
    o.Set("worldSize", c.world());
    o.Set("backend", c.on_cuda() ? "cuda" : "host");
    o.Set("memoryKind", c.on_cuda() ? c.device->memory_kind() : memory_kind_name(c.mem.kind()));
    o.Set("symmetricBytes", Napi::Number::New(env, double(c.sym_bytes)));
    o.Set("workspaceBytes", Napi::Number::New(env, double(c.ws.bytes)));
    o.Set("bufferBytes", Napi::Number::New(env, double(c.buffer_bytes())));
    o.Set("cpuBytes", Napi::Number::New(env, double(c.cpu_bytes)));
    o.Set("seq", Napi::Number::New(env, c.seq));
    auto window_of = [&c](int p) {
      return c.on_cuda() ? c.device->window(p) : uint64_t(reinterpret_cast<uintptr_t>(c.mem.peer_window(p)));
    };
    o.Set("stride", Napi::Number::New(env, double(c.on_cuda() ? c.device->stride() : c.mem.stride())));
    o.Set("window", Napi::BigInt::New(env, window_of(c.rank())));
    Napi::Array peers = Napi::Array::New(env, size_t(c.world()));
    for (int p = 0; p < c.world(); ++p) peers.Set(uint32_t(p), Napi::BigInt::New(env, window_of(p)));
    if (c.on_cuda()) {
      Napi::Object g = Napi::Object::New(env);
      g.Set("ordinal", c.device->device_ordinal());
      g.Set("name", c.device->device_name());
      g.Set("nccl", c.device->has_nccl());
      o.Set("device", g);
    }
    o.Set("peerWindows", peers);
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

  // Writes bytes at `offset` of `peer`'s window through this rank's translated pointer.
  Napi::Value WritePeer(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    const int peer = info[0].As<Napi::Number>().Int32Value();
    const int64_t offset = info[1].As<Napi::Number>().Int64Value();
    const auto bytes = info[2].As<Napi::Uint8Array>();
    const int64_t window_bytes = c.on_cuda() ? c.device->stride() : c.mem.stride();
    if (peer < 0 || peer >= c.world()) throw_einval(env, "peer out of range");
    if (offset < 0 || offset + int64_t(bytes.ByteLength()) > window_bytes) throw_einval(env, "offset outside the window");
    if (c.on_cuda()) {
      const uint8_t* src = bytes.Data();
      const int64_t n = int64_t(bytes.ByteLength());
      return Napi::BigInt::New(env, on_device(env, [&c, peer, offset, src, n] { return c.device->write_peer(peer, offset, src, n); }));
    }
    uint8_t* dst = c.mem.translate(c.mem.window() + offset, peer);
    std::memcpy(dst, bytes.Data(), bytes.ByteLength());
    return Napi::BigInt::New(env, uint64_t(reinterpret_cast<uintptr_t>(dst)));
  }

  Napi::Value ReadWindow(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    const int64_t offset = info[0].As<Napi::Number>().Int64Value();
    const int64_t len = info[1].As<Napi::Number>().Int64Value();
    if (offset < 0 || len < 0 || offset + len > (c.on_cuda() ? c.device->stride() : c.mem.stride()))
      throw_einval(env, "range outside the window");
    auto out = Napi::Uint8Array::New(env, size_t(len));
    if (c.on_cuda()) {
      uint8_t* dst = out.Data();
      on_device(env, [&c, offset, len, dst] { c.device->read_window(offset, len, dst); });
      return out;
    }
    std::memcpy(out.Data(), c.mem.window() + offset, size_t(len));
    return out;
  }

  Napi::Value FailPeer(const Napi::CallbackInfo& info) {
    if (ctx_) ctx_->abort.failed_rank = info[0].As<Napi::Number>().Int32Value();
    return info.Env().Undefined();
  }

  Napi::Value Destroy(const Napi::CallbackInfo& info) {
    teardown();
    return info.Env().Undefined();
  }

  Napi::Value Barrier(const Napi::CallbackInfo& info) {
    Context& c = ctx(info.Env());
    const bool cpu = info[0].ToBoolean().Value();
    return schedule(info.Env(), {}, [&c, cpu] { ops::barrier(c, cpu); });
  }

  // (Uint8Array in) -> Promise<Uint8Array>: the ops that move bytes and return bytes (the world's
  // concatenation when `gathered`, else the same size).
  Napi::Value bytes_op(const Napi::CallbackInfo& info, bool gathered, void (*op)(Context&, const uint8_t*, int64_t, uint8_t*)) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    const auto in = info[0].As<Napi::Uint8Array>();
    auto out = Napi::Uint8Array::New(env, in.ByteLength() * (gathered ? size_t(c.world()) : 1));
    const uint8_t* src = in.Data();
    uint8_t* dst = out.Data();
    const int64_t n = int64_t(in.ByteLength());
    return schedule(env, {in, out}, [&c, op, src, n, dst] { op(c, src, n, dst); }, resolve_with_output);
  }

  Napi::Value AllGather(const Napi::CallbackInfo& info) { return bytes_op(info, /*gathered=*/true, ops::all_gather); }

  ops::DispatchInput dispatch_input(const Napi::Object& o) {
    const Context& c = *ctx_;
    ops::DispatchInput in;
    in.num_tokens = get_int(o, "numTokens", 0);
    in.x_elem_bytes = get_int(o, "xElemBytes", 2);
    in.expert_alignment = get_int(o, "expertAlignment", 1);
    in.cached_handle = uint32_t(get_int(o, "handle", 0));
    in.device = get_bool(o, "device", false);
    in.num_sms = int(get_int(o, "numSms", 0));
    const int64_t T = in.num_tokens, K = c.cfg.ep.topk, H = c.cfg.ep.hidden;
    if (in.device) {  // device addresses (BigInt) of a cuda rank program's tensors; shapes checked in JS
      in.x = ptr_of<uint8_t>(o.Get("x"), "x");
      in.scales = ptr_of<float>(o.Get("scales"), "scales");
      in.topk_idx = ptr_of<int32_t>(o.Get("topkIdx"), "topkIdx");
      in.topk_weights = ptr_of<float>(o.Get("topkWeights"), "topkWeights");
      if (in.topk_idx == nullptr && in.cached_handle == 0 && T > 0) throw_einval(o.Env(), "topkIdx is required without a handle");
      return in;
    }
    in.x = data_of<uint8_t>(o.Get("x"), "x", T * H * in.x_elem_bytes);
    in.scales = data_of<float>(o.Get("scales"), "scales", T * c.buf.scales_per_token * 4);
    in.topk_idx = data_of<int32_t>(o.Get("topkIdx"), "topkIdx", T * K * 4);
    in.topk_weights = data_of<float>(o.Get("topkWeights"), "topkWeights", T * K * 4);
    if (in.topk_idx == nullptr && in.cached_handle == 0) throw_einval(o.Env(), "topkIdx is required without a handle");
    return in;
  }

  Napi::Value DispatchNotify(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    if (!c.on_cuda() && get_bool(info[0].As<Napi::Object>(), "device", false)) throw_einval(env, "device tensors need backend 'cuda'");
    const auto o = info[0].As<Napi::Object>();
    const ops::DispatchInput in = dispatch_input(o);
    auto id = std::make_shared<uint32_t>(0);
    return schedule(env, {o}, [&c, in, id] { *id = ops::dispatch_notify(c, in); },
                    [id](Napi::Env e, Call&) { return Napi::Number::New(e, *id); });
  }

  Napi::Value DispatchWait(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    const uint32_t id = info[0].As<Napi::Number>().Uint32Value();
    auto counts = std::make_shared<ops::DispatchCounts>();
    return schedule(env, {}, [&c, id, counts] { *counts = ops::dispatch_wait(c, id); },
                    [counts](Napi::Env e, Call&) {
                      Napi::Object o = Napi::Object::New(e);
                      o.Set("numRecv", Napi::Number::New(e, double(counts->num_recv)));
                      Napi::Array tpe = Napi::Array::New(e, counts->tokens_per_expert.size());
                      for (size_t i = 0; i < counts->tokens_per_expert.size(); ++i)
                        tpe.Set(uint32_t(i), Napi::Number::New(e, double(counts->tokens_per_expert[i])));
                      o.Set("tokensPerExpert", tpe);
                      return o;
                    });
  }

  Napi::Value DispatchData(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    const uint32_t id = info[0].As<Napi::Number>().Uint32Value();
    const auto o = info[1].As<Napi::Object>();
    const auto outs = info[2].As<Napi::Object>();
    const ops::DispatchInput in = dispatch_input(o);
    const auto layout = c.layout(id);
    if (!layout) throw_einval(env, "dispatch layout is unknown");
    if (in.device) {
      // cuda rank programs: outputs at the given device addresses, or left in the buffer (their
      // addresses settle the promise).
      if (!c.on_cuda()) throw_einval(env, "device tensors need backend 'cuda'");
      auto out = std::make_shared<ops::DispatchOutput>();
      out->in_buffer = get_bool(outs, "inBuffer", false);
      if (!out->in_buffer) {
        out->x = ptr_of<uint8_t>(outs.Get("x"), "out.x");
        out->scales = ptr_of<float>(outs.Get("scales"), "out.scales");
        out->topk_idx = ptr_of<int32_t>(outs.Get("topkIdx"), "out.topkIdx");
        out->topk_weights = ptr_of<float>(outs.Get("topkWeights"), "out.topkWeights");
        out->src_rank = ptr_of<int32_t>(outs.Get("srcRank"), "out.srcRank");
        out->src_token = ptr_of<int32_t>(outs.Get("srcToken"), "out.srcToken");
      }
      return schedule(env, {o, outs}, [&c, id, in, out] { c.device->moe()->dispatch_data(id, in, *out); },
                      [out](Napi::Env e, Call&) -> Napi::Value {
                        if (!out->in_buffer) return e.Undefined();
                        Napi::Object r = Napi::Object::New(e);
                        auto big = [&e](const void* p) { return Napi::BigInt::New(e, uint64_t(reinterpret_cast<uintptr_t>(p))); };
                        r.Set("x", big(out->x));
                        if (out->scales != nullptr) r.Set("scales", big(out->scales));
                        r.Set("topkIdx", big(out->topk_idx));
                        r.Set("topkWeights", big(out->topk_weights));
                        r.Set("srcRank", big(out->src_rank));
                        r.Set("srcToken", big(out->src_token));
                        return r;
                      });
    }
    const int64_t R = layout->num_recv, K = c.cfg.ep.topk, H = c.cfg.ep.hidden;
    ops::DispatchOutput out;
    out.x = data_of<uint8_t>(outs.Get("x"), "out.x", R * H * in.x_elem_bytes);
    out.scales = data_of<float>(outs.Get("scales"), "out.scales", R * c.buf.scales_per_token * 4);
    out.topk_idx = data_of<int32_t>(outs.Get("topkIdx"), "out.topkIdx", R * K * 4);
    out.topk_weights = data_of<float>(outs.Get("topkWeights"), "out.topkWeights", R * K * 4);
    out.src_rank = data_of<int32_t>(outs.Get("srcRank"), "out.srcRank", R * 4);
    out.src_token = data_of<int32_t>(outs.Get("srcToken"), "out.srcToken", R * 4);
    if (in.scales != nullptr && out.scales == nullptr) throw_einval(env, "out.scales is required for fp8 dispatch");
    return schedule(env, {o, outs}, [&c, id, in, out] { ops::dispatch_data(c, id, in, out); });
  }

  // cuda rank programs, the fast path: (device input, { alloc }, progress) -> one executor job that runs
  // notify, the CPU-sync wait (alloc: outputs of numRecv rows allocated here from the rank's device
  // pool) or none (outputs left in the buffer), and data back to back, reporting stage 0 (notified)
  // and 1 (counts ready) on the way; settles with the layout id, the outputs' addresses and the counts.
  Napi::Value DispatchRun(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = cuda_ctx(env, "a device-tensor dispatch");
    const auto o = info[0].As<Napi::Object>();
    const ops::DispatchInput in = dispatch_input(o);
    if (!in.device) throw_einval(env, "dispatchRun takes device tensors");
    const bool alloc = get_bool(info[1].As<Napi::Object>(), "alloc", false);
    struct Result {
      uint32_t id = 0;
      ops::DispatchOutput out;
      std::optional<ops::DispatchCounts> counts;
    };
    auto r = std::make_shared<Result>();
    return schedule_staged(
        env, {o}, info[2],
        [&c, in, alloc, r](Call& call) {
          r->id = ops::dispatch_notify(c, in);
          call.emit(0);
          if (alloc) r->counts = ops::dispatch_wait(c, r->id);
          call.emit(1);
          MoeDevice* m = c.device->moe();
          ops::DispatchOutput& out = r->out;
          std::vector<uint64_t> owned;
          try {
            if (alloc) {
              const int64_t R = r->counts->num_recv, K = c.cfg.ep.topk, H = c.cfg.ep.hidden;
              auto take = [&](int64_t bytes) {
                owned.push_back(m->alloc(bytes));
                return reinterpret_cast<void*>(uintptr_t(owned.back()));
              };
              out.x = static_cast<uint8_t*>(take(R * H * in.x_elem_bytes));
              if (in.scales != nullptr) out.scales = static_cast<float*>(take(R * (H / 128) * 4));
              out.topk_idx = static_cast<int32_t*>(take(R * K * 4));
              out.topk_weights = static_cast<float*>(take(R * K * 4));
              out.src_rank = static_cast<int32_t*>(take(R * 4));
              out.src_token = static_cast<int32_t*>(take(R * 4));
            } else {
              out.in_buffer = true;
            }
            m->dispatch_data(r->id, in, out);
          } catch (...) {
            for (const uint64_t p : owned) m->free(p);
            throw;
          }
        },
        [r](Napi::Env e, Call&) -> Napi::Value {
          Napi::Object o = Napi::Object::New(e);
          auto big = [&e](const void* p) { return Napi::BigInt::New(e, uint64_t(reinterpret_cast<uintptr_t>(p))); };
          o.Set("id", Napi::Number::New(e, r->id));
          o.Set("x", big(r->out.x));
          if (r->out.scales != nullptr) o.Set("scales", big(r->out.scales));
          o.Set("topkIdx", big(r->out.topk_idx));
          o.Set("topkWeights", big(r->out.topk_weights));
          o.Set("srcRank", big(r->out.src_rank));
          o.Set("srcToken", big(r->out.src_token));
          if (r->counts) {
            o.Set("numRecv", Napi::Number::New(e, double(r->counts->num_recv)));
            Napi::Array tpe = Napi::Array::New(e, r->counts->tokens_per_expert.size());
            for (size_t i = 0; i < r->counts->tokens_per_expert.size(); ++i)
              tpe.Set(uint32_t(i), Napi::Number::New(e, double(r->counts->tokens_per_expert[i])));
            o.Set("tokensPerExpert", tpe);
          }
          return o;
        });
  }

  // A barrier with its CPU-sync round in one job: stage 0 reports the device round's end.
  Napi::Value BarrierRun(const Napi::CallbackInfo& info) {
    Context& c = ctx(info.Env());
    const bool cpu = info[0].ToBoolean().Value();
    return schedule_staged(info.Env(), {}, info[1], [&c, cpu](Call& call) {
      ops::barrier(c, false);
      call.emit(0);
      if (cpu) ops::barrier(c, true);
    });
  }

  Napi::Value DispatchAbandon(const Napi::CallbackInfo& info) {
    if (ctx_) ops::dispatch_abandon(*ctx_, info[0].As<Napi::Number>().Uint32Value());
    return info.Env().Undefined();
  }

  Napi::Value Combine(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    const auto o = info[0].As<Napi::Object>();
    const auto outs = info[1].As<Napi::Object>();
    ops::CombineInput in;
    in.handle = uint32_t(get_int(o, "handle", 0));
    const auto layout = c.layout(in.handle);
    if (!layout || !layout->complete) throw_einval(env, "handle is unknown or expired on this rank");
    in.device = get_bool(o, "device", false);
    in.num_sms = int(get_int(o, "numSms", 0));
    if (in.device) {  // cuda rank programs: device addresses; shapes checked in JS
      if (!c.on_cuda()) throw_einval(env, "device tensors need backend 'cuda'");
      in.x = ptr_of<uint16_t>(o.Get("x"), "x");
      in.topk_weights = ptr_of<float>(o.Get("topkWeights"), "topkWeights");
      in.bias[0] = ptr_of<uint16_t>(o.Get("bias0"), "bias[0]");
      in.bias[1] = ptr_of<uint16_t>(o.Get("bias1"), "bias[1]");
      if (get_bool(outs, "alloc", false)) {
        // The fast path: the outputs [T, hidden] bf16 and [T, topk] fp32 allocated in the same job from
        // the rank's device pool (no synchronous round trips); settles with their addresses.
        const int64_t T = layout->num_tokens, K = c.cfg.ep.topk, H = c.cfg.ep.hidden;
        auto at = std::make_shared<std::pair<uint64_t, uint64_t>>(0, 0);
        return schedule(env, {o}, [&c, in, T, K, H, at] {
          MoeDevice* m = c.device->moe();
          at->first = m->alloc(T * H * 2);
          try {
            at->second = m->alloc(T * K * 4);
            ops::combine(c, in, reinterpret_cast<uint16_t*>(uintptr_t(at->first)), reinterpret_cast<float*>(uintptr_t(at->second)));
          } catch (...) {
            m->free(at->first);
            if (at->second != 0) m->free(at->second);
            throw;
          }
        }, [at](Napi::Env e, Call&) -> Napi::Value {
          Napi::Object r = Napi::Object::New(e);
          r.Set("x", Napi::BigInt::New(e, at->first));
          r.Set("topkWeights", Napi::BigInt::New(e, at->second));
          return r;
        });
      }
      auto* out_x = ptr_of<uint16_t>(outs.Get("x"), "out.x");
      auto* out_w = ptr_of<float>(outs.Get("topkWeights"), "out.topkWeights");
      return schedule(env, {o, outs}, [&c, in, out_x, out_w] { ops::combine(c, in, out_x, out_w); });
    }
    const int64_t R = layout->num_recv, T = layout->num_tokens, K = c.cfg.ep.topk, H = c.cfg.ep.hidden;
    in.x = data_of<uint16_t>(o.Get("x"), "x", R * H * 2);
    in.topk_weights = data_of<float>(o.Get("topkWeights"), "topkWeights", R * K * 4);
    in.bias[0] = data_of<uint16_t>(o.Get("bias0"), "bias[0]", T * H * 2);
    in.bias[1] = data_of<uint16_t>(o.Get("bias1"), "bias[1]", T * H * 2);
    auto* out_x = data_of<uint16_t>(outs.Get("x"), "out.x", T * H * 2);
    auto* out_w = data_of<float>(outs.Get("topkWeights"), "out.topkWeights", T * K * 4);
    return schedule(env, {o, outs}, [&c, in, out_x, out_w] { ops::combine(c, in, out_x, out_w); });
  }

  Napi::Value SessionOpen(const Napi::CallbackInfo& info) {
    Context& c = ctx(info.Env());
    const int64_t max_bytes = info[0].As<Napi::Number>().Int64Value();
    const int64_t max_ag = info[1].As<Napi::Number>().Int64Value();
    return schedule(info.Env(), {}, [&c, max_bytes, max_ag] { ops::session_open(c, max_bytes, max_ag); });
  }

  Napi::Value SessionClose(const Napi::CallbackInfo& info) {
    Context& c = ctx(info.Env());
    return schedule(info.Env(), {}, [&c] { ops::session_close(c); });
  }

  Napi::Value SessionAllGather(const Napi::CallbackInfo& info) { return bytes_op(info, /*gathered=*/true, ops::session_all_gather); }

  // (input typed array of W*n elements, bf16?) -> output typed array of n elements
  Napi::Value SessionReduceScatter(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    const auto in = info[0].As<Napi::TypedArray>();
    const bool bf16 = info[1].ToBoolean().Value();
    const int64_t esz = bf16 ? 2 : 4;
    const int64_t total = int64_t(in.ByteLength()) / esz;
    if (total % c.world() != 0) throw_einval(env, "reduceScatter input rows must be a multiple of the world size");
    const int64_t n = total / c.world();
    Napi::Value out = bf16 ? Napi::Value(Napi::Uint16Array::New(env, size_t(n))) : Napi::Value(Napi::Float32Array::New(env, size_t(n)));
    const void* src = data_of<uint8_t>(in, "input");
    void* dst = data_of<uint8_t>(out, "output");
    return schedule(env, {in, out}, [&c, src, n, bf16, dst] { ops::session_reduce_scatter(c, src, n, bf16, dst); },
                    resolve_with_output);
  }

  Napi::Value EngramWrite(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    const auto table = info[0].As<Napi::TypedArray>();
    const int64_t entries = info[1].As<Napi::Number>().Int64Value();
    const int64_t row_bytes = info[2].As<Napi::Number>().Int64Value();
    const uint8_t* src = data_of<uint8_t>(table, "storage", entries * row_bytes);
    return schedule(env, {table}, [&c, src, entries, row_bytes] { ops::engram_write(c, src, entries, row_bytes); });
  }

  Napi::Value EngramFetch(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    const auto ids = info[0].As<Napi::Int32Array>();
    if (c.engram_entries < 0) throw to_js_error(env, "STATE", "engramFetch before engramWrite: no table is stored", -1, "");
    auto out = Napi::Uint8Array::New(env, ids.ElementLength() * size_t(c.engram_row_bytes));
    const int32_t* src = ids.Data();
    uint8_t* dst = out.Data();
    const int64_t n = int64_t(ids.ElementLength());
    return schedule(env, {ids, out}, [&c, src, n, dst] { ops::engram_fetch(c, src, n, dst); },
                    resolve_with_output);
  }

  Napi::Value PpExchange(const Napi::CallbackInfo& info) { return bytes_op(info, /*gathered=*/false, ops::pp_exchange); }

  // cuda: (op, engine, bytes, iters) -> microseconds per call on device-resident data (bench/gpu-agrs).
  Napi::Value BenchAgrs(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = ctx(env);
    if (!c.on_cuda()) throw_einval(env, "benchAgrs runs on backend 'cuda' only");
    const std::string op = info[0].As<Napi::String>().Utf8Value();
    const std::string engine = info[1].As<Napi::String>().Utf8Value();
    const int64_t bytes = info[2].As<Napi::Number>().Int64Value();
    const int64_t iters = info[3].As<Napi::Number>().Int64Value();
    auto us = std::make_shared<double>(0);
    return schedule(env, {}, [&c, op, engine, bytes, iters, us] { *us = c.device->bench(op, engine, bytes, iters); },
                    [us](Napi::Env e, Call&) -> Napi::Value { return Napi::Number::New(e, *us); });
  }

  // ---- cuda rank programs: device tensors, stream sync, CUDA events, baselines (gpu/moe.cc) ----
  Context& cuda_ctx(Napi::Env env, const char* what) {
    Context& c = ctx(env);
    if (!c.on_cuda()) throw_einval(env, std::string(what) + " needs backend 'cuda'");
    return c;
  }
  static uint64_t big_of(const Napi::Value& v, const char* name) {
    if (!v.IsBigInt()) throw_einval(v.Env(), std::string(name) + " must be a device address (BigInt)");
    bool lossless = true;
    return v.As<Napi::BigInt>().Uint64Value(&lossless);
  }

  Napi::Value DeviceAlloc(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = cuda_ctx(env, "a device tensor");
    const int64_t bytes = info[0].As<Napi::Number>().Int64Value();
    if (bytes < 0) throw_einval(env, "bytes must be >= 0");
    return Napi::BigInt::New(env, on_device(env, [&c, bytes] { return c.device->moe()->alloc(bytes); }));
  }
  Napi::Value DeviceFree(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!ctx_) return env.Undefined();  // destroyed: everything is freed already
    Context& c = cuda_ctx(env, "free");
    const uint64_t p = big_of(info[0], "ptr");
    // Queued, not waited for: the executor runs jobs in order, so later ops see the memory back in the
    // pool. DeviceTensor.free() frees once; a foreign address is ignored.
    executor_->post([&c, p] {
      try {
        c.device->moe()->free(p);
      } catch (const std::exception&) {
      }
    });
    return env.Undefined();
  }
  Napi::Value DeviceUpload(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = cuda_ctx(env, "upload");
    const uint64_t p = big_of(info[0], "ptr");
    const auto ta = info[1].As<Napi::TypedArray>();
    const uint8_t* src = data_of<uint8_t>(ta, "data");
    const int64_t n = int64_t(ta.ByteLength());
    on_device(env, [&c, p, src, n] { c.device->moe()->upload(p, src, n); });
    return env.Undefined();
  }
  Napi::Value DeviceDownload(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = cuda_ctx(env, "toHost");
    const uint64_t p = big_of(info[0], "ptr");
    const int64_t n = info[1].As<Napi::Number>().Int64Value();
    auto out = Napi::Uint8Array::New(env, size_t(n));
    uint8_t* dst = out.Data();
    on_device(env, [&c, p, dst, n] { c.device->moe()->download(dst, p, n); });
    return out;
  }
  Napi::Value DeviceSync(const Napi::CallbackInfo& info) {
    Context& c = cuda_ctx(info.Env(), "sync");
    return schedule(info.Env(), {}, [&c] { c.device->moe()->sync(); });
  }
  Napi::Value EventRecord(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = cuda_ctx(env, "an event");
    return Napi::BigInt::New(env, on_device(env, [&c] { return c.device->moe()->record_event(); }));
  }
  Napi::Value EventElapsed(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = cuda_ctx(env, "elapsedMs");
    const uint64_t a = big_of(info[0], "start"), b = big_of(info[1], "end");
    auto ms = std::make_shared<double>(0);
    return schedule(env, {}, [&c, a, b, ms] { *ms = c.device->moe()->elapsed_ms(a, b); },
                    [ms](Napi::Env e, Call&) { return Napi::Number::New(e, *ms); });
  }
  Napi::Value EventDestroy(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (!ctx_) return env.Undefined();
    Context& c = cuda_ctx(env, "an event");
    const uint64_t e = big_of(info[0], "event");
    on_device(env, [&c, e] { c.device->moe()->destroy_event(e); });
    return env.Undefined();
  }
  // (bytes per rank, iters, warmup) -> ms per ncclAlltoAll (every rank calls it together)
  Napi::Value BenchAlltoAll(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = cuda_ctx(env, "benchAlltoAll");
    const int64_t bytes = info[0].As<Napi::Number>().Int64Value();
    const int iters = info[1].As<Napi::Number>().Int32Value(), warmup = info[2].As<Napi::Number>().Int32Value();
    auto ms = std::make_shared<double>(0);
    return schedule(env, {}, [&c, bytes, iters, warmup, ms] { *ms = c.device->moe()->bench_all_to_all(bytes, iters, warmup); },
                    [ms](Napi::Env e, Call&) { return Napi::Number::New(e, *ms); });
  }
  // (bytes, iters, warmup) -> ms per copy-engine copy into the next rank's buffer
  Napi::Value BenchPeerCopy(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = cuda_ctx(env, "benchPeerCopy");
    const int64_t bytes = info[0].As<Napi::Number>().Int64Value();
    const int iters = info[1].As<Napi::Number>().Int32Value(), warmup = info[2].As<Napi::Number>().Int32Value();
    auto ms = std::make_shared<double>(0);
    return schedule(env, {}, [&c, bytes, iters, warmup, ms] { *ms = c.device->moe()->bench_peer_copy(bytes, iters, warmup); },
                    [ms](Napi::Env e, Call&) { return Napi::Number::New(e, *ms); });
  }

  // Device ms of the last dispatch/combine (CUDA events around its launches); waits for the stream.
  Napi::Value LastOpMs(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    Context& c = cuda_ctx(env, "lastOpDeviceMs");
    return Napi::Number::New(env, on_device(env, [&c] { return c.device->moe()->last_op_ms(); }));
  }

  static void OnEnvCleanup(void* arg) {
    auto* self = static_cast<ContextWrap*>(arg);
    self->cleanup_ran_ = true;
    // The worker ended without destroy() (terminate, crash): nobody waits for this rank's teardown.
    if (self->ctx_) self->ctx_->abort.abandoned = true;
    self->teardown();
  }

  std::unique_ptr<Context> ctx_;
  std::unique_ptr<Executor> executor_;
  Hub* hub_ = nullptr;  // owned by its thread-safe function (freed in its finalizer)
  napi_env env_ = nullptr;
  bool cleanup_ran_ = false;
};

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
  w.Set("diag", double(ws.diag));
  w.Set("slotBytes", double(kSlotBytes));
  w.Set("bytes", double(ws.bytes));
  Napi::Object bo = Napi::Object::New(env);
  bo.Set("slots", double(b.slots));
  bo.Set("x", double(b.x));
  bo.Set("scales", double(b.scales));
  bo.Set("topkIdx", double(b.topk_idx));
  bo.Set("topkWeights", double(b.topk_weights));
  bo.Set("srcToken", double(b.src_token));
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
  if (!info[0].IsObject() || !info[1].IsNumber()) throw_einval(env, "layout(config, worldSize)");
  return layout_object(env, ep_from(info[0].As<Napi::Object>(), info[1].As<Napi::Number>().Int32Value()));
}

// Closes fds received from other processes once every local rank has mapped them.
Napi::Value CloseFds(const Napi::CallbackInfo& info) {
  const auto arr = info[0].As<Napi::Array>();
  for (uint32_t i = 0; i < arr.Length(); ++i) close(arr.Get(i).As<Napi::Number>().Int32Value());
  return info.Env().Undefined();
}

// Encodes/decodes signals so tests check the encoding the protocol uses, not a copy of it.
Napi::Value EncodeSignal(const Napi::CallbackInfo& info) {
  const uint32_t seq = info[0].As<Napi::Number>().Uint32Value();
  const int64_t count = info[1].As<Napi::Number>().Int64Value();
  return Napi::BigInt::New(info.Env(), encode_signal(seq, count));
}

Napi::Object Init(Napi::Env env, Napi::Object exports);

}  // namespace
}  // namespace rankflow

static Napi::Object InitRankflow(Napi::Env env, Napi::Object exports) { return rankflow::Init(env, exports); }
NODE_API_MODULE(rankflow, InitRankflow)

namespace rankflow {
namespace {

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("Context", ContextWrap::Define(env));
  exports.Set("layout", Napi::Function::New(env, Layout));
  exports.Set("encodeSignal", Napi::Function::New(env, EncodeSignal));
  exports.Set("closeFds", Napi::Function::New(env, CloseFds));
  exports.Set("alignment", Napi::Number::New(env, double(kAlignment)));
  if (RegisterFdPass) RegisterFdPass(env, exports);
  if (RegisterCuda) RegisterCuda(env, exports);
  return exports;
}

}  // namespace
}  // namespace rankflow
