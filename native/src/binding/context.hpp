// `Context`, the ObjectWrap of one rank's runtime context (runtime/context.hpp), owned by the rank's
// worker thread. Every operation is one synchronous call on that thread: it marshals its arguments
// (positional, no option objects on the hot path), runs the runtime op, and writes small results into
// the context's scratch words (an ArrayBuffer the worker reads) instead of allocating objects. Waits
// inside an op end on their own (deadline) or through the abort words the main thread shares.
// The one split: a dispatch whose CPU-sync wait outlasts its spin returns PENDING, so that the rank
// machine can show the wait as a state, and dispatchResume() blocks for it.
#pragma once

#include <napi.h>

#include <memory>
#include <vector>

#include "runtime/ops.hpp"

namespace rankflow::binding {

// Word indices of the scratch (Float64Array / BigUint64Array views of one ArrayBuffer).
constexpr int kScratchLayoutId = 0;     // f64: the dispatch's layout id
constexpr int kScratchNumRecv = 1;      // f64: numRecv, -1 = unknown (no CPU sync)
constexpr int kScratchGraphOps = 2;     // f64: ops in the graph captureEnd() made
constexpr int kScratchMaskedSlots = 3;  // f64: the dispatch's top-k slots dropped because their expert's rank left
constexpr int kScratchAddresses = 8;    // u64 [8, 16): x, scales, topkIdx, topkWeights, srcRank, srcToken, out x, out w
// f64 [16, 24): the numbers of a dispatch or combine call, written by JS before it (actors/core/addon.ts
// DISPATCH_ARG, COMBINE_ARG). Up to 6 JS arguments cross Node-API without an allocation
// (Napi::CallbackInfo), and a number read here costs no Node-API call: a dispatch's arguments took
// 0.24 us per call before, 0.11 now, on the development VM (bench/results/native-call-2026-12-01.md).
constexpr int kScratchArgs = 16;
constexpr int kScratchTokensPerExpert = 24;  // f64 [24, 24 + local experts): tokensPerExpert (aligned)
// The args words of a dispatch call (DISPATCH_ARG) and of a combine call (COMBINE_ARG).
namespace dispatch_arg {
constexpr int kNumTokens = 0, kXElemBytes = 1, kExpertAlignment = 2, kHandle = 3, kNumSms = 4, kMode = 5;
}
namespace combine_arg {
constexpr int kHandle = 0, kNumSms = 1, kXRows = 2;
}
// A dispatch's mode (DISPATCH_HOST, DISPATCH_DEVICE_ALLOC, DISPATCH_IN_BUFFER), and its answer when
// the CPU-sync wait outlasted its spin (DISPATCH_PENDING: dispatchResume() next).
constexpr int kDispatchHost = 0, kDispatchDeviceAlloc = 1, kDispatchInBuffer = 2;
constexpr int kDispatchPending = 1;

class ContextWrap : public Napi::ObjectWrap<ContextWrap> {
 public:
  static Napi::Function Define(Napi::Env env);
  explicit ContextWrap(const Napi::CallbackInfo& info);
  ~ContextWrap() override;

 private:
  Context& ctx(Napi::Env env);
  void teardown() noexcept;
  // The method table, made in Define from each file's list, kept beside that file's definitions.
  using Methods = std::vector<Napi::ClassPropertyDescriptor<ContextWrap>>;
  static void lifecycle_methods(Methods& m);   // context.cc
  static void collective_methods(Methods& m);  // context_collectives.cc
  static void moe_methods(Methods& m);         // context_moe.cc
  static void inflight_methods(Methods& m);    // inflight.cc
  static void device_methods(Methods& m);      // context_device.cc
  static void interop_methods(Methods& m);     // interop.cc
  static void scaleout_methods(Methods& m);    // scaleout.cc
  static void OnEnvCleanup(void* arg);

