// The CUDA side of a rank (backend 'cuda'): the rank's primary context on its GPU, GPU symmetric
// memory (cuda::SymmetricMemory, the same kinds, windows and flat VA as the host backend), the
// kernels, a stream, the mapped host workspace where a trapping kernel leaves its Diagnostic, and
// one NCCL communicator with the device segment registered as a window.
// Every method runs on the rank's executor thread, which made the context current when it built this
// object (CUDA's current context is per thread).
#include "rank.hpp"

#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "../cuda/agrs.hpp"
#include "../cuda/device.hpp"
#include "../cuda/driver.hpp"
#include "../cuda/host_workspace.hpp"
#include "../cuda/kernels.hpp"
#include "../cuda/launch.hpp"
#include "../cuda/nccl.hpp"
#include "../cuda/symmetric.hpp"
#include "../host/signals.hpp"
#include "rank_gpu.hpp"

namespace rankflow::gpu {
namespace {

using cuda::driver;

// A kernel that traps (or faults) poisons CUDA for the whole process, not only its own context: the
// driver's launch failures are sticky per process ("any further CUDA work will return the same
// error; the process must be terminated"), so every other rank of this process then finds its own
// context, on its own GPU, dead too (seen on 2x H200: rank 1's GPU 1 fails with
// CUDA_ERROR_LAUNCH_FAILED after rank 0's kernel trapped on GPU 0, while a rank in another process
// keeps its GPU). The first such rank is remembered so that the others' errors say where it came from.
std::mutex g_trap_mutex;
int g_trap_rank = -1;
std::string g_trap_what;

void record_trap(int rank, const std::string& what) {
  std::lock_guard<std::mutex> lock(g_trap_mutex);
  if (g_trap_rank >= 0) return;
  g_trap_rank = rank;
  g_trap_what = what;
}

// The rank whose kernel poisoned this process, when it is another rank than `rank`; -1 otherwise.
int trapped_elsewhere(int rank, std::string* note) {
  std::lock_guard<std::mutex> lock(g_trap_mutex);
  if (g_trap_rank < 0 || g_trap_rank == rank) return -1;
  *note = " Not this rank's doing: " + g_trap_what +
          " in this process, and CUDA's launch failures are sticky for the whole process, so every rank's "
          "context in it is dead (on every GPU): destroy the group. Ranks in separate processes "
          "(createGroup({ world })) keep their GPUs when one of them traps";
  return g_trap_rank;
}

const char* counter_of(uint64_t phase) {
  switch (phase) {
    case kPhaseBarrier: return "barrier";
    case kPhaseEnter: return "enter";
    case kPhaseAllGather: return "done";
    default: return "slot";
  }
}

std::string hex(uint64_t v) {
  char s[32];
  snprintf(s, sizeof s, "0x%016llx", static_cast<unsigned long long>(v));
  return s;
}

class CudaRank final : public DeviceBackend, public RankGpu {
 public:
  explicit CudaRank(Context& c) : c_(c) {
    translating(c.rank(), [&] {
      try {
        create();
      } catch (...) {
        destroy();
        throw;
      }
    });
  }
  ~CudaRank() override { destroy(); }

  ExportedSegments exported() const override {
    const cuda::ExportedSegments e = mem_.exported();
    return {e.device_fd, e.host_fd};
  }

  void import_peers(const std::vector<ExportedSegments>& peers) override {
    check_alive("registerWindow");
    translating(rank(), [&] {
      std::vector<cuda::ExportedSegments> fds(peers.size());
      for (size_t p = 0; p < peers.size(); ++p) fds[p] = {peers[p].device_fd, peers[p].host_fd};
      mem_.import_peers(fds);  // same process: the fds are borrowed, closed by their owner at destroy
      if (c_.cpu_bytes > 0) {  // engram: every rank's host segment, as my GPU addresses it
        std::vector<uint64_t> seg(size_t(c_.world()));
        for (int p = 0; p < c_.world(); ++p) seg[size_t(p)] = uint64_t(mem_.host_segment(p));
        RF_CU(cuMemAlloc, &segments_, seg.size() * sizeof(uint64_t));
        // On the rank's stream: a plain cuMemcpyHtoD from pageable memory may still be in flight when a
        // kernel on this non-blocking stream starts.
        RF_CU(cuMemcpyHtoDAsync, segments_, seg.data(), seg.size() * sizeof(uint64_t), stream_);
      }
      if (comm_ != nullptr) {
        // Collective: every rank registers its device segment at the same time.
        RF_NCCL(ncclCommWindowRegister, comm_, reinterpret_cast<void*>(mem_.window()), size_t(mem_.device_bytes()),
                &window_, cuda::kNcclWinCollSymmetric);
      }
    });
    barrier(false);  // every window is mapped before anyone writes into one
  }

