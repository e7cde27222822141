// A rank's view of the world (DeepEP's NCCLSymmetricMemoryContext, seed 4.2): rank, world size,
// physical domains (NVLink ranks x RDMA ranks), logical domains (scale-up x scale-out; `hybrid`
// switches between them), the symmetric window and its layouts, and the protocol state that lives
// across operations (op sequence number, dispatch layouts kept for handles, the AGRS session).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "host/signals.hpp"
#include "host/symmetric.hpp"
#include "layout.hpp"

namespace rankflow {

enum class Backend { Host, Cuda };

struct ContextConfig {
  Backend backend = Backend::Host;
  int device = -1;         // cuda: the rank's GPU ordinal; -1 = rank % GPU count
  int rank = 0;
  int world_size = 1;
  int ranks_per_node = 0;  // physical NVLink (scale-up) domain size; 0 = the whole world
  EpConfig ep;
  int64_t num_bytes = 0;   // symmetric bytes (workspace + buffer); 0 = size_hint(ep)
  int64_t cpu_bytes = 0;   // host segment per rank
  bool hybrid = true;
  double cpu_timeout_s = 300;
  double gpu_timeout_s = 100;
};

struct Domains {
  int num_nvl_ranks, num_rdma_ranks, nvl_rank_idx, rdma_rank_idx;              // physical
  int num_scaleup_ranks, num_scaleout_ranks, scaleup_rank_idx, scaleout_rank_idx;  // logical
  bool is_scaleup_nvlink;
  static Domains make(int rank, int world, int nvl_ranks, bool hybrid);
};

// The routing of one dispatch, kept for its handle: what cached dispatch and combine replay.
struct DispatchLayout {
  uint32_t id = 0;
  uint32_t seq = 0;                          // the dispatch op this layout belongs to
  int64_t num_tokens = 0;
  int64_t expert_alignment = 1;
  std::vector<int32_t> topk_idx;             // [T * K] global expert ids as given
  std::vector<float> topk_weights;           // [T * K] as given: a cached dispatch without weights reuses them
  std::vector<uint64_t> dest_mask;           // [T] bit p set when rank p receives token t
  std::vector<int64_t> send_count;           // [W] tokens sent to rank p
  std::vector<int64_t> recv_count;           // [W] tokens received from rank p
  std::vector<int64_t> tokens_per_expert;    // [local experts] unaligned
  int64_t num_recv = 0;
  std::vector<int32_t> recv_src_rank;        // [num_recv]
  std::vector<int32_t> recv_src_token;       // [num_recv]
  std::vector<float> recv_topk_weights;      // [num_recv * K]
  bool complete = false;                     // the data phase ran: the handle is usable
};

struct Session {
  bool open = false;
  uint32_t index = 0;          // sessions opened so far
  int64_t max_bytes = 0;       // per rank per collective
  int64_t max_all_gathers = 0;
  int64_t collectives = 0;     // collectives done in this session
  int64_t cursor = 0;          // next free byte of the session region (fresh region per collective)
};

class Context;
class MoeDevice;  // moe_device.hpp

// The GPU side of a rank (backend 'cuda'), implemented by native/src/gpu/ and linked in only when the
// build found cuda.h. Every method runs on the rank's executor thread, where its CUDA context is current.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual ExportedSegments exported() const = 0;
  // Maps every peer's segments, registers the NCCL window (collective) and runs a barrier.
  virtual void import_peers(const std::vector<ExportedSegments>& peers) = 0;
  // 128 bytes from ncclGetUniqueId (rank 0 calls it), or empty where NCCL is unavailable.
  virtual std::vector<uint8_t> nccl_unique_id() = 0;
  // ncclCommInitRank with rank 0's id: every rank calls it together.
  virtual void nccl_init(const std::vector<uint8_t>& id) = 0;
  virtual void barrier(bool cpu_round) = 0;
  virtual void all_gather(const uint8_t* in, int64_t bytes, uint8_t* out) = 0;
  virtual void read_window(int64_t offset, int64_t len, uint8_t* out) = 0;
  virtual uint64_t write_peer(int peer, int64_t offset, const uint8_t* src, int64_t len) = 0;
  // AGRS sessions, engram and pipeline: ops/session.cc and ops/pipeline.cc route here after their
  // checks, with the seq, session values and buffer offsets the host executor uses.
  // Session open (enter_seq != 0: an enter round first) and close: batched write-and-wait of `value`.
  virtual void session_signal(uint32_t enter_seq, uint32_t value, uint64_t phase) = 0;
  virtual void session_all_gather(const uint8_t* in, int64_t bytes, int64_t at, uint32_t seq, uint8_t* out) = 0;
  virtual void session_reduce_scatter(const void* in, int64_t n, bool bf16, int64_t at, uint32_t seq, void* out) = 0;
  virtual void engram_write(const uint8_t* table, int64_t bytes, uint32_t seq) = 0;
  virtual void engram_fetch(const int32_t* ids, int64_t n, int64_t entries, int64_t row_bytes, uint8_t* out) = 0;
  virtual void pp_exchange(const uint8_t* in, int64_t bytes, uint32_t seq, uint8_t* out) = 0;
  // Benchmark of one op on device-resident data, timed with CUDA events: microseconds per call
  // (bench/gpu-agrs.ts). Every rank calls it together with the same arguments.
  virtual double bench(const std::string& op, const std::string& engine, int64_t bytes, int64_t iters) = 0;
  virtual const char* memory_kind() const = 0;
  virtual int64_t stride() const = 0;
  virtual uint64_t window(int peer) const = 0;
  virtual int device_ordinal() const = 0;
  virtual std::string device_name() const = 0;
  virtual bool has_nccl() const = 0;
  // Dispatch/combine on the GPU (native/src/gpu/moe.cc), made on first use; null where unsupported.
  virtual MoeDevice* moe() { return nullptr; }
  // Frees everything (NCCL communicator, window, kernels, memory, context). Idempotent; works after
  // a kernel trap. Runs on the executor thread.
  virtual void destroy() noexcept = 0;
};
using DeviceBackendFactory = std::unique_ptr<DeviceBackend> (*)(Context& c);
// Set by the CUDA part of the addon when it is linked in (RegisterCuda).
void set_device_backend_factory(DeviceBackendFactory f);

