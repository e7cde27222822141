// The launch runtime (launch.hpp): argument checks, grid shapes, and cuLaunchKernelEx.
#include "launch.hpp"

#include <algorithm>
#include <string>

#include "driver.hpp"

namespace rankflow::cuda {

namespace {

constexpr int kNotifyThreads = 1024;  // rf_dispatch_notify's __launch_bounds__
// rf_dispatch_notify's grid: one block up to a token per thread (a decode batch pays no grid barrier);
// above that, a block per kNotifyBlockTokens tokens, up to the rank's share of the SMs: one SM moving
// every token's topk, copies, masks and slots was the kernel's bottleneck (20.7 us at 4096 tokens).
constexpr int64_t kNotifyOneBlockTokens = 1024;
constexpr int64_t kNotifyBlockTokens = 256;
constexpr int kDataThreads = 512;     // rf_dispatch_data's and rf_combine's
constexpr int kLocalThreads = 256;    // rf_combine_local's and rf_dispatch_local's
constexpr int kCopyThreads = 256;     // rf_all_gather's and rf_put's
constexpr int kSignalThreads = kMaxRanks;
constexpr int kPeerReduceThreads = 512;  // rf_peer_reduce's
constexpr int64_t kMaxNotifySmem = 200 * 1024;  // dynamic shared memory a notify block may ask for

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// A notify block's dynamic shared memory (rf_dispatch_notify's, fused: rf_dispatch_fused's) in a grid
// of `blocks`: a routing mask per token of its run, then a count and the owning rank per expert.
int64_t notify_smem_bytes(const kargs::NotifyArgs& a, int blocks, bool fused) {
  return kargs::notify_route_tokens(a.num_tokens, blocks, fused) * 8 + int64_t(a.m.num_experts) * 5;
}

void check_rank(const kargs::RankArgs& a, const char* op) {
  RF_CUDA_REQUIRE(a.peers != nullptr, std::string(op) + ": no peer table.");
  RF_CUDA_REQUIRE(a.world >= 1 && a.world <= kMaxRanks && a.rank >= 0 && a.rank < a.world && a.ws.world_size == a.world,
                  std::string(op) + ": rank " + std::to_string(a.rank) + " of world " + std::to_string(a.world) +
                      " is out of range (or the workspace layout is for another world).");
  RF_CUDA_REQUIRE(a.seq != 0 || a.epoch != nullptr, std::string(op) + ": sequence 0 is reserved (an untouched slot).");
  RF_CUDA_REQUIRE(a.arrivals != nullptr, std::string(op) + ": no arrival words.");
}

void check_moe(const kargs::RankArgs& a, const kargs::MoeShape& m, const char* op) {
  check_rank(a, op);
  RF_CUDA_REQUIRE(m.topk >= 1 && m.topk <= 32, std::string(op) + ": topk must be 1..32 (a lane per entry).");
  RF_CUDA_REQUIRE(m.experts_per_rank >= 1 && m.num_experts == m.experts_per_rank * a.world,
                  std::string(op) + ": numExperts must be a positive multiple of the world size.");
  RF_CUDA_REQUIRE(m.hidden > 0 && m.hidden % 8 == 0, std::string(op) + ": hidden must be a multiple of 8 (16-byte bf16 row vectors).");
}

}  // namespace

Launcher::Launcher(const KernelSet& k, int sm_count, int share, bool cooperative, bool graphs)
    : k_(k), sm_count_(std::max(1, sm_count)), share_(std::max(1, share)), cooperative_(cooperative), graphs_(graphs && share_ == 1) {}

// A graph still running is freed when it completes (cuGraphExecDestroy does not wait for it).
Launcher::~Launcher() {
  const Driver& d = driver();
  for (auto& [key, kept] : kept_) {
    if (kept.exec != nullptr) d.cuGraphExecDestroy(kept.exec);
    if (kept.graph != nullptr) d.cuGraphDestroy(kept.graph);
  }
}

template <typename Args>
void Launcher::keep(CUfunction f, int block, bool cooperative) {
  const Driver& d = driver();
  Args zero{};
  void* params[] = {&zero};
  CUDA_KERNEL_NODE_PARAMS p = {};
  p.func = f;
  p.gridDimX = p.gridDimY = p.gridDimZ = 1;
  p.blockDimX = unsigned(block);
  p.blockDimY = p.blockDimZ = 1;
  p.kernelParams = params;
  Kept k;  // exec stays null where a step fails: that kernel launches directly
  bool made = d.cuGraphCreate(&k.graph, 0) == CUDA_SUCCESS && d.cuGraphAddKernelNode(&k.node, k.graph, nullptr, 0, &p) == CUDA_SUCCESS;
  if (made && cooperative) {
    CUkernelNodeAttrValue v = {};
    v.cooperative = 1;
    made = d.cuGraphKernelNodeSetAttribute(k.node, CU_KERNEL_NODE_ATTRIBUTE_COOPERATIVE, &v) == CUDA_SUCCESS;
  }
  if (made && d.cuGraphInstantiateWithFlags(&k.exec, k.graph, 0) != CUDA_SUCCESS) k.exec = nullptr;
  // Uploaded now, on the rank's idle stream, rather than by its first launch.
  if (k.exec != nullptr && d.cuGraphUpload(k.exec, kept_stream_) != CUDA_SUCCESS) {
    d.cuGraphExecDestroy(k.exec);
    k.exec = nullptr;
  }
  kept_[std::make_pair(f, cooperative)] = k;
}

// Every graph is made here, when the rank's context is new and none of its kernels has run (other
// ranks' kernels may be running already), not at a kernel's first launch in the middle of its ops.
void Launcher::prepare(CUstream s) {
  if (!graphs_) return;
  kept_stream_ = s;
  const bool c = cooperative_;
  keep<kargs::BarrierArgs>(k_.barrier, kSignalThreads, false);
  keep<kargs::SignalArgs>(k_.signal, kSignalThreads, false);
  keep<kargs::AllGatherArgs>(k_.all_gather, kCopyThreads, c);
  keep<kargs::PutArgs>(k_.put, kCopyThreads, c);
  keep<kargs::NotifyArgs>(k_.notify, kNotifyThreads, false);  // one block: launched without the attribute
  if (c) keep<kargs::NotifyArgs>(k_.notify, kNotifyThreads, true);
  keep<kargs::DispatchArgs>(k_.dispatch_data, kDataThreads, c);
  keep<kargs::DispatchArgs>(k_.dispatch_local, kLocalThreads, false);
  // No graph for rf_dispatch_fused: with one kept for it as well, captured graphs of cached dispatches
  // replayed by 2 ranks sharing GPU 0 timed out in 2 of 3 fresh groups (a rank's data kernel never
  // ended; 0 of 3 without it, with 441a5fd's addon or this one). The cause was not established, as for the
  // graphs made at first launch above; the fused kernel launches with cuLaunchKernelEx.
  keep<kargs::CombineArgs>(k_.combine, kDataThreads, c);
  keep<kargs::CombineArgs>(k_.combine_local, kLocalThreads, false);
  keep<kargs::ReduceArgs>(k_.reduce, 256, false);
  keep<kargs::PeerReduceArgs>(k_.peer_reduce, kPeerReduceThreads, c);
  keep<kargs::FetchArgs>(k_.fetch, 256, false);
  keep<kargs::CopyArgs>(k_.tl_copy, 256, false);
  keep<kargs::FoldArgs>(k_.tl_fold, 256, false);
  keep<kargs::FinishArgs>(k_.tl_finish, 256, false);
}

bool Launcher::launch_graph(const CUDA_KERNEL_NODE_PARAMS& p, bool cooperative, CUstream s, const char* what) const {
  if (s != kept_stream_) return false;
  const Driver& d = driver();
  const auto it = kept_.find(std::make_pair(p.func, cooperative));
  if (it == kept_.end() || it->second.exec == nullptr ||
      d.cuGraphExecKernelNodeSetParams(it->second.exec, it->second.node, &p) != CUDA_SUCCESS)
    return false;
  RF_CU_FOR(what, cuGraphLaunch, it->second.exec, s);
  return true;
}

int Launcher::occupancy(CUfunction f, int threads, int smem) const {
  const auto key = std::make_pair(f, smem);
  const auto it = occupancy_.find(key);
  if (it != occupancy_.end()) return it->second;
  int n = 0;
  RF_CU_FOR("occupancy of a kernel", cuOccupancyMaxActiveBlocksPerMultiprocessor, &n, f, threads, size_t(smem));
  n = std::max(1, n);
  occupancy_[key] = n;
  return n;
}

// A one-rank kernel's grid: as many blocks as fit on `num_sms` SMs (0: the rank's share).
int Launcher::local_grid(CUfunction f, int num_sms) const {
  const int sms = num_sms > 0 ? num_sms : std::max(1, sm_count_ / share_);
  return grid_for(f, kLocalThreads, 0, sms * occupancy(f, kLocalThreads, 0));
}

int Launcher::grid_for(CUfunction f, int threads, int smem, int requested) const {
  const int capacity = std::max(1, occupancy(f, threads, smem) * sm_count_ / share_);
  const int wanted = requested > 0 ? requested : std::max(1, sm_count_ / share_);
  return std::max(1, std::min(wanted, capacity));
}

template <typename Args>
void Launcher::launch(CUfunction f, const char* what, int grid, int block, int smem, CUstream s, const Args& args,
                      bool cooperative) const {
  CUlaunchConfig cfg = {};
  cfg.gridDimX = unsigned(grid);
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = unsigned(block);
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.sharedMemBytes = unsigned(smem);
  cfg.hStream = s;
  CUlaunchAttribute attr = {};
  attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
  attr.value.cooperative = 1;
  const bool coop = cooperative && cooperative_;
  if (coop) {
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
  }
  Args copy = args;  // both launches read the parameter at the call
  void* params[] = {&copy};
  if (graphs_ && !capturing_) {
    CUDA_KERNEL_NODE_PARAMS p = {};
    p.func = f;
    p.gridDimX = cfg.gridDimX;
    p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = cfg.blockDimX;
    p.blockDimY = p.blockDimZ = 1;
    p.sharedMemBytes = cfg.sharedMemBytes;
    p.kernelParams = params;
    if (launch_graph(p, coop, s, what)) {
      ++graph_launches_;
      return;
    }
  }
  RF_CU_FOR(what, cuLaunchKernelEx, &cfg, f, params, nullptr);
  ++direct_launches_;
}

void Launcher::barrier(CUstream s, const kargs::BarrierArgs& a) const {
  check_rank(a.r, "barrier");
  launch(k_.barrier, "barrier", 1, kSignalThreads, 0, s, a, false);
}

void Launcher::all_gather(CUstream s, const kargs::AllGatherArgs& a) const {
  check_rank(a.r, "allGather");
  RF_CUDA_REQUIRE(a.bytes > 0 && a.bytes % 16 == 0 && aligned16(a.src) && a.dst_offset % 16 == 0,
                  "allGather: bytes (" + std::to_string(a.bytes) +
                      "), the source address and the destination offset must be multiples of 16; pad the rows.");
  RF_CUDA_REQUIRE(a.parts >= 1 && a.parts <= kMaxRanks && (a.parts == 1 || (a.src_stride % 16 == 0 && a.part_stride % 16 == 0)),
                  "allGather: " + std::to_string(a.parts) + " parts (1..64) need source and destination strides that are "
                  "multiples of 16.");
  // Below 256 KiB per block, more blocks only add arrivals.
  constexpr int64_t kBytesPerBlock = int64_t(256) << 10;
  const int64_t total = a.bytes * a.r.world * a.parts;
  const int want = int(std::min<int64_t>(sm_count_, (total + kBytesPerBlock - 1) / kBytesPerBlock));
  launch(k_.all_gather, "allGather", grid_for(k_.all_gather, kCopyThreads, 0, std::max(1, want)), kCopyThreads, 0, s, a, true);
}

int Launcher::notify_blocks(int64_t tokens) const {
  if (tokens <= kNotifyOneBlockTokens) return 1;
  const int64_t wanted = (tokens + kNotifyBlockTokens - 1) / kNotifyBlockTokens;
  return int(std::min<int64_t>(std::max(1, sm_count_ / share_), wanted));
}

void Launcher::check_notify(const kargs::NotifyArgs& a) const {
  check_moe(a.r, a.m, "dispatch notify");
  // Invariants of the kernels' memory (the runtime refused a user's too many tokens: ops/dispatch.cc).
  RF_CUDA_REQUIRE(a.num_tokens >= 0 && a.num_tokens <= a.m.max_tokens, "dispatch notify: num_tokens out of range.");
  RF_CUDA_REQUIRE(a.num_tokens == 0 || a.topk_idx != nullptr, "dispatch notify: no topkIdx.");
  RF_CUDA_REQUIRE(a.keep_weights == nullptr || a.topk_weights != nullptr, "dispatch notify: a weights copy without topkWeights.");
}

void Launcher::check_data(const kargs::DispatchArgs& a) const {
  check_moe(a.r, a.m, "dispatch");
  const auto& in = a.in;
  const auto& out = a.out;
  RF_CUDA_REQUIRE(in.num_tokens >= 0 && in.num_tokens <= a.m.max_tokens, "dispatch: num_tokens out of range.");
  RF_CUDA_REQUIRE(in.x_elem_bytes == 1 || in.x_elem_bytes == 2, "dispatch: x must be bf16 (2 bytes) or fp8 (1 byte).");
  RF_CUDA_REQUIRE((int64_t(a.m.hidden) * in.x_elem_bytes) % 16 == 0, "dispatch: x rows must be a multiple of 16 bytes.");
  RF_CUDA_REQUIRE(aligned16(in.x) && aligned16(out.x), "dispatch: x and out.x must be 16-byte aligned.");
  RF_CUDA_REQUIRE(in.scales == nullptr || a.m.buf.scales_per_token > 0,
                  "dispatch: scales given but the buffer was made without fp8 (no scales region).");
  RF_CUDA_REQUIRE(in.num_tokens == 0 || (in.x != nullptr && in.topk_idx != nullptr && in.topk_weights != nullptr),
                  "dispatch: x, topkIdx and topkWeights are required.");
  const bool any = out.x || out.scales || out.topk_idx || out.topk_weights || out.src_rank || out.src_token;
  const bool all = out.x && out.topk_idx && out.topk_weights && out.src_rank && out.src_token &&
                   (in.scales == nullptr || out.scales != nullptr);
  RF_CUDA_REQUIRE(!any || all, "dispatch: give every output (scales only with scales in) or none (outputs stay in the buffer).");
}

int64_t Launcher::fit_notify(CUfunction f, int threads, const kargs::NotifyArgs& a, bool fused, int* blocks) const {
  while (*blocks > 1) {
    const int fit = grid_for(f, threads, int(std::min(notify_smem_bytes(a, *blocks, fused), kMaxNotifySmem)), *blocks);
    if (fit == *blocks) break;
    *blocks = fit;
  }
  const int64_t T = a.num_tokens, E = a.m.num_experts, run = kargs::notify_route_tokens(T, *blocks, fused);
  const int64_t smem = notify_smem_bytes(a, *blocks, fused);
  RF_CUDA_REQUIRE(smem <= kMaxNotifySmem, "dispatch notify: " + std::to_string(T) + " tokens (" + std::to_string(run) +
                                              " in each of " + std::to_string(*blocks) + " blocks) and " + std::to_string(E) +
                                              " experts (numExperts) need more shared memory than a block has (8 bytes per "
                                              "token, 5 per expert, 200 KiB); use fewer tokens per dispatch "
                                              "(buffer.maxTokensPerRank) or fewer experts.");
  if (smem > 48 * 1024)
    RF_CU_FOR("dispatch notify shared memory", cuFuncSetAttribute, f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(smem));
  return smem;
}

void Launcher::dispatch_notify(CUstream s, const kargs::NotifyArgs& a) const {
  check_notify(a);
  // The blocks meet at a grid-wide barrier: no more than can be resident at once, nor than the
  // layout's scratch has rows for.
  int blocks = a.scratch != nullptr ? int(std::min<int64_t>(notify_blocks(a.num_tokens), a.scratch_blocks)) : 1;
  const int64_t smem = fit_notify(k_.notify, kNotifyThreads, a, false, &blocks);
  launch(k_.notify, "dispatch notify", blocks, kNotifyThreads, int(smem), s, a, blocks > 1);
}

void Launcher::dispatch_data(CUstream s, const kargs::DispatchArgs& a, int num_sms) const {
  check_data(a);
  if (a.r.world == 1 && a.out.x == nullptr) {  // alone, outputs in the buffer: rf_dispatch_local (kernels/dispatch.cu)
    launch(k_.dispatch_local, "dispatch data", local_grid(k_.dispatch_local, num_sms), kLocalThreads, 0, s, a, false);
    return;
  }
  launch(k_.dispatch_data, "dispatch data", grid_for(k_.dispatch_data, kDataThreads, 0, num_sms), kDataThreads, 0, s, a,
         true);
}

int Launcher::fused_blocks() const {
  return std::max(1, occupancy(k_.dispatch_fused, kDataThreads, 0) * sm_count_ / share_);
}

void Launcher::dispatch_fused(CUstream s, kargs::FusedDispatchArgs a, int num_sms) const {
  check_notify(a.notify);
  check_data(a.data);
  RF_CUDA_REQUIRE(a.data.announce == 0 && a.data.out.x == nullptr,
                  "dispatch fused: the notify part announces, and the outputs stay in the buffer.");
  // The blocks wait for each other (and block 0 for the peers): a grid resident at once, with a row of
  // the scratch each (without it: one block, which routes and copies every token).
  int blocks = a.notify.fused_scratch != nullptr
                   ? std::min(grid_for(k_.dispatch_fused, kDataThreads, 0, num_sms), int(a.notify.fused_blocks))
                   : 1;
  const int64_t smem = fit_notify(k_.dispatch_fused, kDataThreads, a.notify, true, &blocks);
  const int64_t row = a.data.m.hidden * int64_t(a.data.in.x_elem_bytes), routing = blocks > 1 ? blocks - 1 : 1;
  const int64_t run = kargs::notify_route_tokens(a.notify.num_tokens, blocks, true);
  a.prefetch_rows = int32_t(row > 0 ? std::min<int64_t>(run, prefetch_bytes_ / (routing * row)) : 0);
  launch(k_.dispatch_fused, "dispatch", blocks, kDataThreads, int(smem), s, a, true);
}

void Launcher::combine(CUstream s, kargs::CombineArgs a, int num_sms, int send_blocks) const {
  check_moe(a.r, a.m, "combine");
  RF_CUDA_REQUIRE(a.in.num_tokens >= 0 && a.in.num_tokens <= a.m.max_tokens, "combine: num_tokens out of range.");
  RF_CUDA_REQUIRE(aligned16(a.in.x) && aligned16(a.in.bias0) && aligned16(a.in.bias1) && aligned16(a.out.x),
                  "combine: x, the biases and out.x must be 16-byte aligned.");
  RF_CUDA_REQUIRE(a.in.num_tokens == 0 || (a.out.x != nullptr && a.out.topk_weights != nullptr),
                  "combine: out.x and out.topkWeights are required.");
  if (a.r.world == 1) {  // no peer: rf_combine_local, every block of the rank's SMs that fits (kernels/combine.cu)
    launch(k_.combine_local, "combine", local_grid(k_.combine_local, num_sms), kLocalThreads, 0, s, a, false);
    return;
  }
  const int blocks = grid_for(k_.combine, kDataThreads, 0, num_sms);
  int split = send_blocks < 0 ? std::max(1, blocks / 3) : send_blocks;  // 1/3: best at 24 and 132 SMs
  const bool flags_fit = a.m.buf.combine_flags + a.m.buf.slots * 8 <= a.m.buf.bytes;
  if (blocks < 2 || a.r.world < 2 || !flags_fit || a.pull != 0) split = 0;  // pull: nothing is sent
  a.send_blocks = std::min(split, blocks - 1);
  launch(k_.combine, "combine", blocks, kDataThreads, 0, s, a, true);
}

void Launcher::signal(CUstream s, const kargs::SignalArgs& a) const {
  RF_CUDA_REQUIRE(a.value != 0, "signal: value 0 is reserved (an untouched slot).");
  launch(k_.signal, "signal", 1, kSignalThreads, 0, s, a, false);
}

void Launcher::put(CUstream s, const kargs::PutArgs& a) const {
  check_rank(a.r, "put");
  RF_CUDA_REQUIRE(a.bytes % 16 == 0 && aligned16(a.src) && a.src_stride % 16 == 0 && a.dst_offset % 16 == 0,
                  "put: bytes (" + std::to_string(a.bytes) + "), source, stride and destination must be multiples of 16.");
  // 32 KiB per block: 1 MiB already spreads over 32 SMs (256 KiB per block left 1-4 MiB puts
  // latency-bound at 59-227 GB/s in the first bench run).
  constexpr int64_t kBytesPerBlock = int64_t(32) << 10;
  const int64_t total = a.bytes * std::max(1, a.ring.dst_count);
  const int want = int(std::max<int64_t>(1, std::min<int64_t>(sm_count_, (total + kBytesPerBlock - 1) / kBytesPerBlock)));
  launch(k_.put, "put", grid_for(k_.put, kCopyThreads, 0, want), kCopyThreads, 0, s, a, true);
}

void Launcher::reduce(CUstream s, const kargs::ReduceArgs& a) const {
  if (a.n <= 0) return;
  const int64_t per = a.bf16 ? (a.n % 8 == 0 ? a.n / 8 : a.n) : (a.n % 4 == 0 ? a.n / 4 : a.n);
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>(int64_t(sm_count_) * 8, (per + 255) / 256)));
  launch(k_.reduce, "reduce", blocks, 256, 0, s, a, false);
}