  std::vector<uint8_t> nccl_unique_id() override {
    std::string why;
    if (!cuda::nccl_available(&why)) return {};
    return translating(rank(), [&] {
      cuda::ncclUniqueId id;
      RF_NCCL(ncclGetUniqueId, &id);
      return std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal));
    });
  }

  void nccl_init(const std::vector<uint8_t>& id) override {
    check_alive("ncclInit");
    RF_CHECK(id.size() == RF_NCCL_UNIQUE_ID_BYTES, "EINVAL",
             "ncclInit needs the 128-byte NCCL unique id of rank 0, got " + std::to_string(id.size()) + " bytes");
    RF_CHECK(comm_ == nullptr, "STATE", "rank " + std::to_string(rank()) + " already has an NCCL communicator");
    translating(rank(), [&] {
      cuda::ncclUniqueId uid;
      std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
      RF_NCCL(ncclCommInitRank, &comm_, c_.world(), uid, rank());
    });
  }

  void barrier(bool cpu_round) override {
    check_alive(cpu_round ? "barrier (CPU sync)" : "barrier");
    if (cpu_round) return cpu_barrier();
    translating(rank(), [&] {
      cuda::SignalArgs a = signal_args(c_.next_seq());
      cuda::launch_barrier(*kernels_, stream_, a);
    });
    sync(a_seq_);
  }

  void all_gather(const uint8_t* in, int64_t bytes, uint8_t* out) override {
    check_alive("allGather");
    const int W = c_.world();
    // The kernel moves 16-byte vectors: each rank's part is padded to 16 bytes in the buffer, and my
    // input is staged (host -> device) right behind the W gathered parts.
    const int64_t padded = align_up(bytes > 0 ? bytes : 16, 16);
    const int64_t gather = c_.ws.bytes;  // window offset of the buffer
    const int64_t staging = gather + align_up(padded * W, kRegionAlignment);
    RF_CHECK(staging + padded <= c_.sym_bytes, "EINVAL",
             "allGather of " + std::to_string(bytes) + " bytes per rank on cuda needs " +
                 std::to_string(staging + padded - gather) + " buffer bytes (" + std::to_string(W) +
                 " parts padded to 16 bytes and a staging area); the buffer has " + std::to_string(c_.buffer_bytes()) +
                 " (raise buffer.bytes)");
    translating(rank(), [&] {
      const CUdeviceptr src = mem_.window() + CUdeviceptr(staging);
      if (bytes > 0) RF_CU(cuMemcpyHtoDAsync, src, in, size_t(bytes), stream_);
      if (padded > bytes) RF_CU(cuMemsetD8Async, src + CUdeviceptr(bytes), 0, size_t(padded - bytes), stream_);
      cuda::SignalArgs a = signal_args(c_.next_seq());
      cuda::launch_all_gather(*kernels_, stream_, a, src, padded, gather, arrivals_, 0, dev_->sm_count());
    });
    sync(a_seq_);
    translating(rank(), [&] {
      if (bytes == 0) return;
      if (padded == bytes) {
        RF_CU(cuMemcpyDtoH, out, mem_.window() + CUdeviceptr(gather), size_t(bytes * W));
        return;
      }
      for (int p = 0; p < W; ++p)
        RF_CU(cuMemcpyDtoH, out + int64_t(p) * bytes, mem_.window() + CUdeviceptr(gather + int64_t(p) * padded),
              size_t(bytes));
    });
  }

  void read_window(int64_t offset, int64_t len, uint8_t* out) override {
    check_alive("readWindow");
    if (len > 0) translating(rank(), [&] { RF_CU(cuMemcpyDtoH, out, mem_.window() + CUdeviceptr(offset), size_t(len)); });
  }

  uint64_t write_peer(int peer, int64_t offset, const uint8_t* src, int64_t len) override {
    check_alive("writePeer");
    const CUdeviceptr dst = mem_.translate(mem_.window() + CUdeviceptr(offset), peer);
    if (len > 0) translating(rank(), [&] { RF_CU(cuMemcpyHtoD, dst, src, size_t(len)); });
    return uint64_t(dst);
  }

  // --- AGRS sessions, engram, pipeline (the host executor's phases: ops/session.cc, ops/pipeline.cc) ---

