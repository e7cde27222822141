// The protocol every executor of rankflow speaks: the layouts of a rank's symmetric window (workspace
// of signal slots, then the buffer of receive regions), how a signal is written and read, the rank's
// Control block in mapped host memory, and the bf16 rounding rule. Defined once here and shared by the
// host executor (native/src/backends/host), the CUDA kernels (kernels/*.cu), their launchers and,
// through the addon's `layout()` export, the TypeScript tests. Plain structs, for g++ and nvcc alike.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define RF_HD __host__ __device__ __forceinline__
#else
#define RF_HD inline
#endif

namespace rankflow {

// 2 MiB: huge pages on the host, and the cuMem allocation granularity on H100/H200.
constexpr int64_t kAlignment = int64_t(2) << 20;
// Every region inside the buffer starts on a 256-byte boundary so 16-byte vector loads and TMA work.
constexpr int64_t kRegionAlignment = 256;
// Signal slots are padded to a cache line so that two writers never share one.
constexpr int64_t kSlotBytes = 64;
constexpr int kMaxRanks = 64;
// fp8 scales: one fp32 per 128 hidden elements (DeepSeek's block scaling).
constexpr int64_t kFp8BlockSize = 128;

RF_HD constexpr int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// A signal slot: word 0 is the sequence number of the op that wrote it (64 bits: it never wraps; 0 =
// never written), word 1 its payload (a count, an offset), word 2 its tag (the fingerprint of the
// dispatch layout an `enter` serves: ranks replaying different handles together find out). The
// writer stores payload and tag, then the sequence number with release semantics; the reader acquires
// the sequence number, then reads the rest. A slot is never rewritten before its reader consumed it:
// the writer's next op waits for a signal the reader sends only after reading (enter, done), so the
// words cannot tear.
constexpr int64_t kSignalSeqWord = 0;
constexpr int64_t kSignalPayloadWord = 1;
constexpr int64_t kSignalTagWord = 2;
// Words 3-5 of an `enter` slot: the addresses a peer reduction (rf_peer_reduce) publishes with its
// enter: its input, its output, and which of them are offsets into its window (bit 0: input, bit 1:
// output; else device addresses, valid for peers of its process). Same lifetime as the payload.
// A combine in pull mode (kernels/combine.cu) publishes its x and its weights' device addresses in
// words 3 and 4 of its enter slot alike.
constexpr int64_t kSignalAddrWord = 3;
// Word 6 of rank 0's `enter` slots in a peer reduction of ranks sharing a GPU: where the workspace's
// ticket (WorkspaceLayout::ticket) stood as rank 0 entered, the first chunk's number.
constexpr int64_t kSignalTicketWord = 6;
RF_HD bool seq_reached(uint64_t slot_seq, uint64_t seq) { return slot_seq >= seq; }
// The words of the workspace's `live` slot (WorkspaceLayout::live).
constexpr int64_t kLiveMaskWord = 0;
constexpr int64_t kLiveEpochWord = 1;
RF_HD bool rank_live(uint64_t live_mask, int rank) { return ((live_mask >> rank) & 1u) != 0; }
RF_HD uint64_t all_ranks_mask(int world) { return world >= 64 ? ~uint64_t(0) : (uint64_t(1) << world) - 1; }

// Kinds of slot arrays in the workspace, each `world_size` slots wide (one per peer), except the
// expert counts ([W][local experts]).
struct WorkspaceLayout {
  int32_t world_size = 0;
  int32_t num_local_experts = 0;
  int64_t barrier = 0;       // [W] barrier epochs, written by each peer
  int64_t cpu_barrier = 0;   // [W] second round of a barrier with CPU sync
  int64_t enter = 0;         // [W] "rank p entered op seq": its buffer may be written for that op (payload: offset)
  int64_t done = 0;          // [W] "rank p finished writing into my buffer for op seq"
  int64_t rank_count = 0;    // [W] dispatch notify: tokens rank p sends me (payload)
  int64_t expert_count = 0;  // [W][num_local_experts] dispatch notify: per local expert, from rank p
  int64_t session = 0;       // [W] AGRS session signals (open = 2i+1, close = 2i+2)
  // One slot, written only by the rank itself while none of its ops runs (a membership change of an
  // elastic group): word kLiveMaskWord the ranks serving (bit p: rank p), kLiveEpochWord how many
  // membership changes the group made. Every op reads the mask when it starts and neither signals,
  // writes into, nor waits for a rank outside it; a kernel reads it from its own window, so that a
  // captured graph follows the membership it replays in.
  int64_t live = 0;
  // One slot, rank 0's only used: word 0 counts the chunks of peer reductions drawn by the blocks of
  // ranks sharing a GPU (session.cu reduce_shared); it only grows.
  int64_t ticket = 0;
  int64_t bytes = 0;         // 2 MiB aligned

