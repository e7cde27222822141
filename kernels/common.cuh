// Device-side building blocks every rankflow kernel uses: system-scope release/acquire accesses for
// cross-GPU signals, the global timer, the op's sequence number (graphs: from the device epoch), the
// bounded signal wait that gives up instead of hanging or trapping, the grid-wide arrival, and the
// vector copies. Signal layouts and slot offsets come from protocol.hpp, shared with the host executor.
#pragma once

#include <cstdint>

#include "args.hpp"

namespace rankflow::kernels {

using namespace rankflow::kargs;

constexpr int kWarpSize = 32;

// Signals cross GPUs (NVLink) and may sit in host memory (hybrid segments): system scope throughout.
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
// Between the blocks of one grid (the fused dispatch's counts and flags): GPU scope is enough.
__device__ __forceinline__ void st_release_gpu(uint64_t* p, uint64_t v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed_gpu(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

// After a relaxed load saw a peer's release: orders this thread's later loads after it (system scope).
__device__ __forceinline__ void fence_acquire_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
__device__ __forceinline__ void fence_acquire_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// The scope a kernel's waits and arrivals order at. Sys: peers on other GPUs or in host memory.
// Gpu: every rank of the world is a stream of this GPU and every signal and tensor is its device
// memory (ranks sharing one GPU): GPU-scope fences are enough, and system-scope ones are not free
// (they serialise across the GPU: with one per waiting thread of every block, a 4-rank peer reduce of
// 1 MiB took 27 us per op on an H200; at GPU scope, 16 us).
enum class Scope { Gpu, Sys };
template <Scope S>
__device__ __forceinline__ uint64_t ld_acquire(const uint64_t* p) {
  if constexpr (S == Scope::Sys) return ld_acquire_sys(p);
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
template <Scope S>
__device__ __forceinline__ void fence_acquire() {
  if constexpr (S == Scope::Sys) fence_acquire_sys();
  else fence_acquire_gpu();
}

// How often a wait looks at the give-up flags. The abort words are in mapped host memory: hundreds of
// waiting warps reading them every 4 us saturated PCIe reads and slowed everything (one H200: a
// 128-token dispatch 518 us of device time, a 2-rank combine of 4096 tokens 21 ms; every 100 us:
// 18.5 us and 170 us). An abort is seen within 0.1 ms.
constexpr uint64_t kGiveUpCheckNs = 100000;

// Nanoseconds, the same clock on every GPU of the node (readable without a fence).
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// This op's sequence number: the launcher's, or in a captured graph the replay's epoch plus the op's
// offset (the epoch is advanced by the graph's last node, so every replay is a new collective).
__device__ __forceinline__ uint64_t op_seq(const RankArgs& a) {
  return a.epoch != nullptr ? a.seq + *reinterpret_cast<const volatile uint64_t*>(a.epoch) : a.seq;
}

// The ranks serving (bit p: rank p), once at a kernel's start: an elastic group's live mask, written by
// the host between ops into this rank's workspace (RankArgs::live). No signal goes to, and no wait is
// for, a rank outside it. Every rank where there is no such word.
__device__ __forceinline__ uint64_t live_ranks(const RankArgs& a) {
  return a.live != nullptr ? *reinterpret_cast<const volatile uint64_t*>(a.live) : ~uint64_t(0);
}

// The slot `array`[peer] of the workspace at the start of `window`.
__device__ __forceinline__ uint64_t* slot_at(uint64_t window, const WorkspaceLayout& ws, int64_t array, int peer) {
  return reinterpret_cast<uint64_t*>(window + uint64_t(ws.slot(array, peer)));
}

// A signal: the payload, then the sequence number with release (what this thread stored before is
// visible to whoever acquires the sequence number).
template <Scope S = Scope::Sys>
__device__ __forceinline__ void signal(uint64_t* slot, uint64_t seq, uint64_t payload = 0, uint64_t tag = 0) {
  st_relaxed_sys(slot + kSignalPayloadWord, payload);
  st_relaxed_sys(slot + kSignalTagWord, tag);
  if constexpr (S == Scope::Sys) st_release_sys(slot + kSignalSeqWord, seq);
  else st_release_gpu(slot + kSignalSeqWord, seq);
}

// A signal whose ordering comes from a later one: all relaxed, for a batch of slots that a release of
// the same thread block publishes (after a __syncthreads and a system fence). A release per slot is a
// system fence per slot, and those serialise across the GPU: 256 expert counts signalled with
// releases were most of a dispatch notify (17.5 us at 4096 tokens).
__device__ __forceinline__ void signal_relaxed(uint64_t* slot, uint64_t seq, uint64_t payload = 0) {
  st_relaxed_sys(slot + kSignalPayloadWord, payload);
  st_relaxed_sys(slot + kSignalTagWord, 0);
  st_relaxed_sys(slot + kSignalSeqWord, seq);
}

// arrivals[0]: the grid-wide arrival count; arrivals[1]: set once any wait of this rank gave up
// (device memory, so the kernels' own checks cost no PCIe read). Never reset: a rank that gave up is
// dead for the protocol, and the host refuses its next op. arrivals[2]: the fused dispatch's end
// count; arrivals[3]: rf_dispatch_data's work tickets (dispatch.cu).
__device__ __forceinline__ bool gave_up(const unsigned int* arrivals) {
  return *reinterpret_cast<const volatile unsigned int*>(arrivals + 1) != 0;
}

// Records the first timeout in the Control block (plain volatile stores: host-mapped memory has no
// reliable atomics over PCIe), code last, and makes it visible to the CPU.
__device__ __noinline__ void record_timeout(Control* ctl, Phase phase, int peer, uint64_t last, uint64_t want) {
  if (ctl == nullptr) return;
  volatile Control* c = ctl;
  if (c->diag.code != 0) return;
  c->diag.phase = phase;
  c->diag.peer = uint64_t(peer);
  c->diag.value = last;
  c->diag.want = want;
  __threadfence_system();
  c->diag.code = kDiagTimeout;
  __threadfence_system();
}

// Whether to stop waiting: another wait of this rank gave up (device flag), or the main thread raised
// the rank's abort words (a peer failed, the rank is torn down, or the run released this op: a rank
// program ended; a read of mapped host memory, so only every few µs: kGiveUpCheckNs). The release is
// one 64-bit word, read at once (protocol.hpp AbortWords).
__device__ __forceinline__ bool should_give_up(const RankArgs& a) {
  if (gave_up(a.arrivals)) return true;
  if (a.abort == nullptr) return false;
  const volatile int32_t* w = a.abort;
  // kLeftRank: a peer left an elastic group; the survivors' ops in flight end (RANK_FAILED), they live on.
  if (w[AbortWords::kFailedRank] != 0 || w[AbortWords::kStopping] != 0 || w[AbortWords::kLeftRank] != 0) return true;
  const uint64_t released_above = *reinterpret_cast<const volatile uint64_t*>(w + AbortWords::kReleasedAbove);
  return released_op(released_above, op_seq(a));
}

__device__ __forceinline__ void mark_gave_up(const RankArgs& a) {
  *reinterpret_cast<volatile unsigned int*>(a.arrivals + 1) = 1u;
  __threadfence();
}

// Spins until `done(value)` holds for the word at `p` (acquire); true then. false when it gave up:
// the CPU raised abort, another wait of this rank gave up, or this one timed out (it records the
// Diagnostic). Never traps: the kernel finishes, the host reads the Control block. Acquire false: the
// word is all the waiter reads (the fused dispatch's counts), no acquire; *seen: the word that did it;
// want: the sequence number waited for, if that is what done() asks (the Diagnostic names it).
template <bool Acquire = true, Scope S = Scope::Sys, typename Done>
__device__ __forceinline__ bool wait_until(const uint64_t* p, Done done, const RankArgs& a, Phase phase, int peer,
                                           uint64_t* seen = nullptr, uint64_t want = 0) {
  uint64_t v = Acquire ? ld_acquire<S>(p) : ld_relaxed_sys(p);
  if (seen != nullptr) *seen = v;
  if (done(v)) return true;
  // Polls are relaxed loads (an acquire on every poll of hundreds of spinning warps loads the memory
  // system that the peers' stores need); the acquire comes once the value is there. The give-up
  // checks (one of them reads mapped host memory) only every few microseconds, the first after one.
  const uint64_t start = globaltimer_ns();
  uint64_t next_check = start + kGiveUpCheckNs;
  while (true) {
    v = ld_relaxed_sys(p);
    if (done(v)) {
      if (seen != nullptr) *seen = v;
      if (Acquire) fence_acquire<S>();
      return true;
    }
    const uint64_t now = globaltimer_ns();
    if (now >= next_check) {
      if (should_give_up(a)) break;
      next_check = now + kGiveUpCheckNs;
    }
    if (now - start > a.timeout_ns) {
      record_timeout(a.ctl, phase, peer, v, want);
      break;
    }
  }
  mark_gave_up(a);
  return false;
}

// Waits for the slot's sequence number to reach `seq`; payload and tag are read after the acquire.
template <Scope S = Scope::Sys>
__device__ __forceinline__ bool wait_signal(const uint64_t* slot, uint64_t seq, const RankArgs& a, Phase phase, int peer,
                                            uint64_t* payload = nullptr, uint64_t* tag = nullptr) {
  const bool ok = wait_until<true, S>(slot + kSignalSeqWord, [seq](uint64_t v) { return seq_reached(v, seq); }, a, phase, peer, nullptr, seq);
  if (ok && payload != nullptr) *payload = ld_relaxed_sys(slot + kSignalPayloadWord);
  if (ok && tag != nullptr) *tag = ld_relaxed_sys(slot + kSignalTagWord);
  return ok;
}

// A refused input, reported once per op to the host (the Control block is this rank's alone and its
// ops are stream-ordered, so a plain check-then-write suffices).
__device__ __noinline__ void report_bad(Control* ctl, uint64_t seq, int64_t index, int64_t value) {
  if (ctl == nullptr) return;
  volatile Control* c = ctl;
  if (c->bad_seq != 0) return;
  c->bad_index = index;
  c->bad_value = value;
  __threadfence_system();
  c->bad_seq = seq;
  __threadfence_system();
}

// The peers' window bases, in shared memory (every signal and store needs one).
__device__ __forceinline__ void load_peers(uint64_t* peers, const RankArgs& a) {
  for (int p = int(threadIdx.x); p < a.world; p += int(blockDim.x)) peers[p] = a.peers[p];
  __syncthreads();
}

// Every block calls it after its stores: true in the one block that arrives last, once every block's
// stores are visible system-wide (the block's barrier, then one system fence by its first thread,
// cumulative over the stores the barrier ordered before it, then a grid-wide count). One fence per
// block, not per thread: system-scope fences serialise across the GPU (a fence in each of 132 x 512
// threads cost ~600 us per dispatch on an H200). The count is left at zero for the next launch on
// the stream. Every thread of a block gets the same answer.
template <Scope S = Scope::Sys>
__device__ __forceinline__ bool last_block_arrived(unsigned int* arrivals) {
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) {
    if constexpr (S == Scope::Sys) __threadfence_system();
    else __threadfence();
    last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return false;
  __threadfence();  // acquire the other blocks' arrivals (their fences came before their atomicAdd)
  if (threadIdx.x == 0) *arrivals = 0;
  return true;
}

// A barrier of the whole grid, whose blocks must be resident at once (a cooperative launch, or a grid
// of Launcher::grid_for's size): it returns in every block once every block has called it, with what
// each block stored before it visible to all of them (the block's barrier, a GPU-scope fence by its
// first thread, the arrival; a fence after the wait). It counts on arrivals[0], as last_block_arrived
// does, so a kernel calls one of them, once: arrivals in the low 16 bits (grids below 65536 blocks),
// departures in the high ones, so a block that gave up and left early passes nobody through; the last
// to leave zeroes the word for the next launch on the stream. Bounded like a signal wait: false when
// it gave up (the rank's give-up flag or abort words, or a.timeout_ns, which records the Diagnostic
// naming `phase` and this rank); the word still ends at zero, and the caller must drop what the
// barrier guarded. Every thread of a block gets the same answer.
__device__ __forceinline__ bool grid_barrier(const RankArgs& a, Phase phase) {
  __shared__ bool passed;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int* count = a.arrivals;
    const volatile unsigned int* seen = count;
    const unsigned int n = gridDim.x;
    bool ok = true;
    __threadfence();
    atomicAdd(count, 1u);
    if ((*seen & 0xffffu) < n) {
      const uint64_t start = globaltimer_ns();
      uint64_t next_check = start + kGiveUpCheckNs;
      while (ok && (*seen & 0xffffu) < n) {
        const uint64_t now = globaltimer_ns();
        if (now >= next_check) {
          ok = !should_give_up(a);
          next_check = now + kGiveUpCheckNs;
        }
        if (ok && now - start > a.timeout_ns) {
          record_timeout(a.ctl, phase, a.rank, *seen & 0xffffu, 0);
          ok = false;
        }
      }
      if (!ok) mark_gave_up(a);
    }
    __threadfence();  // acquire the other blocks' stores (their fences came before their arrival)
    passed = ok;
    if (atomicAdd(count, 0x10000u) == ((n - 1) << 16) + n) *count = 0;  // the last to leave
  }
  __syncthreads();
  return passed;
}

// dst[c] += the sum of src[g * cols + c] over the rows g in [lo, hi), by the whole block: several
// threads per column when there are fewer columns than threads (their sums meet in shared atomics).
__device__ __forceinline__ void add_rows(int* dst, const int32_t* src, int cols, int lo, int hi) {
  const int nt = int(blockDim.x);
  const int parts = max(1, min(hi - lo, nt / max(1, cols)));
  for (int i = int(threadIdx.x); i < cols * parts; i += nt) {
    const int c = i % cols;
    int s = 0;
    for (int g = lo + i / cols; g < hi; g += parts) s += src[int64_t(g) * cols + c];
    if (s != 0) atomicAdd(&dst[c], s);
  }
}

// Rows of a small batch in chunks: when there are more warps than rows, a row's 16-byte loads run
// side by side in several warps (work item = row * chunks + chunk) instead of one step after another
// in one warp (a 128-token op is latency-bound otherwise). With no more warps than rows, one chunk
// per row. `vecs`: 16-byte vectors per chunk, a multiple of the warp size.
struct RowChunks {
  int64_t chunks;
  int64_t vecs;
};
__device__ __forceinline__ RowChunks row_chunks(int64_t rows, int64_t warps, int64_t row_vecs) {
  const int64_t lane_loads = (row_vecs + kWarpSize - 1) / kWarpSize;  // per lane, for a whole row
  const int64_t chunks = rows > 0 ? max(int64_t(1), min(lane_loads, warps / rows)) : int64_t(1);
  return RowChunks{chunks, ((lane_loads + chunks - 1) / chunks) * kWarpSize};
}

// ---- bulk copies ----
// Independent 16-byte loads in flight per lane before the first store (Hopper: several per thread).
constexpr int kCopyUnroll = 4;
constexpr int64_t kCopyChunkBytes = int64_t(kWarpSize) * kCopyUnroll * 16;  // 2 KiB per warp step

// Read-only input, streamed once: a 16-byte non-coherent load with no L1 allocation.
__device__ __forceinline__ int4 ld_nc_v4(const void* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// Asks L2 for rows [first, first + rows) of a row-major input (row_bytes a multiple of 16) without
// waiting for them: a later load of those bytes finds them there. sm_90: one bulk prefetch per row
// (the copy engine walks it); earlier GPUs: a prefetch per 128-byte line, spread over the block.
__device__ __forceinline__ void prefetch_rows_l2(const char* x, int64_t first, int rows, int64_t row_bytes) {
  const int tid = int(threadIdx.x), nt = int(blockDim.x);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (int r = tid; r < rows; r += nt)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(x + (first + r) * row_bytes), "r"(unsigned(row_bytes)) : "memory");
#else
  const int64_t lines = (int64_t(rows) * row_bytes + 127) / 128;
  const char* p = x + first * row_bytes;
  for (int64_t l = tid; l < lines; l += nt) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + l * 128));
#endif
}

// Data another agent wrote before a signal we acquired: a plain (coherent) load.
__device__ __forceinline__ int4 ld_v4(const void* p) { return *static_cast<const int4*>(p); }
__device__ __forceinline__ void st_v4(void* p, const int4& v) {
  asm volatile("st.global.L1::no_allocate.v4.s32 [%0], {%1, %2, %3, %4};"
               :
               : "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// One warp copies chunk `chunk` (kCopyChunkBytes) of `vecs` 16-byte vectors: all loads first, then the
// stores, so that kCopyUnroll loads per lane are in flight over NVLink.
__device__ __forceinline__ void warp_copy_chunk(int4* out, const int4* in, int64_t chunk, int64_t vecs, int lane) {
  int4 v[kCopyUnroll];
#pragma unroll
  for (int u = 0; u < kCopyUnroll; ++u) {
    const int64_t i = chunk * (kCopyChunkBytes / 16) + u * kWarpSize + lane;
    if (i < vecs) v[u] = ld_nc_v4(in + i);
  }
#pragma unroll
  for (int u = 0; u < kCopyUnroll; ++u) {
    const int64_t i = chunk * (kCopyChunkBytes / 16) + u * kWarpSize + lane;
    if (i < vecs) out[i] = v[u];
  }
}

// bf16x2 in a 32-bit word -> two floats (exact).
__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

}  // namespace rankflow::kernels