  void session_signal(uint32_t enter_seq, uint32_t value, uint64_t phase) override {
    check_alive(phase_name(phase));
    translating(rank(), [&] {
      cuda::SignalArgs a = signal_args(enter_seq != 0 ? enter_seq : c_.seq);
      if (enter_seq != 0) agrs_->signal(stream_, a, c_.ws.enter, enter_seq, all_ring(), phase);
      agrs_->signal(stream_, a, c_.ws.session, value, all_ring(), phase);
    });
    sync(a_seq_);
  }

  void session_all_gather(const uint8_t* in, int64_t bytes, int64_t at, uint32_t seq, uint8_t* out) override {
    check_alive("session allGather");
    const int W = c_.world();
    const int64_t region = c_.ws.bytes + at;              // window offset of this collective's region
    const int64_t mine = region + int64_t(rank()) * bytes;  // my part, in every rank's window
    translating(rank(), [&] {
      // My part goes straight into my own slot of the region; from there to every peer's.
      if (bytes > 0) RF_CU(cuMemcpyHtoDAsync, mem_.window() + CUdeviceptr(mine), in, size_t(bytes), stream_);
      cuda::SignalArgs a = signal_args(seq);
      put(a, mem_.window() + CUdeviceptr(mine), 0, bytes, mine, cuda::Ring{1, W - 1, 1, W - 1}, false,
          kPhaseSessionGather);
    });
    sync(a_seq_);
    if (bytes > 0)
      translating(rank(), [&] { RF_CU(cuMemcpyDtoH, out, mem_.window() + CUdeviceptr(region), size_t(bytes * W)); });
  }

  void session_reduce_scatter(const void* in, int64_t n, bool bf16, int64_t at, uint32_t seq, void* out) override {
    check_alive("session reduceScatter");
    const int W = c_.world();
    const int64_t chunk = n * (bf16 ? 2 : 4);
    const int64_t region = c_.ws.bytes + at;
    translating(rank(), [&] {
      // My W chunks are staged on the device; chunk q goes to rank q's region at my rank's slot.
      const CUdeviceptr stage = staging(chunk * W);
      if (chunk > 0) RF_CU(cuMemcpyHtoDAsync, stage, in, size_t(chunk * W), stream_);
      cuda::SignalArgs a = signal_args(seq);
      put(a, stage, chunk, chunk, region + int64_t(rank()) * chunk, cuda::Ring{0, W, 1, W - 1}, false,
          kPhaseSessionReduce);
      // The input is consumed (stream order): the sum lands at the start of the staging area.
      agrs_->reduce(stream_, mem_.window() + CUdeviceptr(region), W, n, bf16, stage, dev_->sm_count());
    });
    sync(a_seq_);
    if (chunk > 0) translating(rank(), [&] { RF_CU(cuMemcpyDtoH, out, stage_, size_t(chunk)); });
  }

  void engram_write(const uint8_t* table, int64_t bytes, uint32_t seq) override {
    check_alive("engramWrite");
    translating(rank(), [&] {
      cuda::SignalArgs a = signal_args(seq);
      // Peers may still be fetching from the previous table: overwrite only once all of them moved on.
      agrs_->signal(stream_, a, c_.ws.enter, seq, all_ring(), kPhaseEnter);
      if (bytes > 0) RF_CU(cuMemcpyHtoDAsync, mem_.host_segment(rank()), table, size_t(bytes), stream_);
      agrs_->signal(stream_, a, c_.ws.done, seq, all_ring(), kPhaseEngram);
    });
    sync(a_seq_);
  }

  void engram_fetch(const int32_t* ids, int64_t n, int64_t entries, int64_t row_bytes, uint8_t* out) override {
    check_alive("engramFetch");
    if (n == 0) return;
    const int64_t ids_bytes = align_up(n * 4, kRegionAlignment);
    translating(rank(), [&] {
      const CUdeviceptr stage = staging(ids_bytes + n * row_bytes);
      RF_CU(cuMemcpyHtoDAsync, stage, ids, size_t(n * 4), stream_);
      agrs_->engram_fetch(stream_, segments_, stage, n, entries, row_bytes, stage + CUdeviceptr(ids_bytes),
                          dev_->sm_count());
    });
    sync(c_.seq);
    translating(rank(), [&] { RF_CU(cuMemcpyDtoH, out, stage_ + CUdeviceptr(ids_bytes), size_t(n * row_bytes)); });
  }