  RF_HD static WorkspaceLayout make(int32_t world_size, int32_t num_local_experts) {
    WorkspaceLayout l;
    l.world_size = world_size;
    l.num_local_experts = num_local_experts;
    int64_t off = 0;
    const int64_t row = int64_t(world_size) * kSlotBytes;
    l.barrier = off;      off += row;
    l.cpu_barrier = off;  off += row;
    l.enter = off;        off += row;
    l.done = off;         off += row;
    l.rank_count = off;   off += row;
    l.session = off;      off += row;
    l.live = off;         off += kSlotBytes;
    l.ticket = off;       off += kSlotBytes;
    l.expert_count = off; off += row * (num_local_experts > 0 ? num_local_experts : 1);
    l.bytes = align_up(off, kAlignment);
    return l;
  }
  RF_HD int64_t slot(int64_t array, int32_t peer) const { return array + int64_t(peer) * kSlotBytes; }
  RF_HD int64_t expert_slot(int32_t peer, int32_t local_expert) const {
    return expert_count + (int64_t(peer) * num_local_experts + local_expert) * kSlotBytes;
  }
};

// Phases, as waits and failures name them: one list (enumerator, name) that the enum, phase_name()
// (runtime/wait.cc) and the addon's `abi.phases` (binding/layout.cc; test/abi.test.ts) are made from.
#define RF_PHASES(X)                                                   \
  X(kPhaseNone, "none")                                                \
  X(kPhaseBarrier, "barrier")                                          \
  X(kPhaseCpuBarrier, "barrier (CPU sync)")                            \
  X(kPhaseEnter, "enter")                                              \
  X(kPhaseNotify, "dispatch notify")                                   \
  X(kPhaseDispatchData, "dispatch data")                               \
  X(kPhaseCombineData, "combine data")                                 \
  X(kPhaseAllGather, "allGather")                                      \
  X(kPhaseSessionOpen, "session open")                                 \
  X(kPhaseSessionClose, "session close")                               \
  X(kPhaseSessionGather, "session allGather")                          \
  X(kPhaseSessionReduce, "session reduceScatter")                      \
  X(kPhasePipeline, "pipeline send/recv")                              \
  X(kPhaseEngram, "engram")                                            \
  X(kPhasePeerReduce, "peer reduce")                                   \
  X(kPhaseScaleoutConnect, "scale-out connect") /* forming the scale-out connections (runtime/scaleout.hpp) */

enum Phase : uint64_t {
#define RF_PHASE_ENUM(id, name) id,
  RF_PHASES(RF_PHASE_ENUM)
#undef RF_PHASE_ENUM
  kPhaseCount
};

// What a device wait that gave up leaves behind for the host.
struct Diagnostic {
  uint64_t code;   // 0 = none, kDiagTimeout = timed out
  uint64_t phase;  // Phase
  uint64_t peer;   // the rank waited on
  uint64_t value;  // the slot's sequence number seen last
  uint64_t want;   // the sequence number the wait wanted (0: a wait for another kind of value)
};
constexpr uint64_t kDiagTimeout = 1;

// A rank's Control block, in pinned host memory mapped into its GPU (one per rank, shared by all of
// its kernels). Device waits never trap: a wait that times out records the Diagnostic (first one
// wins) and gives up; a wait that sees the rank's abort words raised (kargs::RankArgs::abort: a peer
// failed, the rank is torn down) gives up too. Every later wait gives up at once, the kernels skip
// their work and finish, the host reads the block and fails the op; the CUDA context stays usable.
// `bad_*` report inputs the kernels refused: the host turns them into EINVAL.
struct Control {
  Diagnostic diag;
  uint64_t bad_seq;        // GPU -> CPU: the op that refused an input (0 = none; first one wins)
  int64_t bad_index;       // >= 0: position in topkIdx of an expert id outside [-1, numExperts);
                           // kBadHandle: a peer replays another dispatch's handle (bad_value = peer)
                           // kBadShape: a peer reduces another element count or dtype (bad_value = peer)
  int64_t bad_value;       // the id, or the peer
  uint64_t completed_seq;  // GPU -> CPU: the last op whose final kernel ran to its end (barrier)
  int32_t abort_mirror[8]; // the abort words (AbortWords), copied here by the CPU where the GPU cannot map them
  uint64_t synced_seq;     // stream -> CPU: the last stream wait reached (cuda: a stream memory op writes it)
};
constexpr int64_t kBadHandle = -2;
constexpr int64_t kBadShape = -3;

// The abort words: int32 words in a SharedArrayBuffer that the main thread writes (Atomics) and every
// wait of the rank reads, natively and in its kernels (runtime/abort.hpp; actors/core/addon.ts ABORT
// is generated from this, test/abi.test.ts compares). Two ways to end a rank's waits:
// - a failure (a peer died, the rank is torn down): kFailedRank or kStopping; the rank is done;
// - a peer left an elastic group (kLeftRank): the rank's ops end with RANK_FAILED naming it, from
//   their waits and at their start, until the group re-forms without it (the rank lives on);
// - a release (a rank program threw, or returned while its peers still wait): ops with a sequence
//   number >= the u64 at kReleasedAbove give up (1: every op; a program that returned after op S
//   releases S + 1 and later, which it will never enter); the rank lives on and is re-synchronised.
// The reasons' UTF-8 text follows the words: the failure's at kFailureReasonAt, the release's at
// kReleaseReasonAt, each written with its length before the word that raises it.
struct AbortWords {
  static constexpr int kFailedRank = 0;          // failed rank + 1; 0 = none
  static constexpr int kStopping = 1;            // non-zero: the rank is being torn down
  static constexpr int kFailureReasonBytes = 2;
  static constexpr int kReleaseOrigin = 3;       // the rank whose program ended the run + 1
  static constexpr int kReleasedAbove = 4;       // u64 (words 4-5, 8-byte aligned): 0 = not released
  static constexpr int kReleaseReasonBytes = 6;
  static constexpr int kLeftRank = 7;            // elastic: the rank that left + 1; 0 = none (reason: the failure's)
  static constexpr int kWords = 8;
  static constexpr int kMaxReason = 1024;
  static constexpr int kFailureReasonAt = kWords * 4;                  // bytes
  static constexpr int kReleaseReasonAt = kFailureReasonAt + kMaxReason;
  static constexpr int kBytes = kReleaseReasonAt + kMaxReason;         // what one rank's words take
};
constexpr int kAbortWords = AbortWords::kWords;
// Whether op `seq` is released by the word at kReleasedAbove (read as one 64-bit load).
RF_HD bool released_op(uint64_t released_above, uint64_t seq) { return released_above != 0 && seq >= released_above; }

// Token routing sizes of the MoE buffer.
struct EpConfig {
  int32_t world_size = 1;
  int64_t max_tokens_per_rank = 0;
  int64_t hidden = 0;
  int64_t topk = 0;
  int64_t num_experts = 0;
  bool fp8 = false;
};

// The buffer that follows the workspace: one receive region shared by every operation. The `enter`
// signal guards reuse: nobody writes into rank p's buffer for op s before p announced it entered s,
// and p enters s only once it is done reading op s-1.
struct BufferLayout {
  int64_t slots = 0;                // W * max_tokens_per_rank receive slots (source rank major)
  int64_t x_bytes_per_token = 0;    // hidden * 2: a bf16 row; fp8 rows use the first half of a slot
  int64_t scales_per_token = 0;     // hidden / 128 (fp8 only)
  // dispatch receive region, structure of arrays (each a dense output tensor, rows in receive order)
  int64_t x = 0, scales = 0, topk_idx = 0, topk_weights = 0, src_token = 0, src_rank = 0, dispatch_bytes = 0;
  // combine receive region: rows that rank p returns for my token t sit at slot p * max_tokens + t;
  // combine_flags: a uint64 arrival flag per slot (the CUDA combine's split mode, kernels/combine.cu)
  int64_t combine_x = 0, combine_weights = 0, combine_flags = 0, combine_bytes = 0;
  int64_t bytes = 0;                // max of the regions, 2 MiB aligned

