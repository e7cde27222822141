// The one interface between the runtime and an executor of the protocol. The runtime (context.cc,
// runtime/ops/*.cc) checks every op's inputs once, assigns its sequence number and keeps the
// layouts; a Backend then runs it: backends/host (shared host memory, C++ loops: the reference) and
// backends/cuda (GPU memory over NVLink, the kernels of kernels/). Nothing outside the backends asks
// which backend it runs on (PyTorch's SymmetricMemory.hpp split, DeepEP V2's buffer.hpp checks).
//
// Every method runs on the rank's own thread (its worker's JS thread), except where it says so.
// Tensors come as Mem: an address and whether it is device memory (cuda rank programs) or host memory
// (typed arrays: driver mode on any backend, rank programs on host).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "errors.hpp"
#include "memory_kind.hpp"
#include "protocol.hpp"
#include "scaleout.hpp"

namespace rankflow {

class Context;
struct DispatchLayout;

struct Mem {
  void* ptr = nullptr;
  bool device = false;
  template <typename T>
  T* as() const { return static_cast<T*>(ptr); }
  explicit operator bool() const { return ptr != nullptr; }
};

// What a backend keeps of one dispatch layout beside the runtime's DispatchLayout.
struct LayoutState {
  virtual ~LayoutState() = default;
};

struct DispatchInput {
  Mem x;                        // [T, hidden] bf16 or fp8 bits
  int64_t x_elem_bytes = 2;
  Mem scales;                   // [T, hidden / 128] fp32 (fp8)
  Mem topk_idx;                 // [T * K] int32, -1 = unused; absent with a handle
  Mem topk_weights;             // [T * K] fp32; absent with a handle = the handle's weights
  int64_t num_tokens = 0;
  int64_t expert_alignment = 1;
  uint32_t handle = 0;          // a previous dispatch's layout: its routing, no notify, no CPU sync
  int num_sms = 0;              // cuda: blocks of the data kernel (0 = the rank's share of the GPU)
  bool cpu_sync = true;         // the host will wait for the counts (dispatch_counts); cuda: notify mirrors them
};

// Where the outputs go. in_buffer: they stay in the receive buffer (cuda, no CPU sync), and the
// backend writes their addresses here; otherwise every field is an output of num_recv rows.
struct DispatchOutput {
  Mem x, scales, topk_idx, topk_weights, src_rank, src_token;
  bool in_buffer = false;
};

struct CombineInput {
  Mem x;                        // [num_recv, hidden] bf16
  Mem topk_weights;             // [num_recv * K] or absent: the dispatched weights
  Mem bias[2];                  // [T, hidden] bf16 each
  int num_sms = 0;
};
struct CombineOutput {
  Mem x;                        // [T, hidden] bf16
  Mem topk_weights;             // [T * K] fp32
};

// Asynchronous ops (runtime/ops/inflight.cc: rank programs' { async: true } and in-place session
// tensors). A backend issues one (its transfers and signals are started, or on cuda enqueued) and later
// completes it (waits until its result is there); what it keeps in between lives in `state`.
struct AsyncState {
  virtual ~AsyncState() = default;
};

// An AGRS collective over one region of the session (buffer offset `at`). allGather: my `bytes` go to
// my slot (at + rank * bytes) in every rank's region; `in` IS my slot when the input is in place (no
// local copy). reduceScatter: chunk q of `in` (n elements, `bytes` each chunk) goes to rank q's region
// at my slot; complete() leaves the fp32-accumulated sum at the start of my region.
struct AgrsOp {
  uint64_t seq = 0;
  bool reduce = false;
  Mem in;
  int64_t bytes = 0;
  int64_t n = 0;
  bool bf16 = false;
  int64_t at = 0;
  std::unique_ptr<AsyncState> state;
};

// An engram fetch: rows `ids` (range-checked) into `out` (host: memory of the op; cuda: device memory).
struct FetchOp {
  std::vector<int32_t> ids;
  int64_t entries = 0, row_bytes = 0;
  Mem out;
  std::unique_ptr<AsyncState> state;
};

// What info() reports of a backend.
struct BackendInfo {
  const char* backend = "host";
  MemoryKind memory_kind = MemoryKind::GpuOnly;
  // The windows, and the tensors the ops take and make, are device memory (else host memory).
  bool device_memory = false;
  int64_t stride = 0;
  std::vector<uint64_t> windows;  // rank p's window in this rank's address space
  int device_ordinal = -1;
  std::string device_name;
  bool nccl = false;
  int sms = 0;                    // cuda: SMs of the GPU, and the rank's share of them
  int sm_share = 0;
  uint64_t graph_launches = 0;    // cuda: kernel launches through the kept graphs (launch.hpp), and the others
  uint64_t direct_launches = 0;
  uint64_t fused_dispatches = 0;  // cuda: dispatches without a CPU sync that ran as one kernel (rf_dispatch_fused)
};

// The capability of a backend with devices (cuda; Backend::device()): device memory, streams,
// events, graphs, baselines and interop. A backend without devices has none, instead of 23 methods
// that throw: the runtime asks for it where a call needs it (Context::device).
class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual uint64_t device_alloc(int64_t bytes) = 0;
  virtual void device_free(uint64_t ptr) = 0;
  virtual void upload(uint64_t dst, const void* src, int64_t bytes) = 0;
  virtual void zero(uint64_t dst, int64_t bytes) = 0;  // in stream order (a graph node while capturing)
  virtual void download(void* dst, uint64_t src, int64_t bytes) = 0;
  virtual void sync() = 0;
  virtual uint64_t record_event() = 0;
  virtual double elapsed_ms(uint64_t start, uint64_t end) = 0;
  virtual void destroy_event(uint64_t event) = 0;
  virtual double last_op_ms() = 0;
  // Events around each later dispatch and combine, for last_op_ms (off: two event records cost the CPU
  // ~2 µs each per op).
  virtual void set_op_timing(bool on) = 0;
  virtual double bench_all_to_all(int64_t bytes, int iters, int warmup) = 0;
  virtual double bench_peer_copy(int64_t bytes, int iters, int warmup) = 0;
  virtual double bench_agrs(const std::string& op, const std::string& engine, int64_t bytes, int64_t iters) = 0;
  // CUDA graphs: ops between begin and end are captured (no CPU waits allowed), with sequence
  // numbers relative to a device epoch; replay() launches the graph once.
  virtual void capture_begin(uint64_t seq) = 0;
  virtual uint64_t capture_end(uint64_t ops) = 0;
  virtual void replay(uint64_t graph, uint64_t seq) = 0;
  virtual void free_graph(uint64_t graph) = 0;
  virtual bool capturing() const = 0;
  // Tests: occupy `sms` SMs of the rank's GPU for `ms` milliseconds on a stream of its own.
  virtual void occupy(int sms, double ms) = 0;