  void pp_exchange(const uint8_t* in, int64_t bytes, uint32_t seq, uint8_t* out) override {
    check_alive("ppExchange");
    translating(rank(), [&] {
      const CUdeviceptr stage = staging(bytes);
      if (bytes > 0) RF_CU(cuMemcpyHtoDAsync, stage, in, size_t(bytes), stream_);
      cuda::SignalArgs a = signal_args(seq);
      put(a, stage, 0, bytes, c_.ws.bytes, cuda::Ring{1, 1, 1, 1}, true, kPhasePipeline);
    });
    sync(a_seq_);
    if (bytes > 0)
      translating(rank(), [&] { RF_CU(cuMemcpyDtoH, out, mem_.window() + CUdeviceptr(c_.ws.bytes), size_t(bytes)); });
  }

  double bench(const std::string& op, const std::string& engine, int64_t bytes, int64_t iters) override {
    check_alive("bench");
    const int W = c_.world();
    RF_CHECK(iters > 0 && bytes > 0 && bytes % 16 == 0, "EINVAL", "bench: bytes must be a positive multiple of 16");
    RF_CHECK(engine == "kernel" || engine == "ce" || engine == "auto", "EINVAL", "bench: engine is kernel, ce or auto");
    const bool is_engram = op == "engram";
    RF_CHECK(is_engram || bytes * W <= c_.buffer_bytes(), "EINVAL",
             "bench " + op + " of " + std::to_string(bytes) + " bytes per rank needs " + std::to_string(bytes * W) +
                 " buffer bytes; the buffer has " + std::to_string(c_.buffer_bytes()));
    RF_CHECK(!is_engram || c_.engram_entries > 0, "EINVAL", "bench engram needs an engramWrite first");
    const int saved = ce_min_bytes_;
    if (engine == "kernel") ce_min_bytes_ = 1 << 30;
    if (engine == "ce") ce_min_bytes_ = 0;
    double us = 0;
    translating(rank(), [&] {
      const int64_t src_bytes = is_engram ? align_up(bytes * 4, kRegionAlignment) + bytes * c_.engram_row_bytes
                                          : bytes * W * 2;
      const CUdeviceptr src = staging(src_bytes);
      if (is_engram) {  // `bytes` random global row ids, the same on every run
        std::mt19937 gen(1234 + rank());
        std::uniform_int_distribution<int32_t> pick(0, int32_t(c_.engram_entries * W - 1));
        std::vector<int32_t> ids(static_cast<size_t>(bytes));
        for (auto& id : ids) id = pick(gen);
        RF_CU(cuMemcpyHtoDAsync, src, ids.data(), ids.size() * 4, stream_);
      } else {
        RF_CU(cuMemsetD8Async, src, 0x3c, size_t(src_bytes), stream_);
      }
      CUevent start = nullptr, stop = nullptr;
      RF_CU(cuEventCreate, &start, CU_EVENT_DEFAULT);
      RF_CU(cuEventCreate, &stop, CU_EVENT_DEFAULT);
      const int64_t base = c_.ws.bytes;
      auto once = [&] {
        cuda::SignalArgs a = signal_args(c_.next_seq());
        if (op == "ce") {  // the copy-engine limit: my bytes into every peer's window, no signals
          for (int k = 1; k < W; ++k) {
            const int p = (rank() + k) % W;
            RF_CU(cuMemcpyAsync, mem_.peer_base(p) + CUdeviceptr(base + rank() * bytes), src, size_t(bytes), stream_);
          }
        } else if (op == "ag") {
          put(a, src, 0, bytes, base + rank() * bytes, cuda::Ring{1, W - 1, 1, W - 1}, false, kPhaseSessionGather);
        } else if (op == "rs-fp32" || op == "rs-bf16") {
          const bool bf = op == "rs-bf16";
          put(a, src, bytes, bytes, base + rank() * bytes, cuda::Ring{0, W, 1, W - 1}, false, kPhaseSessionReduce);
          agrs_->reduce(stream_, mem_.window() + CUdeviceptr(base), W, bytes / (bf ? 2 : 4), bf,
                        src + CUdeviceptr(bytes * W), dev_->sm_count());
        } else if (op == "pp") {
          put(a, src, 0, bytes, base, cuda::Ring{1, 1, 1, 1}, true, kPhasePipeline);
        } else if (op == "engram") {
          agrs_->engram_fetch(stream_, segments_, src, bytes, c_.engram_entries, c_.engram_row_bytes,
                              src + CUdeviceptr(align_up(bytes * 4, kRegionAlignment)), dev_->sm_count());
        } else {
          throw Error("EINVAL", "bench: unknown op '" + op + "' (ce, ag, rs-fp32, rs-bf16, pp, engram)");
        }
      };
      for (int i = 0; i < 3; ++i) once();  // warm-up
      cuda::launch_barrier(*kernels_, stream_, signal_args(c_.next_seq()));
      RF_CU(cuEventRecord, start, stream_);
      for (int64_t i = 0; i < iters; ++i) once();
      RF_CU(cuEventRecord, stop, stream_);
      cuda::launch_barrier(*kernels_, stream_, signal_args(c_.next_seq()));
      sync(a_seq_);
      float ms = 0;
      RF_CU(cuEventElapsedTime, &ms, start, stop);
      driver().cuEventDestroy(start);
      driver().cuEventDestroy(stop);
      us = double(ms) * 1000.0 / double(iters);
    });
    ce_min_bytes_ = saved;
    return us;
  }