  RF_HD static BufferLayout make(const EpConfig& c) {
    BufferLayout l;
    l.slots = int64_t(c.world_size) * c.max_tokens_per_rank;
    l.x_bytes_per_token = c.hidden * 2;  // bf16 dispatch stays possible on an fp8 buffer
    l.scales_per_token = c.fp8 ? c.hidden / kFp8BlockSize : 0;
    int64_t off = 0;
    l.x = off;            off = align_up(off + l.slots * l.x_bytes_per_token, kRegionAlignment);
    l.scales = off;       off = align_up(off + l.slots * l.scales_per_token * 4, kRegionAlignment);
    l.topk_idx = off;     off = align_up(off + l.slots * c.topk * 4, kRegionAlignment);
    l.topk_weights = off; off = align_up(off + l.slots * c.topk * 4, kRegionAlignment);
    l.src_token = off;    off = align_up(off + l.slots * 4, kRegionAlignment);
    l.src_rank = off;     off = align_up(off + l.slots * 4, kRegionAlignment);
    l.dispatch_bytes = off;
    off = 0;
    l.combine_x = off;       off = align_up(off + l.slots * c.hidden * 2, kRegionAlignment);
    l.combine_weights = off; off = align_up(off + l.slots * c.topk * 4, kRegionAlignment);
    l.combine_flags = off;   off = align_up(off + l.slots * 8, kRegionAlignment);
    l.combine_bytes = off;
    const int64_t need = l.dispatch_bytes > l.combine_bytes ? l.dispatch_bytes : l.combine_bytes;
    l.bytes = align_up(need > 0 ? need : 1, kAlignment);
    return l;
  }
};

// Bytes of symmetric memory (workspace + buffer) the MoE buffer needs: DeepEP's size hint.
RF_HD int64_t size_hint(const EpConfig& c) {
  const int32_t local = c.world_size > 0 ? int32_t(c.num_experts / c.world_size) : 0;
  return WorkspaceLayout::make(c.world_size, local).bytes + BufferLayout::make(c).bytes;
}

// Combine's per-row arrival flag (split mode): the op's sequence number times an odd constant, so
// that a flag is never 0 and stale bytes in the (shared) region equal it with chance 2^-64.
RF_HD uint64_t combine_flag(uint64_t seq) { return seq * 0x9E3779B97F4A7C15ull; }

// A peer reduction's enter tag: its element count and dtype (never 0, a tag the other ops leave).
RF_HD uint64_t peer_reduce_tag(int64_t n, bool bf16) { return (uint64_t(n) << 2) | (bf16 ? 3u : 1u); }
// Its slice of rank r of n elements, in units of 8 (whole 16-byte vectors of fp32 or bf16): [*lo, *hi).
RF_HD void peer_reduce_slice(int64_t n, int world, int rank, int64_t* lo, int64_t* hi) {
  const int64_t per = ((n + 7) / 8 + world - 1) / world * 8, first = int64_t(rank) * per, last = first + per;
  *lo = first < n ? first : n;
  *hi = last < n ? last : n;
}

// bf16 <-> fp32, round to nearest even, NaN kept quiet: the host executor and the kernels agree bit for bit.
RF_HD float bf16_to_float(uint16_t b) {
  union { uint32_t u; float f; } v;
  v.u = uint32_t(b) << 16;
  return v.f;
}
RF_HD uint16_t float_to_bf16(float f) {
  union { uint32_t u; float f; } v;
  v.f = f;
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return uint16_t((v.u >> 16) | 0x40);
  v.u += 0x7fffu + ((v.u >> 16) & 1u);
  return uint16_t(v.u >> 16);
}

}  // namespace rankflow
