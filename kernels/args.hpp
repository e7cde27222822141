// The ABI between rankflow's CUDA kernels (kernels/*.cu) and their launchers
// (native/src/backends/cuda/launch.cc): one argument struct per kernel, passed by value as the
// kernel's only parameter. Plain structs of fixed-width fields and pointers, laid out identically by
// g++ and nvcc. Slot and region offsets come from protocol.hpp.
//
// Where dispatched rows land: sender r writes its i-th token for receiver p (token order) straight
// into p's buffer at row recv_offset_p[r] + i, i.e. already compacted in the receive order of the host
// executor (by source rank, then source token). Each buffer region then holds a dense output tensor:
// x at buf.x (row = hidden * x_elem_bytes), scales at buf.scales, topk_idx at buf.topk_idx,
// topk_weights at buf.topk_weights, src_token at buf.src_token, src_rank at buf.src_rank: the same
// addresses after every dispatch. The receiver tells each sender its offset in the payload of its
// `enter` signal.
#pragma once

#include <cstdint>

#include "protocol.hpp"

namespace rankflow::kargs {

// What every collective kernel of a rank gets: its view of the windows, this op's sequence number,
// its Control block and the stream's grid-arrival word.
struct RankArgs {
  const uint64_t* peers = nullptr;   // device memory: rank p's window in this rank's address space
  int64_t buffer_offset = 0;         // of the buffer inside every window (the workspace is at 0)
  WorkspaceLayout ws;
  int32_t rank = 0, world = 1;
  uint64_t seq = 0;                  // this op's sequence number; in a captured graph its offset from *epoch
  const uint64_t* epoch = nullptr;   // graph replays: the op's sequence number is *epoch + seq (device memory)
  uint64_t timeout_ns = 0;           // a device wait longer than this gives up and records Control.diag
  Control* ctl = nullptr;            // mapped host memory (device address)
  const int32_t* abort = nullptr;    // the rank's abort words as the GPU reads them (mapped host memory)
  // Two device words of the stream: [0] the grid-wide arrival count (kernels leave it zeroed),
  // [1] set once a wait of this rank gave up (common.cuh).
  unsigned int* arrivals = nullptr;
  // Elastic groups: this rank's own workspace `live` slot (protocol.hpp WorkspaceLayout::live), read at
  // run time so that a captured graph follows the membership it replays in; null: every rank serves.
  const uint64_t* live = nullptr;
};

// Peer sets as rings around the rank: destinations (rank + dst_start + k) % W for k < dst_count,
// sources (rank - src_start - k) mod W for k < src_count.
struct Ring {
  int32_t dst_start = 1, dst_count = 0, src_start = 1, src_count = 0;
};

// barrier (one block of kMaxRanks threads): every rank's epoch into every peer's `array` slot, then
// wait for all of theirs; with `complete`, Control.completed_seq = seq at the end (the CPU spins on it).
struct BarrierArgs {
  RankArgs r;
  int64_t array = 0;
  uint64_t phase = kPhaseBarrier;
  int32_t complete = 0, pad = 0;
};

// allGather outside a session: src (bytes, 16-byte multiple) into every rank's window at
// dst_offset + rank * bytes, enter round first, done round last. With parts > 1 (two levels: the
// parts of the rank's rail), part i at src + i * src_stride goes to dst_offset + i * part_stride +
// rank * bytes, all in the same rounds.
struct AllGatherArgs {
  RankArgs r;
  const void* src = nullptr;
  int64_t bytes = 0;
  int64_t dst_offset = 0;
  int64_t parts = 1;
  int64_t src_stride = 0, part_stride = 0;
};

// AGRS: batched write-and-wait of `value` in slot `array` (session open/close, enter and done rounds).
struct SignalArgs {
  RankArgs r;
  int64_t array = 0;
  uint64_t value = 0;
  Ring ring;
  uint64_t phase = kPhaseNone;
};

// AGRS puts: src + p * src_stride -> destination p's window at dst_offset (16-byte multiples and
// aligned), optional enter round first, then done to the destinations, waiting for the sources' done.
struct PutArgs {
  RankArgs r;
  const void* src = nullptr;
  int64_t src_stride = 0, bytes = 0, dst_offset = 0;
  Ring ring;
  int32_t enter = 0, pad = 0;
  uint64_t phase = kPhaseNone;
};

// reduce-scatter's sum: out[i] = sum over ranks q in rank order of region[q * n + i], fp32 accumulation.
struct ReduceArgs {
  const void* region = nullptr;
  int64_t n = 0;
  int32_t world = 1, bf16 = 0;
  void* out = nullptr;
};

// peer reduce: rank r sums (rank order, fp32 accumulation) its eighth-aligned slice r of every rank's
// `in` (n fp32 or bf16 elements) and writes the sums into the same slice of every rank's `out`. The
// addresses travel in the enter slots (protocol.hpp kSignalAddrWord); `window` says which are offsets
// into this rank's window (bit 0: in, bit 1: out). `tag` fingerprints (n, dtype): a peer whose tag
// differs is refused (Control.bad_*, kBadShape) and nothing moves; the done round still runs.
struct PeerReduceArgs {
  RankArgs r;
  const void* in = nullptr;
  void* out = nullptr;
  int64_t n = 0;
  uint64_t tag = 0;
  uint32_t window = 0;
  int32_t bf16 = 0;
  int32_t local = 0;  // every rank is a stream of this GPU (ranks sharing it): GPU-scope ordering
};

// engram: row g of the global table = row g % entries of rank g / entries's host segment.
struct FetchArgs {
  const uint64_t* segments = nullptr;  // [W] host segment of rank p in this rank's address space
  const int32_t* ids = nullptr;
  int64_t n = 0, entries = 0, row_bytes = 0;
  uint8_t* out = nullptr;
};

// ---- MoE dispatch and combine ----

struct MoeShape {
  int32_t hidden = 0, topk = 0;
  int32_t num_experts = 0, experts_per_rank = 0;
  int64_t max_tokens = 0;  // max_tokens_per_rank
  BufferLayout buf;
};

// The device state of one dispatch layout (pointers into one allocation cut by MoeStateLayout): what
// a handle keeps for cached dispatch and combine. The routing part first (copied as a whole for a
// cached dispatch), then the per-dispatch receive part.
struct MoeState {
  int32_t* send_count = nullptr;          // [W] tokens I send to rank p
  int32_t* recv_count = nullptr;          // [W] tokens rank p sends me
  int32_t* recv_offset = nullptr;         // [W + 1] first output row of rank p's tokens; [W] = num_recv
  int32_t* tokens_per_expert = nullptr;   // [experts_per_rank] received, unaligned
  uint64_t* dest_mask = nullptr;          // [max_tokens] bit p set when rank p receives token t
  int32_t* send_slot = nullptr;           // [max_tokens * W] token t's index among my tokens for rank p, or -1
  int32_t* recv_src_rank = nullptr;       // [W * max_tokens] source rank of output row o
  int32_t* recv_src_token = nullptr;      // [W * max_tokens]
  float* recv_topk_weights = nullptr;     // [W * max_tokens * topk]
  int32_t* send_offset = nullptr;         // [W] first row of my tokens in rank p's output
};

struct MoeStateLayout {
  int64_t send_count = 0, recv_count = 0, recv_offset = 0, tokens_per_expert = 0, dest_mask = 0,
          send_slot = 0, recv_src_rank = 0, routing_bytes = 0, recv_src_token = 0,
          recv_topk_weights = 0, send_offset = 0, bytes = 0;