  const char* memory_kind() const override { return cuda::memory_kind_name(mem_.kind()); }
  int64_t stride() const override { return mem_.stride(); }
  uint64_t window(int peer) const override { return uint64_t(mem_.peer_base(peer)); }
  int device_ordinal() const override { return ordinal_; }
  std::string device_name() const override { return dev_ ? dev_->name() : std::string(); }
  bool has_nccl() const override { return comm_ != nullptr; }

  // MoE dispatch/combine (moe.cc), made on first use: the kernels load then.
  MoeDevice* moe() override {
    check_alive("dispatch/combine");
    if (!moe_) moe_ = translating(rank(), [&] { return make_cuda_moe(*this); });
    return moe_.get();
  }
  Context& ctx() override { return c_; }
  CUstream stream() const override { return stream_; }
  CUdeviceptr window_of(int peer) const override { return mem_.peer_base(peer); }
  int64_t window_stride() const override { return mem_.stride(); }
  CUdeviceptr peer_table() const override { return scratch_; }
  CUdeviceptr arrivals() const override { return arrivals_; }
  CUdeviceptr diag() const override { return diag_.device(); }
  int sms() const override { return dev_->sm_count(); }
  void* nccl_comm() const override { return comm_; }
  void check_alive(const char* what) const override { check_alive_(what); }
  void sync_stream(uint32_t seq) override { sync(seq); }
  void mark_dead(const std::string& why) override {
    dead_ = true;
    death_ = why;
  }

  void destroy() noexcept override {
    if (destroyed_) return;
    destroyed_ = true;
    try {
      if (dev_) dev_->make_current();
    } catch (...) {
    }
    if (moe_) {
      moe_->destroy();  // its memory, events and kernels, before the stream and the context go
      moe_.reset();
    }
    if (comm_ != nullptr) {
      try {
        const cuda::Nccl& n = cuda::nccl();
        // Deregistering and destroying are collective: only when every peer is tearing down too.
        // After a trap, a peer's failure, or when this rank's worker is gone (terminated: its peers
        // are not tearing down with it), nobody may answer: abort, which is local.
        if (dead_ || c_.abort.failed_rank.load() >= 0 || c_.abort.abandoned.load()) {
          n.ncclCommAbort(comm_);
        } else {
          if (window_ != nullptr) n.ncclCommWindowDeregister(comm_, window_);
          n.ncclCommDestroy(comm_);
        }
      } catch (...) {
      }
      comm_ = nullptr;
      window_ = nullptr;
    }
    kernels_.reset();
    try {
      const cuda::Driver& d = driver();
      if (stream_ != nullptr) d.cuStreamDestroy(stream_);
      if (scratch_ != 0) d.cuMemFree(scratch_);
      if (segments_ != 0) d.cuMemFree(segments_);
      if (stage_ != 0) d.cuMemFree(stage_);
    } catch (...) {
    }
    stream_ = nullptr;
    scratch_ = segments_ = stage_ = 0;
    stage_bytes_ = 0;
    agrs_.reset();
    diag_.destroy();
    mem_.destroy();
    dev_.reset();  // releases the primary context (a trapped one is reset once nobody holds it)
  }

 private:
  int rank() const { return c_.rank(); }