class Context {
 public:
  explicit Context(const ContextConfig& cfg);
  ~Context() { destroy(); }

  ContextConfig cfg;
  Domains dom;
  WorkspaceLayout ws;
  BufferLayout buf;
  int64_t sym_bytes = 0;       // workspace + buffer
  int64_t cpu_bytes = 0;       // aligned host segment bytes
  HostSymmetricMemory mem;                 // backend 'host'
  std::unique_ptr<DeviceBackend> device;   // backend 'cuda' (null on host)
  AbortFlag abort;
  uint32_t seq = 0;            // collectives done; identical on every rank
  Session session;
  std::map<uint32_t, std::shared_ptr<DispatchLayout>> layouts;  // live handles, bounded
  uint32_t next_layout_id = 1;
  int64_t engram_entries = -1, engram_row_bytes = 0;

  int rank() const { return cfg.rank; }
  int world() const { return cfg.world_size; }
  bool on_cuda() const { return device != nullptr; }
  uint32_t next_seq() { return ++seq; }
  void destroy();

  // Workspace slot addresses: mine, and the one peer p holds for me.
  uint8_t* workspace() const { return mem.window(); }
  uint8_t* buffer() const { return mem.window() + ws.bytes; }
  uint8_t* peer_buffer(int p) const { return mem.peer_window(p) + ws.bytes; }
  void* my_slot(int64_t array, int from) const { return workspace() + ws.slot(array, from); }
  void* peer_slot(int p, int64_t array) const { return mem.peer_window(p) + ws.slot(array, rank()); }
  int64_t buffer_bytes() const { return sym_bytes - ws.bytes; }

  // Protocol steps shared by every op.
  void signal_all(int64_t array, uint64_t value, bool include_self = false);
  uint64_t wait_for(const void* slot, uint32_t seq, const WaitSite& site, WaitKind kind, bool exact = false) const;
  void wait_all(int64_t array, uint32_t seq, Phase phase, const char* name, WaitKind kind = WaitKind::Device) const;
  void announce(uint32_t s) { signal_all(ws.enter, encode_signal(s, 0)); }
  void wait_entered(int p, uint32_t s) const;

  std::shared_ptr<DispatchLayout> layout(uint32_t id) const;
  std::shared_ptr<DispatchLayout> add_layout();
  static constexpr size_t kMaxLiveHandles = 256;
};

}  // namespace rankflow
