// The CUDA backend of a rank: its GPU's primary context (current on the rank's thread), GPU symmetric
// memory (the same kinds, windows and flat VA as the host backend), the kernels and their launcher,
// one stream, the Control block and the dispatch counts' mirror in mapped host memory, the rank's
// device memory pool, and one NCCL communicator (none where ranks of the process share the GPU:
// NCCL refuses two ranks on one GPU). This class is the protocol of one node: its kernels see the
// node's ranks (peer table, rank, world and workspace layout of the node: kernel_rank() ...), which in
// a world of one node is the world, and it never asks how many nodes there are. A world whose nodes
// share no memory gets CudaTwoLevel (two_level.hpp) instead: the layer over it that maps only the
// node's windows, runs each op in two levels and carries the bytes between nodes over its rail's
// NCCL communicator (scaleout.hpp); the hooks below are where it joins the node's ops.
// backend.cc: lifecycle; waits.cc: waits and Control; memory.cc: device memory; collectives.cc:
// barrier, allGather, sessions, engram, pipeline; moe.cc: dispatch and combine; graph.cc: CUDA graphs; bench.cc: baselines and
// benchmarks; interop.cc: the stream, context and events an application's own GPU work uses beside
// the rank's, and checks of memory it hands over; async.cc: asynchronous AGRS and engram fetches.
#pragma once

#include <cuda.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "args.hpp"
#include "device.hpp"
#include "host_workspace.hpp"
#include "launch.hpp"
#include "modules.hpp"
#include "nccl.hpp"
#include "pool.hpp"
#include "runtime/context.hpp"
#include "scaleout.hpp"
#include "symmetric.hpp"
#include "two_level_moe.hpp"

namespace rankflow::cuda {

class CudaBackend;

// A device address as the driver takes it, from the pointer a Mem or a tensor holds, and back.
inline CUdeviceptr dev(const void* p) { return CUdeviceptr(reinterpret_cast<uintptr_t>(p)); }
inline void* ptr(CUdeviceptr p) { return reinterpret_cast<void*>(uintptr_t(p)); }

// A block of the rank's device pool, given back when the last owner lets go (layouts, graphs).
struct DeviceBlock {
  DeviceBlock(DevicePool& pool, int64_t bytes, const char* what) : pool(pool), ptr(pool.alloc(bytes, what)) {}
  ~DeviceBlock() {
    try {
      pool.free(ptr);
    } catch (...) {
    }
  }
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  DevicePool& pool;
  CUdeviceptr ptr;
};

// The device part of one dispatch layout: the routing (made by notify; shared by the cached
// dispatches that replay it: routing fields of MoeState, then copies of topk_idx and topk_weights)
// and its own receive part (the rest of MoeState).
struct CudaLayout final : LayoutState {
  std::shared_ptr<DeviceBlock> routing, recv;
  CUdeviceptr idx = 0, weights = 0;  // inside routing: [maxT * K] int32, [maxT * K] fp32
  bool cached = false;               // made from a handle: the data kernel announces `enter` itself
  // Not the routing's weights: a cached dispatch's new ones (keeps_weights: the data kernel writes them
  // there), or those of the cached handle it replays. `weights` lies in it. A cached dispatch that does
  // not keep weights of its own shares its origin's recv (DispatchArgs::keep_state).
  std::shared_ptr<DeviceBlock> weights_block;
  bool keeps_weights = false;
  bool mirrored = false;             // its notify mirrored the counts into mapped host memory
  // A dispatch without a CPU sync: its notify's arguments, launched with the data phase as one kernel
  // (rf_dispatch_fused) by dispatch_data, which comes next in the same call.
  bool fused = false;
  kargs::NotifyArgs notify;
  // Two levels (two_level_moe.cc): no device routing; the host's plan, my receive order and its
  // weights (for combine), and the device memory the op's transfers use until its stream ran.
  std::shared_ptr<TwoLevelRouting> two;
  std::vector<int32_t> src_rank, src_token;
  std::vector<float> recv_weights;
  std::vector<std::shared_ptr<DeviceBlock>> keep;
};

class CudaBackend : public Backend, public DeviceOps {
 public:
  explicit CudaBackend(Context& c);
  ~CudaBackend() override { destroy(); }

  // lifecycle (backend.cc)
  ExportedSegments exported() const override;
  void import_peers(const std::vector<ExportedSegments>& peers, uint64_t seq) override;
  std::vector<uint8_t> nccl_unique_id() override;
  void nccl_init(const std::vector<uint8_t>& id) override;
  BackendInfo info() const override;
  void read_window(int64_t offset, int64_t len, uint8_t* out) override;
  uint64_t write_peer(int peer, int64_t offset, const uint8_t* src, int64_t len) override;
  void destroy() noexcept override;
  bool quiesce() noexcept override;
  void check_alive(const char* op) const override;
  void recover() override;