  // ---- interop with the application's own GPU work ----
  // The rank's CUstream and CUcontext (its GPU's primary context), as addresses.
  virtual uint64_t stream_handle() = 0;
  virtual uint64_t context_handle() = 0;
  // The rank's stream waits for `event`, a CUevent recorded on any stream (not while capturing).
  virtual void wait_event(uint64_t event) = 0;
  // EINVAL unless [ptr, ptr + bytes) is device memory of the rank's GPU (wrapping external memory).
  virtual void check_device_memory(uint64_t ptr, int64_t bytes) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- lifecycle ----
  virtual ExportedSegments exported() const = 0;
  // Maps every peer's segments (indexed by global rank); then a barrier (seq) so that every window is
  // mapped before anyone writes into one.
  virtual void import_peers(const std::vector<ExportedSegments>& peers, uint64_t seq) = 0;
  // 128 bytes from ncclGetUniqueId, or empty where this backend makes no communicator.
  virtual std::vector<uint8_t> nccl_unique_id() { return {}; }
  virtual void nccl_init(const std::vector<uint8_t>& id);
  virtual BackendInfo info() const = 0;
  // Test probes of the layout: bytes of my window; bytes written through my mapping of peer's.
  virtual void read_window(int64_t offset, int64_t len, uint8_t* out) = 0;
  virtual uint64_t write_peer(int peer, int64_t offset, const uint8_t* src, int64_t len) = 0;
  // Frees everything. Idempotent, noexcept; works after a peer failed or a kernel faulted.
  virtual void destroy() noexcept = 0;
  // A worker that ended without destroy() (its env's cleanup): once this returns nothing of the rank
  // runs or writes any more, so that the rest of destroy() may go on another thread (true: it must,
  // since it may wait for the whole device, whose other ranks wait for this one until their peers are
  // told, which happens only when this worker has ended). Default: false, destroy() here.
  virtual bool quiesce() noexcept { return false; }
  // Refuses an op on a rank whose protocol state is gone (a wait gave up): RANK_FAILED saying why.
  virtual void check_alive(const char* op) const { (void)op; }
  // After a run's release (runtime/ops/recover.cc), with every op of the rank waited for: what the
  // backend keeps across ops is made as a fresh rank's (cuda: the stream drained, the kernels'
  // give-up flags and the Control block cleared). RANK_FAILED where it cannot be (a fault, a timeout,
  // broken scale-out connections): the rank is dead then.
  virtual void recover() { check_alive("recover"); }
  // Refuses a collective this backend does not run in this rank's world: BACKEND_UNAVAILABLE naming
  // `op`. Every collective of the runtime (runtime/ops/) asks first, before it changes any state, so
  // a refusal leaves the rank as it was (usable).
  virtual void check_runs(const char* op) const { (void)op; }