  void create() {
    const cuda::Driver& d = driver();
    ordinal_ = c_.cfg.device >= 0 ? c_.cfg.device : rank() % d.device_count;
    dev_ = std::make_unique<cuda::DeviceContext>(ordinal_);  // retains the primary context, makes it current
    const auto kind = cuda::choose_memory_kind(c_.cpu_bytes, c_.cfg.hybrid);
    mem_.create(rank(), c_.world(), *dev_, c_.sym_bytes, c_.cpu_bytes, kind, c_.dom.num_scaleup_ranks);
    kernels_ = std::make_unique<cuda::Kernels>();
    agrs_ = std::make_unique<cuda::AgrsKernels>(*kernels_);
    // Puts of at least this many bytes per destination go through copy engines (RANKFLOW_CE_MIN_BYTES).
    if (const char* v = std::getenv("RANKFLOW_CE_MIN_BYTES")) ce_min_bytes_ = std::atoi(v);
    RF_CU(cuStreamCreate, &stream_, CU_STREAM_NON_BLOCKING);
    diag_.create(4096);
    // Device scratch: the peer table kernels take, then the allGather's arrivals word.
    const std::vector<uint64_t> table = mem_.peer_table();
    const size_t table_bytes = align_up(int64_t(table.size() * sizeof(uint64_t)), 256);
    RF_CU(cuMemAlloc, &scratch_, table_bytes + 256);
    arrivals_ = scratch_ + table_bytes;
    RF_CU(cuMemcpyHtoDAsync, scratch_, table.data(), table.size() * sizeof(uint64_t), stream_);
    RF_CU(cuMemsetD8Async, arrivals_, 0, 256, stream_);
    // My workspace is zeroed before any peer can see my fds (they come from exported(), after this).
    RF_CU(cuMemsetD8Async, mem_.window(), 0, size_t(c_.ws.bytes), stream_);
    RF_CU(cuStreamSynchronize, stream_);
  }

  cuda::SignalArgs signal_args(uint32_t seq) {
    cuda::SignalArgs a;
    a.peer_table = scratch_;
    a.workspace_offset = 0;
    a.ws = c_.ws;
    a.rank = rank();
    a.seq = seq;
    a.timeout_ns = uint64_t(c_.cfg.gpu_timeout_s * 1e9);
    a.diag = diag_.device();
    a_seq_ = seq;
    return a;
  }

  // Every peer: signal all of them, wait for all of them.
  cuda::Ring all_ring() const { return cuda::Ring{1, c_.world() - 1, 1, c_.world() - 1}; }

  // A private device staging area for host tensors (driver mode), grown on demand, not symmetric:
  // the buffer's size rules stay those of the host backend.
  CUdeviceptr staging(int64_t bytes) {
    if (bytes > stage_bytes_) {
      if (stage_ != 0) {
        RF_CU(cuStreamSynchronize, stream_);
        RF_CU(cuMemFree, stage_);
        stage_ = 0;
        stage_bytes_ = 0;
      }
      const int64_t want = align_up(bytes, kAlignment);
      RF_CU(cuMemAlloc, &stage_, size_t(want));
      stage_bytes_ = want;
    }
    return stage_;
  }

  // src + p * src_stride -> destination p's window at dst_offset, then done (a.seq) to the
  // destinations and a wait for the sources' done. Peer pointers (rf_put) below ce_min_bytes_ per
  // destination, copy engines (cuMemcpyAsync into the peers' windows, then rf_signal) from there on,
  // and whenever the bytes are not 16-byte vectors.
  void put(const cuda::SignalArgs& a, CUdeviceptr src, int64_t src_stride, int64_t bytes, int64_t dst_offset,
           cuda::Ring ring, bool enter, uint64_t phase) {
    const int W = c_.world();
    const bool aligned = bytes % 16 == 0 && src % 16 == 0 && src_stride % 16 == 0 && dst_offset % 16 == 0;
    if (aligned && bytes < ce_min_bytes_) {
      agrs_->put(stream_, a, src, src_stride, bytes, dst_offset, ring, enter, phase, arrivals_, dev_->sm_count());
      return;
    }
    // enter: announce to my sources, wait for my destinations (the reverse ring).
    if (enter)
      agrs_->signal(stream_, a, c_.ws.enter, a.seq,
                    cuda::Ring{W - ring.src_start % W, ring.src_count, W - ring.dst_start % W, ring.dst_count},
                    kPhaseEnter);
    if (bytes > 0)
      for (int k = 0; k < ring.dst_count && k < W; ++k) {
        const int p = (rank() + ring.dst_start + k) % W;
        RF_CU(cuMemcpyAsync, mem_.peer_base(p) + CUdeviceptr(dst_offset), src + CUdeviceptr(p * src_stride),
              size_t(bytes), stream_);
      }
    agrs_->signal(stream_, a, c_.ws.done, a.seq, ring, phase);
  }