  // membership.cc: elastic groups (the ranks of one node)
  void set_live(uint64_t mask, uint64_t epoch) override;
  void import_peer(int peer, const ExportedSegments& seg) override;

  // collectives.cc
  void barrier(uint64_t seq, bool cpu_round, bool wait) override;
  void all_gather(uint64_t seq, Mem in, int64_t bytes, Mem out) override;
  void session_signal(uint64_t enter_seq, uint64_t value, Phase phase) override;
  void session_all_gather(uint64_t seq, Mem in, int64_t bytes, int64_t at, Mem out) override;
  void session_reduce_scatter(uint64_t seq, Mem in, int64_t n, bool bf16, int64_t at, Mem out) override;
  void reduce_peers(uint64_t seq, Mem in, Mem out, int64_t n, bool bf16) override;
  void engram_write(uint64_t seq, Mem table, int64_t bytes) override;
  void engram_fetch(Mem ids, int64_t n, int64_t entries, int64_t row_bytes, Mem out) override;
  void pp_exchange(uint64_t seq, Mem in, int64_t bytes, Mem out) override;

  // async.cc
  void agrs_issue(AgrsOp& op) override;
  void agrs_complete(AgrsOp& op) override;
  void engram_fetch_issue(FetchOp& op) override;
  void engram_fetch_complete(FetchOp& op) override;

  // moe.cc
  void dispatch_notify(uint64_t seq, DispatchLayout& l, const DispatchInput& in) override;
  void adopt_routing(DispatchLayout& l, const DispatchLayout& from, bool new_weights) override;
  bool dispatch_counts(DispatchLayout& l, bool block) override;
  void dispatch_data(uint64_t seq, DispatchLayout& l, const DispatchInput& in, DispatchOutput& out) override;
  void combine(uint64_t seq, DispatchLayout& l, const CombineInput& in, const CombineOutput& out) override;

  // The capability of a backend with devices (runtime/backend.hpp DeviceOps): this backend itself.
  DeviceOps* device() override { return this; }

  // device memory, events (backend.cc)
  uint64_t device_alloc(int64_t bytes) override;
  void device_free(uint64_t ptr) override;
  void upload(uint64_t dst, const void* src, int64_t bytes) override;
  void zero(uint64_t dst, int64_t bytes) override;
  void download(void* dst, uint64_t src, int64_t bytes) override;
  void sync() override;
  uint64_t record_event() override;
  double elapsed_ms(uint64_t start, uint64_t end) override;
  void destroy_event(uint64_t event) override;
  double last_op_ms() override;
  void set_op_timing(bool on) override;

  // graph.cc
  void capture_begin(uint64_t seq) override;
  uint64_t capture_end(uint64_t ops) override;
  void replay(uint64_t graph, uint64_t seq) override;
  void free_graph(uint64_t graph) override;
  bool capturing() const override { return capturing_; }
  void occupy(int sms, double ms) override;

  // interop.cc: the application's own GPU work beside the rank's
  uint64_t stream_handle() override;
  uint64_t context_handle() override;
  void wait_event(uint64_t event) override;
  void check_device_memory(uint64_t ptr, int64_t bytes) override;

  // bench.cc
  double bench_all_to_all(int64_t bytes, int iters, int warmup) override;
  double bench_peer_copy(int64_t bytes, int iters, int warmup) override;
  double bench_agrs(const std::string& op, const std::string& engine, int64_t bytes, int64_t iters) override;

 protected:
  int rank() const { return c_.rank(); }
  int world() const { return c_.world(); }
  void create();

  // Kernel arguments of op `seq`: relative to the device epoch while a graph is captured.
  kargs::RankArgs rank_args(uint64_t seq) const;
  kargs::MoeShape moe_shape() const;
  kargs::MoeState state_of(const CudaLayout& l) const;
  CudaLayout& layout_of(DispatchLayout& l) const;
  // The device part of a new layout (Context::add_layout), with its receive block and, own_routing, a
  // routing block of its own. A layout reused for the new handle takes over the blocks of the one that
  // expired where nothing else holds them (the cached dispatches sharing its routing, a captured
  // graph): in steady state a dispatch then allocates nothing. The rest of the state starts anew.
  // shared_recv: the receive block of the layout a cached dispatch replays with its weights (none of its
  // own); own_weights: a block for a cached dispatch's new weights (weights_block).
  std::unique_ptr<CudaLayout> new_layout_state(DispatchLayout& l, bool own_routing, std::shared_ptr<DeviceBlock> shared_recv = nullptr,
                                               bool own_weights = false);
  // Every other rank of the kernels' view (in two levels: of my node).
  kargs::Ring all_ring() const { return kargs::Ring{1, kernel_world() - 1, 1, kernel_world() - 1}; }