  // ---- collectives (inputs checked by the runtime; seq assigned) ----
  // barrier: the device round; cpu_round: then the CPUs' round under the same seq. wait = false (a
  // cuda rank program capturing a graph): only enqueue.
  virtual void barrier(uint64_t seq, bool cpu_round, bool wait) = 0;
  virtual void all_gather(uint64_t seq, Mem in, int64_t bytes, Mem out) = 0;

  // dispatch, in three steps. notify: the routing of `in` into `l` (l.state made here), counts into
  // every receiver. A cached dispatch (in.handle) skips it: the runtime calls adopt_routing instead;
  // new_weights: it sends topk weights of its own (without, its receivers get the origin's weights).
  virtual void dispatch_notify(uint64_t seq, DispatchLayout& l, const DispatchInput& in) = 0;
  virtual void adopt_routing(DispatchLayout& l, const DispatchLayout& from, bool new_weights) = 0;
  // The CPU-sync wait: true once every peer's counts arrived (then l's counts are filled). With
  // block = false it only spins for spin_ns and returns false if they did not come.
  virtual bool dispatch_counts(DispatchLayout& l, bool block) = 0;
  virtual void dispatch_data(uint64_t seq, DispatchLayout& l, const DispatchInput& in, DispatchOutput& out) = 0;
  virtual void combine(uint64_t seq, DispatchLayout& l, const CombineInput& in, const CombineOutput& out) = 0;

  // AGRS sessions (seed 6.3): open/close are a batched write-and-wait of `value` in the session slots
  // (open: after an enter round of seq). Inside, each collective has its own region at `at`.
  virtual void session_signal(uint64_t enter_seq, uint64_t value, Phase phase) = 0;
  virtual void session_all_gather(uint64_t seq, Mem in, int64_t bytes, int64_t at, Mem out) = 0;
  virtual void session_reduce_scatter(uint64_t seq, Mem in, int64_t n, bool bf16, int64_t at, Mem out) = 0;
  // engram: a table in the host segment (write is collective), fetched by global row id.
  virtual void engram_write(uint64_t seq, Mem table, int64_t bytes) = 0;
  virtual void engram_fetch(Mem ids, int64_t n, int64_t entries, int64_t row_bytes, Mem out) = 0;
  // peer reduce, within one node (the runtime composes it across nodes from all_gather): every rank's
  // `in` (n fp32 or bf16 elements) summed in rank order with fp32 accumulation into every rank's `out`
  // (in == out allowed). EINVAL on every rank, with nothing moved, where a peer's n or dtype differs.
  virtual void reduce_peers(uint64_t seq, Mem in, Mem out, int64_t n, bool bf16) = 0;
  // pipeline: send to rank + 1, receive from rank - 1.
  virtual void pp_exchange(uint64_t seq, Mem in, int64_t bytes, Mem out) = 0;

  // ---- asynchronous ops (AgrsOp, FetchOp above): issue starts one, complete waits for it (once,
  // in issue order or not); destroy() finishes or abandons what is still in flight ----
  virtual void agrs_issue(AgrsOp& op) = 0;
  virtual void agrs_complete(AgrsOp& op) = 0;
  virtual void engram_fetch_issue(FetchOp& op) = 0;
  virtual void engram_fetch_complete(FetchOp& op) = 0;
  // ---- scale-out: worlds whose nodes share no memory (ContextConfig::scale_out) ----
  // Opens this rank's scale-out listener on `host` (port 0: any); the port. Then connect() makes and
  // authenticates its connections to its rail peers, before import_peers. Default: BACKEND_UNAVAILABLE.
  virtual int scaleout_listen(const std::string& host);
  virtual void scaleout_connect(const std::vector<ScaleoutEndpoint>& ends, const RailKey& key, double timeout_s);

  // ---- elastic groups (runtime/ops/membership.cc): called only while none of the rank's ops runs ----
  // Writes the ranks serving (bit p) and the membership count into this rank's workspace `live` slot
  // (WorkspaceLayout::live), which every op reads when it starts. Default: EINVAL (host only so far).
  virtual void set_live(uint64_t mask, uint64_t epoch);
  // Maps the segments of `peer`'s replacement over the window of the rank it replaces.
  virtual void import_peer(int peer, const ExportedSegments& seg);

  // ---- what only a backend with devices has (cuda): device memory, streams, events, graphs,
  // baselines, interop. Null where the backend has none (host): Context::device() refuses then, with
  // EINVAL naming the call, in one place. ----
  virtual DeviceOps* device() { return nullptr; }
};

std::unique_ptr<Backend> make_host_backend(Context& c);
// Set by the CUDA part of the addon when it is linked in (binding/cuda_probe.cc); null otherwise.
using BackendFactory = std::unique_ptr<Backend> (*)(Context& c);
void set_cuda_backend_factory(BackendFactory f);
BackendFactory cuda_backend_factory();

}  // namespace rankflow