  // lifecycle and probes
  Napi::Value Exported(const Napi::CallbackInfo& info);
  Napi::Value ImportPeers(const Napi::CallbackInfo& info);
  Napi::Value NcclUniqueId(const Napi::CallbackInfo& info);
  Napi::Value NcclInit(const Napi::CallbackInfo& info);
  Napi::Value Info(const Napi::CallbackInfo& info);
  Napi::Value Seq(const Napi::CallbackInfo& info);
  Napi::Value SessionCount(const Napi::CallbackInfo& info);
  Napi::Value Recover(const Napi::CallbackInfo& info);
  Napi::Value Remask(const Napi::CallbackInfo& info);
  Napi::Value Rejoin(const Napi::CallbackInfo& info);
  Napi::Value ReadWindow(const Napi::CallbackInfo& info);
  Napi::Value WritePeer(const Napi::CallbackInfo& info);
  Napi::Value Destroy(const Napi::CallbackInfo& info);
  // collectives
  Napi::Value Barrier(const Napi::CallbackInfo& info);
  Napi::Value AllGather(const Napi::CallbackInfo& info);
  Napi::Value AllReduce(const Napi::CallbackInfo& info);
  Napi::Value Dispatch(const Napi::CallbackInfo& info);
  Napi::Value DispatchResume(const Napi::CallbackInfo& info);
  Napi::Value Combine(const Napi::CallbackInfo& info);
  Napi::Value SessionOpen(const Napi::CallbackInfo& info);
  Napi::Value SessionClose(const Napi::CallbackInfo& info);
  Napi::Value SessionAllGather(const Napi::CallbackInfo& info);
  Napi::Value SessionReduceScatter(const Napi::CallbackInfo& info);
  Napi::Value EngramWrite(const Napi::CallbackInfo& info);
  Napi::Value EngramFetch(const Napi::CallbackInfo& info);
  Napi::Value PpExchange(const Napi::CallbackInfo& info);
  // session tensors, views and asynchronous ops (inflight.cc)
  Napi::Value SessionTensor(const Napi::CallbackInfo& info);
  Napi::Value WindowView(const Napi::CallbackInfo& info);
  Napi::Value SessionIssue(const Napi::CallbackInfo& info);
  Napi::Value EngramFetchIssue(const Napi::CallbackInfo& info);
  Napi::Value InflightWait(const Napi::CallbackInfo& info);
  // Detaches every view of the buffer handed out (host: ArrayBuffers over the mapped window), so that
  // nothing reads memory that is reused (session close) or unmapped (destroy).
  void detach_views(Napi::Env env) noexcept;
  // cuda: device memory, streams, events, graphs, baselines
  Napi::Value DeviceAlloc(const Napi::CallbackInfo& info);
  Napi::Value DeviceFree(const Napi::CallbackInfo& info);
  Napi::Value DeviceUpload(const Napi::CallbackInfo& info);
  Napi::Value DeviceZero(const Napi::CallbackInfo& info);
  Napi::Value DeviceDownload(const Napi::CallbackInfo& info);
  Napi::Value DeviceSync(const Napi::CallbackInfo& info);
  Napi::Value EventRecord(const Napi::CallbackInfo& info);
  Napi::Value EventElapsed(const Napi::CallbackInfo& info);
  Napi::Value EventDestroy(const Napi::CallbackInfo& info);
  Napi::Value LastOpMs(const Napi::CallbackInfo& info);
  Napi::Value SetOpTiming(const Napi::CallbackInfo& info);
  Napi::Value BenchAlltoAll(const Napi::CallbackInfo& info);
  Napi::Value BenchPeerCopy(const Napi::CallbackInfo& info);
  Napi::Value BenchAgrs(const Napi::CallbackInfo& info);
  Napi::Value CaptureBegin(const Napi::CallbackInfo& info);
  Napi::Value CaptureEnd(const Napi::CallbackInfo& info);
  Napi::Value Replay(const Napi::CallbackInfo& info);
  Napi::Value GraphFree(const Napi::CallbackInfo& info);
  Napi::Value Occupy(const Napi::CallbackInfo& info);
  Napi::Value OnSlowWait(const Napi::CallbackInfo& info);
  static void slow_wait(void* self);
  // interop with the application's own GPU work (interop.cc)
  Napi::Value CudaStream(const Napi::CallbackInfo& info);
  Napi::Value CudaContext(const Napi::CallbackInfo& info);
  Napi::Value EventWait(const Napi::CallbackInfo& info);
  Napi::Value DeviceCheck(const Napi::CallbackInfo& info);
  // scale-out (scaleout.cc)
  Napi::Value ScaleoutListen(const Napi::CallbackInfo& info);
  Napi::Value ScaleoutConnect(const Napi::CallbackInfo& info);
  Napi::Value TrafficWords(const Napi::CallbackInfo& info);

  // The dispatch whose CPU-sync wait is pending, with its inputs kept alive.
  struct PendingDispatch {
    std::shared_ptr<DispatchLayout> layout;
    DispatchInput in;
    int mode = 0;
    std::vector<Napi::Reference<Napi::Value>> keep;
  };
  // After the counts: the outputs (host: typed arrays made here; device: allocated or in the buffer),
  // the data phase, and the results written into the scratch. Returns the host outputs or undefined.
  Napi::Value finish_dispatch(Napi::Env env, PendingDispatch& p);
  void write_counts(const DispatchLayout& l);

  std::unique_ptr<Context> ctx_;
  Napi::Reference<Napi::Value> abort_words_;  // the SharedArrayBuffer view the Abort words live in
  Napi::Reference<Napi::ArrayBuffer> scratch_;
  Napi::FunctionReference slow_wait_;  // JS: post the rank's pending reports (a wait is slow)
  Napi::Reference<Napi::Value> traffic_words_;  // the SharedArrayBuffer view the Traffic words live in
  double* scratch_f64_ = nullptr;
  uint64_t* scratch_u64_ = nullptr;
  std::unique_ptr<PendingDispatch> pending_;
  std::vector<Napi::Reference<Napi::ArrayBuffer>> views_;  // weak: the views of the window handed out
  size_t views_prune_at_ = 64;
  napi_env env_ = nullptr;
  bool cleanup_ran_ = false;
};

}  // namespace rankflow::binding