  // What the kernels see (rank_args): the node's ranks only (rank = local index, world = ranks per
  // node, peers = the node's windows, workspace layout kws_ made for them): in a world of one node,
  // the world. One view per rank, so that every kernel of the rank uses the same slots.
  int kernel_rank() const { return c_.nodes.local; }
  // The live slot of my workspace (device memory; RankArgs::live) and its words written in stream order.
  CUdeviceptr live_word() const { return mem_.window() + CUdeviceptr(kws_.live); }
  void write_live(uint64_t mask, uint64_t epoch);
  int kernel_world() const { return c_.nodes.ranks_per_node; }
  std::vector<uint64_t> kernel_peers() const;  // window bases, indexed by kernel rank
  CUdeviceptr kernel_peer_base(int j) const;   // kernel rank j's window
  // Maps the peers' windows and host segments (two levels: the node's), registers the NCCL window
  // (register_window), then the barrier that makes every window mapped before anyone writes into one.
  void map_peers(const std::vector<ExportedSegments>& peers, uint64_t seq, bool register_window);
  // ncclGetUniqueId's 128 bytes; the communicator of n ranks, mine the me-th, from `id` (whose: the
  // rank that made it, for the refusal).
  std::vector<uint8_t> make_unique_id();
  void init_comm(const std::vector<uint8_t>& id, int n, int me, const char* whose);

  // ---- where the two-level layer (two_level.hpp) joins the node's ops: nothing here ----
  // STATE unless a two-level `op` can run now (the rail communicator is there, no capture).
  virtual void check_rails(const char* op) const { (void)op; }
  // Enqueues the rail round of an op that moves no data across nodes (after its node round).
  virtual void rail_round(uint64_t seq) { (void)seq; }
  // After the stream ran the op: every rail peer's header names this op and these bytes.
  virtual void check_rail_headers(uint64_t seq, int64_t bytes, const char* op, Phase phase) {
    (void)seq, (void)bytes, (void)op, (void)phase;
  }
  // Staging a reduceScatter of `chunk`-byte chunks needs for the chunks other nodes send.
  virtual int64_t scatter_recv_bytes(int64_t chunk) const { return (void)chunk, 0; }
  // ppExchange: staging the hop receives into (padded: the part's bytes in the window), and the hop.
  virtual int64_t pp_recv_bytes(int64_t padded) const { return (void)padded, 0; }
  virtual void pp_hop(uint64_t seq, CUdeviceptr src, CUdeviceptr recv, int64_t bytes, int64_t at);
  // The rail communicator aborted and forgotten (its kernels stop): after a timeout or a peer's
  // failure nobody answers on it, and the stream must drain. Local; noexcept.
  virtual void abort_rails() noexcept {}
  // A run's release reached an op while it waited: whatever cannot be put back in step afterwards.
  virtual void released_mid_op() {}
  // The W parts an allGather left in the buffer (padded there) into `out` (collectives.cc).
  void copy_gathered(Mem out, int64_t gather, int64_t bytes, int64_t padded);

  // Waits (backend.cc). Each polls its condition in the runtime's one wait loop; a raised abort
  // word is passed on to the kernels (abort_mirror where the GPU cannot read the words itself) and
  // the wait goes on until the stream drained; then the Control block decides: a recorded timeout
  // -> TIMEOUT_GPU (the rank's protocol state is gone), an abort -> RANK_FAILED, a refused input ->
  // EINVAL (the rank stays usable).
  void wait_stream(const WaitSite& site);
  void wait_completed(uint64_t seq, const WaitSite& site);
  // Spins until the Control word at `word` (completed_seq, synced_seq) reaches seq; a fault ends it.
  void wait_flag(const volatile uint64_t* word, uint64_t seq, const WaitSite& site);
  template <typename Ready>
  void wait_device(const WaitSite& site, Ready ready);
  void check_control(const WaitSite& site);  // check_gave_up, then check_refused
  void check_gave_up();                       // a recorded timeout -> TIMEOUT_GPU
  void check_refused();                       // an input the kernels refused -> EINVAL
  [[noreturn]] void fail_stream(CUresult r);
  void mark_dead(const std::string& why) const;
  bool abort_raised() const;
  // The run's release ends the op in progress (c_.seq).
  bool released_now() const;
  void mirror_abort();
  // Driver-mode staging of host tensors (grown on demand; every driver-mode op waits before it returns).
  CUdeviceptr staging(int64_t bytes);
  Mem stage_in(Mem m, int64_t bytes, int64_t at);
  // Every copy from host memory (memory.cc): through the rank's pinned staging, in stream order.
  void from_host(CUdeviceptr dst, const void* src, int64_t bytes);
  // An AGRS put: peer pointers below ce_min_bytes per destination, copy engines from there on.
  void put(const kargs::RankArgs& a, CUdeviceptr src, int64_t src_stride, int64_t bytes, int64_t dst_offset,
           kargs::Ring ring, bool enter, Phase phase);
  // A session collective's exchange, for the synchronous (collectives.cc) and the asynchronous
  // (async.cc) entry points: put into every peer (the two-level layer: across the rails too).
  // allGather: my part already in my slot of the region at window offset `region`. reduceScatter: my
  // W chunks at `src` (recv: scatter_recv_bytes of scratch for what other nodes send).
  virtual void session_gather_parts(uint64_t seq, int64_t region, int64_t bytes);
  virtual void session_scatter(uint64_t seq, CUdeviceptr src, CUdeviceptr recv, int64_t chunk, int64_t region);
  void keep_for_graph(const CudaLayout& l);
  // async.cc: an async op's end, recorded on the stream, waited for like the stream itself.
  void wait_event(CUevent e, const WaitSite& site);