  RF_HD static MoeStateLayout make(int32_t world, int64_t max_tokens, int64_t topk, int64_t experts_per_rank) {
    MoeStateLayout l;
    const int64_t a = kRegionAlignment;
    const int64_t t = max_tokens > 0 ? max_tokens : 1;
    int64_t off = 0;
    l.send_count = off;        off = align_up(off + world * 4, a);
    l.recv_count = off;        off = align_up(off + world * 4, a);
    l.recv_offset = off;       off = align_up(off + (world + 1) * 4, a);
    l.tokens_per_expert = off; off = align_up(off + (experts_per_rank > 0 ? experts_per_rank : 1) * 4, a);
    l.dest_mask = off;         off = align_up(off + t * 8, a);
    l.send_slot = off;         off = align_up(off + t * world * 4, a);
    l.recv_src_rank = off;     off = align_up(off + t * world * 4, a);
    l.routing_bytes = off;
    l.recv_src_token = off;    off = align_up(off + t * world * 4, a);
    l.recv_topk_weights = off; off = align_up(off + t * world * topk * 4, a);
    l.send_offset = off;       off = align_up(off + world * 4, a);
    l.bytes = off;
    return l;
  }
  RF_HD MoeState at(uint64_t base) const {
    MoeState s;
    s.send_count = reinterpret_cast<int32_t*>(base + send_count);
    s.recv_count = reinterpret_cast<int32_t*>(base + recv_count);
    s.recv_offset = reinterpret_cast<int32_t*>(base + recv_offset);
    s.tokens_per_expert = reinterpret_cast<int32_t*>(base + tokens_per_expert);
    s.dest_mask = reinterpret_cast<uint64_t*>(base + dest_mask);
    s.send_slot = reinterpret_cast<int32_t*>(base + send_slot);
    s.recv_src_rank = reinterpret_cast<int32_t*>(base + recv_src_rank);
    s.recv_src_token = reinterpret_cast<int32_t*>(base + recv_src_token);
    s.recv_topk_weights = reinterpret_cast<float*>(base + recv_topk_weights);
    s.send_offset = reinterpret_cast<int32_t*>(base + send_offset);
    return s;
  }
};

// The mapped host mirror of the counts a dispatch notify received, for the CPU-sync wait: the raw
// slot words (sequence number, payload) of every peer's counts, 0 = not yet written.
//   pairs [0, W)                 rank_count[p]                (written last)
//   pairs [W, W + W * epr)       expert_count[p * epr + e]
//   pair  W + W * epr            my top-k slots dropped because their expert's rank left (elastic)
RF_HD int64_t host_counts_words(int32_t world, int64_t experts_per_rank) {
  return 2 * int64_t(world) * (1 + experts_per_rank) + 2;
}

// Dispatch tensors (device addresses). Input x is [T, hidden] of x_elem_bytes (2: bf16, 1: fp8).
struct DispatchIn {
  const void* x = nullptr;
  const float* scales = nullptr;         // [T, hidden / 128] (fp8) or null
  const int32_t* topk_idx = nullptr;     // [T, topk] global expert ids, -1 = unused
  const float* topk_weights = nullptr;   // [T, topk]
  int64_t num_tokens = 0;
  int32_t x_elem_bytes = 2, pad0 = 0;
};
// Outputs, [num_recv, ...] each. All null: the outputs stay in the buffer (dense tensors at the
// regions named above; src_rank in the state). Otherwise every pointer must be set (scales only with
// scales in) and the kernel copies the received rows there.
struct DispatchOut {
  void* x = nullptr;
  float* scales = nullptr;
  int32_t* topk_idx = nullptr;
  float* topk_weights = nullptr;
  int32_t* src_rank = nullptr;
  int32_t* src_token = nullptr;
};

// Combine tensors (device addresses). x is [num_recv, hidden] bf16 in the dispatch's receive order
// and must not lie in the symmetric buffer (peers write there during the combine).
struct CombineIn {
  const uint16_t* x = nullptr;
  const float* topk_weights = nullptr;   // [num_recv, topk] or null: the dispatched weights
  const uint16_t* bias0 = nullptr;       // [T, hidden] bf16 or null
  const uint16_t* bias1 = nullptr;
  int64_t num_tokens = 0;                // T of the dispatch (the handle's)
};
struct CombineOut {
  uint16_t* x = nullptr;                 // [T, hidden] bf16
  float* topk_weights = nullptr;         // [T, topk]
};

// rf_dispatch_notify's grid: the tokens of each block (a contiguous run; the last blocks may get fewer).
RF_HD int64_t notify_block_tokens(int64_t num_tokens, int64_t blocks) {
  return blocks > 0 ? (num_tokens + blocks - 1) / blocks : num_tokens;
}

// The tokens each routing block of a notify grid of `blocks` takes: all blocks route in
// rf_dispatch_notify; in the fused dispatch (rf_dispatch_fused) block 0 routes none when there are others.
RF_HD int64_t notify_route_tokens(int64_t num_tokens, int64_t blocks, bool fused) {
  return notify_block_tokens(num_tokens, fused && blocks > 1 ? blocks - 1 : blocks);
}

// What each block of a multi-block rf_dispatch_notify tells the others, in device memory (after the
// routing's topk copies): its row is written before the grid's barrier and read after it. A grid of
// one block needs none.
struct NotifyScratch {
  int64_t blocks = 0;
  int64_t bad = 0;           // [blocks] int64: the block's smallest flat index of a bad expert id, or -1
  int64_t send_count = 0;    // [blocks][W] int32: the block's tokens per destination rank
  int64_t expert_count = 0;  // [blocks][num_experts] int32: the block's topk entries per expert
  int64_t bytes = 0;