void Launcher::peer_reduce(CUstream s, const kargs::PeerReduceArgs& a) const {
  check_rank(a.r, "peer reduce");
  RF_CUDA_REQUIRE(a.n >= 0 && a.in != nullptr && a.out != nullptr, "peer reduce: n must be >= 0, in and out given.");
  // Enough blocks for 4 vectors per thread of my slice, at most what is resident of my share.
  const int64_t slice = (a.n + int64_t(a.r.world) - 1) / a.r.world * (a.bf16 ? 2 : 4) / 16;
  const int64_t per_block = int64_t(kPeerReduceThreads) * 4;
  const int want = int(std::max<int64_t>(1, std::min<int64_t>(int64_t(sm_count_) * 4, (slice + per_block - 1) / per_block)));
  launch(k_.peer_reduce, "peer reduce", grid_for(k_.peer_reduce, kPeerReduceThreads, 0, want), kPeerReduceThreads, 0, s, a, true);
}

void Launcher::engram_fetch(CUstream s, const kargs::FetchArgs& a) const {
  if (a.n <= 0) return;
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>(int64_t(sm_count_) * 8, (a.n + 7) / 8)));
  launch(k_.fetch, "engram fetch", blocks, 256, 0, s, a, false);
}

void Launcher::epoch_advance(CUstream s, const kargs::EpochArgs& a) const {
  launch(k_.epoch_advance, "epoch advance", 1, 32, 0, s, a, false);
}