  Context& c_;
  int ordinal_ = -1;
  std::unique_ptr<DeviceContext> dev_;
  SymmetricMemory mem_;
  std::unique_ptr<Modules> modules_;
  std::unique_ptr<Launcher> launch_;
  CUstream stream_ = nullptr;
  HostWorkspace host_;                 // Control, then the dispatch counts' mirror
  HostWorkspace pinned_;               // staging of copies from host memory: two halves (from_host)
  CUevent pinned_done_[2] = {nullptr, nullptr};  // recorded after the copy out of each half
  int pinned_next_ = 0;
  Control* ctl_ = nullptr;             // host address
  CUdeviceptr ctl_dev_ = 0, counts_dev_ = 0;
  uint64_t* counts_host_ = nullptr;
  const int32_t* abort_dev_ = nullptr; // the abort words as the GPU reads them
  void* registered_ = nullptr;         // the abort words' page, registered with cuMemHostRegister
  CUdeviceptr scratch_ = 0, peers_ = 0, arrivals_ = 0, epoch_ = 0, segments_ = 0;
  CUdeviceptr stage_ = 0;
  int64_t stage_bytes_ = 0;
  int64_t ce_min_bytes_ = 0;
  ncclComm_t comm_ = nullptr;          // the world's communicator; in two levels, the rank's rail's
  ncclWindow_t window_ = nullptr;
  std::unique_ptr<NcclRails> rails_;   // the two-level layer's scale-out leg over comm_ (none here)
  WorkspaceLayout kws_;                // the workspace layout the kernels use (for kernel_world() ranks)
  CUdeviceptr rail_frames_ = 0;        // [N] 16-byte headers received from the N nodes, then mine
  DevicePool pool_;
  CUevent op_start_ = nullptr, op_end_ = nullptr;
  bool op_timing_ = false;  // rank.timeOps(): record op_start_ / op_end_ around dispatch and combine
  bool op_timed_ = false;   // both were recorded for the last op
  bool timing() const { return op_timing_ && !capturing_; }
  // With timing(): op_start_ before an op's first device work, op_end_ after its last (memory.cc).
  void time_start();
  void time_end();
  int64_t topk_bytes_ = 0;
  kargs::MoeStateLayout state_layout_;
  kargs::NotifyScratch notify_scratch_;  // after the topk copies in each routing block
  uint64_t fused_dispatches_ = 0;
  CUdeviceptr fused_scratch_ = 0;  // kargs::FusedScratch of fused_blocks_ rows
  int64_t fused_scratch_bytes_ = 0;
  int fused_blocks_ = 0;
  // Dispatches without a CPU sync run as one kernel (ContextConfig.fused_dispatch).
  bool fuses() const { return c_.cfg.fused_dispatch; }
  // graphs
  struct Graph {
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    uint64_t ops = 0;
    std::vector<std::shared_ptr<DeviceBlock>> keep;  // layouts' memory the graph's kernels use
    std::vector<CUdeviceptr> outputs;                // tensors allocated while capturing
    bool needs_all = false;  // an op that needs every rank (the peer reduce): no replay while an elastic group is degraded
  };
  bool capturing_ = false;
  uint64_t synced_ = 0;  // the last value wait_stream asked the stream to write into Control.synced_seq
  bool stream_writes_ = false;  // the GPU supports 64-bit stream memory ops (cuStreamWriteValue64)
  uint64_t capture_base_ = 0;
  Graph capture_;
  std::map<uint64_t, Graph> graphs_;
  uint64_t next_graph_ = 1;
  uint64_t epoch_value_ = UINT64_MAX;  // what the device epoch holds after the last replay
  CUstream busy_stream_ = nullptr;
  mutable bool dead_ = false;
  mutable std::string death_;
  bool destroyed_ = false;
};

}  // namespace rankflow::cuda