  RF_HD static NotifyScratch make(int64_t blocks, int32_t world, int32_t num_experts) {
    NotifyScratch l;
    if (blocks <= 1) return l;
    const int64_t a = kRegionAlignment;
    int64_t off = 0;
    l.blocks = blocks;
    l.bad = off;          off = align_up(off + blocks * 8, a);
    l.send_count = off;   off = align_up(off + blocks * world * 4, a);
    l.expert_count = off; off = align_up(off + blocks * num_experts * 4, a);
    l.bytes = off;
    return l;
  }
};

// rf_dispatch_notify (one block, or a grid over the tokens): routing and counts; mirrors the peers'
// counts into host_counts.
struct NotifyArgs {
  RankArgs r;
  MoeShape m;
  MoeState st;
  const int32_t* topk_idx = nullptr;
  // The routing keeps its own copy of topk (cached dispatches replay it): the kernel writes keep_idx
  // as it reads topk_idx and copies topk_weights to keep_weights. Null where the inputs already are
  // those copies (driver mode stages host tensors there).
  const float* topk_weights = nullptr;
  int32_t* keep_idx = nullptr;
  float* keep_weights = nullptr;
  int64_t num_tokens = 0;
  uint64_t* host_counts = nullptr;       // mapped host memory, host_counts_words() words, or null
  uint64_t fingerprint = 0;              // the layout's: the tag of the `enter` signals
  // NotifyScratch::make(scratch_blocks, ...) bytes, or null: the grid has at most scratch_blocks
  // blocks (one without scratch).
  uint8_t* scratch = nullptr;
  int64_t scratch_blocks = 1;
  // rf_dispatch_fused: FusedScratch::make(fused_blocks, ...) bytes, zero where untouched.
  uint8_t* fused_scratch = nullptr;
  int64_t fused_blocks = 0;
};

// rf_dispatch_data: with `announce` (a cached dispatch: no notify ran for this seq) block 0 sends the
// `enter` signals itself, carrying the offsets in the state.
// Every rank checks that its receivers' `enter` tags equal its own layout's fingerprint (the sequence
// number of the dispatch that computed the routing): a peer replaying another handle is reported.
struct DispatchArgs {
  RankArgs r;
  MoeShape m;
  MoeState st;
  DispatchIn in;
  DispatchOut out;
  uint64_t fingerprint = 0;
  int32_t announce = 0;
  // A cached dispatch that sends its origin's weights shares the origin's receive state (source tokens,
  // weights, send offsets: the same routing gives the same values), which the kernel leaves as it is.
  int32_t keep_state = 0;
  // A cached dispatch with weights of its own keeps them here as it reads them: its handle's weights,
  // which a cached dispatch of that handle replays (the host executor's rule).
  float* keep_weights = nullptr;
};

// What the routing blocks of rf_dispatch_fused tell each other, in device memory kept by the context
// (a rank's kernels run one after another): per block and destination rank its tokens, as one word
// that carries the op too (fused_count_word: a reader needs no flag, and the writer no fence); per
// block its first bad id and a flag once that and its expert counts are in the grid's totals (added
// up by the routing blocks, taken back to zero by block 0).
struct FusedScratch {
  int64_t send_count = 0, bad = 0, expert_flag = 0, expert_total = 0, bytes = 0;