void Launcher::tl_copy(CUstream s, const kargs::CopyArgs& a) const {
  if (a.count <= 0) return;
  const int blocks = int(std::min<int64_t>(int64_t(sm_count_) * 4, (a.count + 7) / 8));  // 8 warps per block
  launch(k_.tl_copy, "two-level copy", std::max(1, blocks), 256, 0, s, a, false);
}

void Launcher::tl_fold(CUstream s, const kargs::FoldArgs& a) const {
  if (a.count <= 0) return;
  launch(k_.tl_fold, "two-level combine fold", int(std::min<int64_t>(int64_t(sm_count_) * 8, a.count)), 256, 0, s, a, false);
}

void Launcher::tl_finish(CUstream s, const kargs::FinishArgs& a) const {
  if (a.num_tokens <= 0) return;
  launch(k_.tl_finish, "two-level combine finish", int(std::min<int64_t>(int64_t(sm_count_) * 8, a.num_tokens)), 256, 0, s, a,
         false);
}

void Launcher::busy(CUstream s, const kargs::BusyArgs& a, int blocks) const {
  CUdevice dev = 0;
  RF_CU(cuCtxGetDevice, &dev);
  int optin = 0;
  RF_CU(cuDeviceGetAttribute, &optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
  RF_CU_FOR("busy kernel shared memory", cuFuncSetAttribute, k_.busy, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin);
  launch(k_.busy, "busy", std::max(1, blocks), 1024, optin, s, a, false);
}

}  // namespace rankflow::cuda