  void check_alive_(const char* what) const {
    if (dead_)
      throw Error("RANK_FAILED",
                  "rank " + std::to_string(rank()) + " cannot run " + what + ": its GPU context is dead (" + death_ +
                      "); destroy the group",
                  rank());
  }

  // Waits for the stream with the CPU polling (not cuStreamSynchronize), so that a peer's failure or
  // the rank's teardown is seen while a kernel still waits on the device.
  void sync(uint32_t seq) {
    using clock = std::chrono::steady_clock;
    const cuda::Driver& d = driver();
    const auto start = clock::now();
    bool released = false;
    for (uint64_t spin = 0;; ++spin) {
      const CUresult r = d.cuStreamQuery(stream_);
      if (r == CUDA_SUCCESS) break;
      if (r != CUDA_ERROR_NOT_READY) fail_stream(r);
      if (!released && (c_.abort.failed_rank.load(std::memory_order_relaxed) >= 0 ||
                        c_.abort.stopping.load(std::memory_order_relaxed))) {
        release_waits(seq);
        released = true;
      }
      if (spin < 4096) continue;
      const double waited = std::chrono::duration<double>(clock::now() - start).count();
      if (waited < 0.002) sched_yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(waited > 0.1 ? 200 : 20));
    }
    if (released) {
      // The slots now hold a far-future epoch: this rank's protocol state is gone for good.
      dead_ = true;
      const int failed = c_.abort.failed_rank.load();
      death_ = failed >= 0 ? "released after rank " + std::to_string(failed) + " failed" : "released at teardown";
      if (failed >= 0)
        throw Error("RANK_FAILED",
                    "rank " + std::to_string(failed) + " failed while rank " + std::to_string(rank()) +
                        " waited on the GPU",
                    failed);
      throw Error("RANK_FAILED", "rank " + std::to_string(rank()) + " is shutting down", rank());
    }
  }

  // A kernel waiting for peers that will never come is let go: my own slots get an epoch far past
  // seq (the kernels compare epochs by signed distance), on the null stream, which does not wait for
  // the rank's non-blocking stream.
  void release_waits(uint32_t seq) noexcept {
    try {
      std::vector<uint64_t> row(size_t(c_.world()) * (kSlotBytes / sizeof(uint64_t)), 0);
      const uint64_t v = encode_signal(seq + 0x40000000u, 0);
      for (int p = 0; p < c_.world(); ++p) row[size_t(p) * (kSlotBytes / sizeof(uint64_t))] = v;
      for (int64_t array : {c_.ws.barrier, c_.ws.enter, c_.ws.done, c_.ws.session})
        driver().cuMemcpyHtoD(mem_.window() + CUdeviceptr(array), row.data(), row.size() * sizeof(uint64_t));
    } catch (...) {
    }
  }

  // A launch failed: a kernel trapped after a device-side wait timed out (the Diagnostic says which),
  // or faulted. Either way the context is dead.
  [[noreturn]] void fail_stream(CUresult r) {
    dead_ = true;
    const std::string name = cuda::error_name(r);
    const auto* diag = diag_.host_at<volatile Diagnostic>(0);
    if (diag->code == 1) {
      const uint64_t phase = diag->phase;
      const int peer = int(diag->peer);
      death_ = "a kernel trapped with " + name;
      record_trap(rank(), "rank " + std::to_string(rank()) + "'s kernel on GPU " + std::to_string(ordinal_) +
                              " trapped (TIMEOUT_GPU in " + phase_name(phase) + ")");
      throw Error("TIMEOUT_GPU",
                  "device-phase wait of rank " + std::to_string(rank()) + " in " + phase_name(phase) +
                      " timed out after " + seconds_text(c_.cfg.gpu_timeout_s) + " s on counter " +
                      counter_of(phase) + "[from rank " + std::to_string(peer) + "] (last value " + hex(diag->value) +
                      "); the kernel trapped (" + name + ") and GPU " + std::to_string(ordinal_) +
                      "'s context of rank " + std::to_string(rank()) + " is dead: destroy the group",
                  peer, phase_name(phase));
    }
    death_ = "a kernel failed with " + name;
    std::string note;
    const int culprit = trapped_elsewhere(rank(), &note);
    if (culprit >= 0)
      throw Error("RANK_FAILED", "rank " + std::to_string(rank()) + ": its stream failed with " + name + "." + note, culprit);
    record_trap(rank(), "rank " + std::to_string(rank()) + "'s kernel on GPU " + std::to_string(ordinal_) +
                            " failed with " + name);
    throw Error("RANK_FAILED",
                "rank " + std::to_string(rank()) + ": a kernel failed with " + name +
                    " (no timeout was recorded: a fault); the GPU context is dead: destroy the group",
                rank());
  }

  // Barrier with CPU sync, after the device round under the same seq: the CPUs write cpu_barrier
  // into every peer's window and poll their own slots, with the CPU timeout.
  void cpu_barrier() {
    using clock = std::chrono::steady_clock;
    const uint32_t s = c_.seq;
    translating(rank(), [&] {
      const uint64_t v = encode_signal(s, 0);
      for (int p = 0; p < c_.world(); ++p)
        if (p != rank())
          RF_CU(cuMemcpyHtoD, mem_.peer_base(p) + CUdeviceptr(c_.ws.slot(c_.ws.cpu_barrier, rank())), &v, sizeof v);
    });
    for (int p = 0; p < c_.world(); ++p) {
      if (p == rank()) continue;
      const CUdeviceptr slot = mem_.window() + CUdeviceptr(c_.ws.slot(c_.ws.cpu_barrier, p));
      const auto start = clock::now();
      for (uint64_t spin = 0;; ++spin) {
        uint64_t v = 0;
        translating(rank(), [&] { RF_CU(cuMemcpyDtoH, &v, slot, sizeof v); });
        if (seq_reached(v, s)) break;
        if (c_.abort.stopping.load(std::memory_order_relaxed))
          throw Error("RANK_FAILED", "rank " + std::to_string(rank()) + " is shutting down", rank(),
                      phase_name(kPhaseCpuBarrier));
        const int failed = c_.abort.failed_rank.load(std::memory_order_relaxed);
        if (failed >= 0)
          throw Error("RANK_FAILED",
                      "rank " + std::to_string(failed) + " failed while rank " + std::to_string(rank()) +
                          " waited in barrier (CPU sync) on cpu_barrier[from rank " + std::to_string(p) + "]",
                      failed, phase_name(kPhaseCpuBarrier));
        const double waited = std::chrono::duration<double>(clock::now() - start).count();
        if (waited > c_.cfg.cpu_timeout_s)
          throw Error("TIMEOUT_CPU",
                      "CPU-sync wait of rank " + std::to_string(rank()) + " in barrier (CPU sync) timed out after " +
                          seconds_text(c_.cfg.cpu_timeout_s) + " s on counter cpu_barrier[from rank " +
                          std::to_string(p) + "] (last value " + hex(v) + ")",
                      p, phase_name(kPhaseCpuBarrier));
        if (spin > 64) std::this_thread::sleep_for(std::chrono::microseconds(waited > 0.01 ? 100 : 5));
      }
    }
  }

  Context& c_;
  int ordinal_ = -1;
  std::unique_ptr<cuda::DeviceContext> dev_;
  cuda::SymmetricMemory mem_;
  std::unique_ptr<cuda::Kernels> kernels_;
  std::unique_ptr<cuda::AgrsKernels> agrs_;
  CUdeviceptr segments_ = 0, stage_ = 0;  // engram: host segment of every rank; driver-mode staging
  int64_t stage_bytes_ = 0;
  // bench/gpu-agrs on 2x H200: peer-pointer puts beat copy engines up to 32 MiB per destination
  // (329 vs 326 GB/s in the first run), copy engines win at 64 MiB (355 vs 341).
  int ce_min_bytes_ = 48 << 20;
  CUstream stream_ = nullptr;
  cuda::HostWorkspace diag_;
  CUdeviceptr scratch_ = 0, arrivals_ = 0;
  cuda::ncclComm_t comm_ = nullptr;
  cuda::ncclWindow_t window_ = nullptr;
  std::unique_ptr<MoeDevice> moe_;
  uint32_t a_seq_ = 0;
  bool dead_ = false, destroyed_ = false;
  std::string death_;
};

}  // namespace

Error to_error(const cuda::CudaError& e, int rank) {
  if (e.code == "EINVAL" || e.code == "BACKEND_UNAVAILABLE") return Error(e.code, e.what());
  std::string note;
  const int culprit = trapped_elsewhere(rank, &note);
  return Error("RANK_FAILED", "rank " + std::to_string(rank) + ": " + e.what() + note, culprit >= 0 ? culprit : rank);
}

std::unique_ptr<DeviceBackend> make_cuda_rank(Context& c) { return std::make_unique<CudaRank>(c); }

}  // namespace rankflow::gpu