  RF_HD static FusedScratch make(int64_t blocks, int32_t world, int32_t num_experts) {
    FusedScratch l;
    const int64_t a = kRegionAlignment;
    int64_t off = 0;
    l.send_count = off;   off = align_up(off + blocks * world * 8, a);
    l.bad = off;          off = align_up(off + blocks * 8, a);
    l.expert_flag = off;  off = align_up(off + blocks * 8, a);
    l.expert_total = off; off = align_up(off + (num_experts > 0 ? num_experts : 1) * 4, a);
    l.bytes = off;
    return l;
  }
};

// A FusedScratch send_count word: the op's sequence number's low 32 bits over the count plus one (a
// zeroed word is no op's, whatever the sequence number).
RF_HD uint64_t fused_count_word(uint64_t seq, int32_t count) {
  return (uint64_t(uint32_t(seq)) << 32) | uint64_t(uint32_t(count) + 1u);
}
RF_HD bool fused_count_is(uint64_t word, uint64_t seq) {
  return (word >> 32) == uint64_t(uint32_t(seq)) && uint32_t(word) != 0u;
}
RF_HD int32_t fused_count_of(uint64_t word) { return int32_t(uint32_t(word) - 1u); }

// rf_dispatch_fused: a dispatch without a CPU sync in one kernel, the notify's steps (notify.cuh)
// and then the data kernel's, each block copying the tokens it routed. `data` is as for
// rf_dispatch_data (announce 0: the notify part sends `enter`), its topk the inputs' (the routing's
// copies are being written by other blocks).
struct FusedDispatchArgs {
  NotifyArgs notify;
  DispatchArgs data;
  // Rows of x each routing block asks L2 for once its topk is loaded, while its first slots wait for
  // the earlier blocks' counts (0: none).
  int32_t prefetch_rows = 0, pad = 0;
};

// rf_combine: send_blocks > 0 splits the grid into senders and reducers (per-row flags).
struct CombineArgs {
  RankArgs r;
  MoeShape m;
  MoeState st;
  CombineIn in;
  CombineOut out;
  uint64_t fingerprint = 0;              // as DispatchArgs: the handle's, carried by `enter`
  int32_t send_blocks = 0;
  int32_t pull = 0;                      // ranks sharing one GPU in one process, x a device tensor: kernels/combine.cu
};

// ---- Two levels (kernels/two_level.cu; native/src/backends/cuda/two_level_moe.cc) ----

// rf_tl_copy: item i copies items[i].bytes (a multiple of 4; 16-byte vectors where both ends and the
// size allow) from src to dst (a node peer's window, over NVLink, or local memory). A warp per item.
struct CopyItem {
  uint64_t src = 0, dst = 0;
  int64_t bytes = 0;
};
struct CopyArgs {
  const CopyItem* items = nullptr;
  int64_t count = 0;
};

// rf_tl_fold: item i writes dst[h] = partial[h] (0 without one) + the rows rows[first .. first +
// count) of my combine region, added one after the other in that order, for h < hidden + topk (bf16
// x row, then the fp32 weights: the flat combine's fp32 sums, continued). rows hold slot indices.
struct FoldItem {
  uint64_t partial = 0, dst = 0;  // fp32 [hidden + topk] each; partial 0 = start from 0
  int32_t first = 0, count = 0;
};
struct FoldArgs {
  const FoldItem* items = nullptr;
  int64_t count = 0;
  const int32_t* rows = nullptr;
  const uint16_t* combine_x = nullptr;     // my combine region: [slots, hidden] bf16
  const float* combine_weights = nullptr;  // [slots, topk]
  int32_t hidden = 0, topk = 0;
};

// rf_tl_finish: per token t, out_x = bf16(sums[t][h] + bias0 + bias1) (added in that order, RNE),
// out_weights = sums[t][hidden + k]: the flat combine's last step.
struct FinishArgs {
  const float* sums = nullptr;  // [T, hidden + topk]
  const uint16_t* bias0 = nullptr;
  const uint16_t* bias1 = nullptr;
  uint16_t* out_x = nullptr;
  float* out_weights = nullptr;
  int64_t num_tokens = 0;
  int32_t hidden = 0, topk = 0;
};

// ---- Small kernels ----

// rf_epoch_advance: the last node of a captured graph moves the epoch past the graph's ops.
struct EpochArgs {
  uint64_t* epoch = nullptr;
  uint64_t advance = 0;
};

// rf_busy (tests): every block spins for `ns` nanoseconds, holding its SM.
struct BusyArgs {
  uint64_t ns = 0;
};

}  // namespace rankflow::kargs
