// MoE dispatch on the GPU, its data kernel: the host executor's protocol (native/src/backends/host/
// moe.cc) with the same slots, encodings and receive order, and bit-identical outputs (notify.cu
// has the routing and counts kernel that runs before it, unless the dispatch is cached).
//
// rf_dispatch_data (num_sms blocks): waits for every other receiver's enter (and learns its offset; its
//   own comes from the state), then a
//   warp per token (per part of its row, when the grid has more warps than tokens) loads the row once
//   (16-byte vectors) and stores it straight into every receiver's
//   buffer over NVLink, already compacted at row offset + index (receive order: source rank, then
//   token), with scales, local expert ids (-1 elsewhere), weights (0 elsewhere) and the source token.
//   The last block to finish signals `done` to every rank (itself too); every block waits for all
//   `done`s, then the grid keeps the other ranks' rows' src_token and weights in the state (for combine;
//   my own rows' went into the state with the rows) and copies the outputs out of the buffer when
//   asked to (alone with the outputs in the buffer, a block ends after its rows). A cached dispatch
//   that sends its origin's weights (keep_state) shares the origin's state and leaves it as it is: its
//   blocks end after the `done`s when the outputs stay in the buffer. One with weights of its own keeps
//   them (keep_weights) for the cached dispatches of its handle. With more items (tokens, or parts of
//   their rows) than warps, a warp takes its next item from a ticket counter (DataPart::tickets), and
//   an item is then one step of a row (a warp's lane loads, split evenly): the grid's tail is a step.
// rf_dispatch_fused (a dispatch without a CPU sync, device inputs, outputs in the buffer): the two in
//   one launch. Block 0 does the notify's counting and talking to the peers; blocks 1.. each route a
//   run of tokens (notify.cuh, `fused`) and then copy those same tokens, at the offsets the receivers'
//   `enter`s carry (their own rows at the sum of the lower ranks' counts, without waiting for
//   themselves). Block 0 counts in the end once it has read the peers' counts, not after writing the
//   state (the kernel's end orders that before the next op). RANKFLOW_FUSED_DISPATCH=0 runs
//   rf_dispatch_notify + rf_dispatch_data.
// rf_dispatch_local (a group of one rank, outputs in the buffer): the data kernel's stores with no
//   signal and no wait, at its own register count (see there).
// Elastic: no rank outside the live mask is signalled or waited for (the routing sends it nothing).
#include "notify.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

namespace {
constexpr int kUnroll = 8;  // 16-byte loads in flight per lane before the stores
}  // namespace

// The tokens [t_lo, t_hi) a set of `warps` warps copies (this thread's warp is `first_warp` of them):
// the whole grid's in rf_dispatch_data, the block's own in rf_dispatch_fused. `blocks` of the grid
// copy (the fused dispatch's block 0 copies nothing); the first of them (block 0) writes what one
// block writes for all. Every block of the grid arrives in the end count.
struct DataPart {
  int64_t t_lo, t_hi, first_warp, warps;
  unsigned int blocks, block;  // the blocks that copy, and this one's index among them
  // rf_dispatch_data: with more items than warps, a warp's items after its first come from this counter
  // (items warps, warps + 1, ... in the order asked), not every warps-th: the grid ends when the work
  // does, not when the warp with the most (or the heaviest) items does. Zeroed by the last block.
  unsigned int* tickets = nullptr;
};

// The data kernel's steps as a block runs them. own_from_counts: my own rows' first row in my buffer is
// the sum of the lower ranks' rank counts to me (the fused dispatch: its notify part is this very
// kernel, and no state has it yet); rank 0's is 0 without a wait. Otherwise it is in the state. Either
// way my own rows wait for no `enter`: my buffer's earlier readers are earlier work of my stream. `arrivals`:
// the word the grid counts its finished blocks on. part_ok false: the block's part of the notify gave
// up; it copies nothing, and the op ends as any whose wait gave up.
__device__ __forceinline__ void data_phase(const DispatchArgs& args, const DataPart part, bool own_from_counts,
                                           unsigned int* arrivals, bool part_ok, const uint64_t* known_peers = nullptr) {
  __shared__ uint64_t own_peers[kMaxRanks];
  __shared__ int offs[kMaxRanks];
  __shared__ unsigned long long refused_bits;
  __shared__ int own_first;
  const RankArgs& a = args.r;
  const MoeShape& m = args.m;
  const MoeState& st = args.st;
  const DispatchIn& in = args.in;
  const DispatchOut& out = args.out;
  const int W = a.world, K = m.topk, E = m.num_experts, epr = m.experts_per_rank, rank = a.rank;
  const int tid = int(threadIdx.x);
  const int lane = tid & 31;
  const uint64_t seq = op_seq(a), live = live_ranks(a);
  const bool lead = part.block == 0;
  const int keep = args.keep_state;  // the receive state is the origin's, already right (args.hpp)
  const uint64_t* peers = known_peers != nullptr ? known_peers : own_peers;
  if (known_peers == nullptr && tid < W) own_peers[tid] = a.peers[tid];
  if (tid == 0) refused_bits = 0, own_first = 0;
  __syncthreads();
  const uint64_t mine = peers[rank];
  // My own rows need no enter: my buffer's earlier readers are earlier work of my stream, and my
  // offset in it is in my state (a wait on my own slot cost every op ~1.7 µs: the signal's round
  // trip through the memory system, block 0's store to the other blocks' loads).
  if (args.announce != 0 && lead && tid < W && tid != rank && rank_live(live, tid) && !gave_up(a.arrivals))
    signal(slot_at(peers[tid], a.ws, a.ws.enter, rank), seq, uint64_t(st.recv_offset[tid]), args.fingerprint);
  bool ok = part_ok;
  if (tid == rank) {
    if (!own_from_counts) {
      ok = ok && !gave_up(a.arrivals);  // a notify that gave up announced nothing, to me neither
      offs[tid] = st.recv_offset[tid];
      if (lead && keep == 0) st.send_offset[tid] = offs[tid];
    }
  } else if (tid < W && rank_live(live, tid)) {
    uint64_t o = 0, tag = 0;
    ok = ok && wait_signal(slot_at(mine, a.ws, a.ws.enter, tid), seq, a, kPhaseEnter, tid, &o, &tag);
    offs[tid] = int(o);
    if (ok && lead && keep == 0) st.send_offset[tid] = int(o);
    // Receiver tid replays another dispatch's routing: its offsets mean nothing to me. Nothing is
    // sent to it (done still is), and the op is reported; tid finds my tag wrong as well.
    if (ok && tag != args.fingerprint) {
      if (lead) report_bad(a.ctl, seq, kBadHandle, tid);
      atomicOr(&refused_bits, 1ull << tid);
    }
  }
  if (own_from_counts && tid < rank && rank_live(live, tid)) {
    uint64_t n = 0;
    ok = ok && wait_signal(slot_at(mine, a.ws, a.ws.rank_count, tid), seq, a, kPhaseNotify, tid, &n);
    if (ok) atomicAdd(&own_first, int(n));
  }
  ok = __syncthreads_and(ok);
  if (own_from_counts) {
    if (tid == rank) {
      offs[tid] = own_first;
      if (lead) st.send_offset[tid] = own_first;
    }
    __syncthreads();
  }
  const uint64_t send_to = live & ~refused_bits;

  const int64_t row = int64_t(m.hidden) * in.x_elem_bytes;  // bytes, a multiple of 16
  const int64_t nvec = row / 16;
  const int S = in.scales != nullptr ? int(m.buf.scales_per_token) : 0;
  const int64_t warps = part.warps, first_warp = part.first_warp, T = part.t_hi - part.t_lo;
  const char* x = static_cast<const char*>(in.x);
  // Work items: (token, chunk of its row): row_chunks (common.cuh).
  constexpr int64_t kStep = int64_t(kWarpSize) * kUnroll;  // vectors per warp step
  RowChunks rc = row_chunks(T, warps, nvec);
  // Ticketed (more rows than warps): an item is one step of a row (its lane loads split evenly), so the
  // grid's tail is a step, not a row. 4096 tokens, ranks sharing one H200, b2b: 4 ranks bf16 cached
  // 310.3-310.8 -> 300.7-301.0 us, fp8 177.4-178.1 -> 176.4-176.7; 2 ranks bf16 100.4-100.9 -> 97.8-97.9.
  if (part.tickets != nullptr && T > warps) {
    const int64_t lane_loads = (nvec + kWarpSize - 1) / kWarpSize, steps = (lane_loads + kUnroll - 1) / kUnroll;
    rc = RowChunks{steps, ((lane_loads + steps - 1) / steps) * kWarpSize};
  }
  const int64_t chunks = rc.chunks, chunk_vecs = rc.vecs, items = T * chunks;
  unsigned int* const tickets = items > warps ? part.tickets : nullptr;
  unsigned int ticket = 0;  // asked as an item starts, read as it ends: the atomic's latency hides behind the copy
  for (int64_t j = first_warp; ok && j < items; j = tickets != nullptr ? warps + __shfl_sync(0xffffffffu, ticket, 0) : j + warps) {
    if (tickets != nullptr && lane == 0) ticket = atomicAdd(tickets, 1u);
    const int64_t q = j / chunks, t = part.t_lo + q, chunk = j - q * chunks;
    const char* src = x + t * row;
    const int64_t lo = chunk * chunk_vecs, hi = min(nvec, lo + chunk_vecs);
    // Everything the item needs is loaded at once: the first step of its row, its routing and (chunk
    // 0) its topk, none depending on another. Loaded one after the other (mask, then slots, then the
    // row, then the topk after the row), they were seven memory latencies per 14 KB row in a row, and
    // a 4096-token dispatch ran at half of HBM's bandwidth (2.36 TB/s, Nsight Compute).
    int4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = lo + u * kWarpSize + lane;
      if (i < hi) v[u] = ld_nc_v4(src + i * 16);
    }
    uint64_t mask = st.dest_mask[t];
    const int s_lo = lane < W ? st.send_slot[t * W + lane] : -1;
    const int s_hi = lane + 32 < W ? st.send_slot[t * W + lane + 32] : -1;
    int e = -1;
    float w = 0.0f;
    if (chunk == 0 && lane < K) {
      e = in.topk_idx[t * K + lane];
      w = in.topk_weights[t * K + lane];
      if (args.keep_weights != nullptr) args.keep_weights[t * K + lane] = w;
    }
    if (mask == 0) continue;
    // Lane l holds the output row of this token at rank l (and at rank l + 32).
    const int o_lo = lane < W && ((mask >> lane) & 1) ? offs[lane] + s_lo : -1;
    const int o_hi = lane + 32 < W && ((mask >> (lane + 32)) & 1) ? offs[lane + 32] + s_hi : -1;
    mask &= send_to;  // receivers that replay another handle (or left: a handle's older routing) get nothing
    for (int64_t base = lo; base < hi; base += kStep) {
      if (base != lo) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t i = base + u * kWarpSize + lane;
          if (i < hi) v[u] = ld_nc_v4(src + i * 16);
        }
      }
      uint64_t mm = mask;
      while (mm != 0) {
        const int p = __ffsll(static_cast<long long>(mm)) - 1;
        mm &= mm - 1;
        const int o = __shfl_sync(0xffffffffu, p < 32 ? o_lo : o_hi, p & 31);
        char* dst = reinterpret_cast<char*>(buf_base(a, peers, p) + uint64_t(m.buf.x)) + int64_t(o) * row;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t i = base + u * kWarpSize + lane;
          if (i < hi) st_v4(dst + i * 16, v[u]);
        }
      }
    }
    if (chunk != 0) continue;
    // Scales, topk (local expert ids and weights for that receiver only) and the source token.
    const int owner = e >= 0 && e < E ? e / epr : -1;  // the rank of expert e (-1: none)
    uint64_t mm = mask;
    while (mm != 0) {
      const int p = __ffsll(static_cast<long long>(mm)) - 1;
      mm &= mm - 1;
      const int64_t o = __shfl_sync(0xffffffffu, p < 32 ? o_lo : o_hi, p & 31);
      const uint64_t b = buf_base(a, peers, p);
      if (lane < K) {
        const bool to_p = owner == p;
        reinterpret_cast<int32_t*>(b + uint64_t(m.buf.topk_idx))[o * K + lane] = to_p ? e - p * epr : -1;
        reinterpret_cast<float*>(b + uint64_t(m.buf.topk_weights))[o * K + lane] = to_p ? w : 0.0f;
        if (p == rank && keep == 0) st.recv_topk_weights[o * K + lane] = to_p ? w : 0.0f;  // my own rows' state: now
      }
      if (lane == 0) {
        reinterpret_cast<int32_t*>(b + uint64_t(m.buf.src_token))[o] = int32_t(t);
        reinterpret_cast<int32_t*>(b + uint64_t(m.buf.src_rank))[o] = rank;
        if (p == rank && keep == 0) st.recv_src_token[o] = int32_t(t);
      }
      for (int i = lane; i < S; i += kWarpSize)
        reinterpret_cast<float*>(b + uint64_t(m.buf.scales))[o * S + i] = in.scales[t * S + i];
    }
  }

  // The rows I receive: in the state, or (fused: block 0 may still be writing the state) the sum of
  // the peers' rank counts, read before this block's arrival: after it, a peer that got my `done`
  // may already have given me its next op's count in the same slot.
  __shared__ int received, own_rows;
  if (own_from_counts) {
    if (tid == 0) received = 0, own_rows = 0;
    __syncthreads();
    uint64_t n = 0;
    if (tid < W && ok && rank_live(live, tid) && wait_signal(slot_at(mine, a.ws, a.ws.rank_count, tid), seq, a, kPhaseDispatchData, tid, &n)) {
      atomicAdd(&received, int(n));
      if (tid == rank) own_rows = int(n);
    }
  }
  // done: the last block signals every rank (me too: my other blocks wait for my own rows).
  const bool last = last_block_arrived(arrivals);
  if (last && tid == 0 && part.tickets != nullptr) *part.tickets = 0;  // every block is past its items
  if (last && tid < W && rank_live(live, tid) && !gave_up(a.arrivals))
    signal(slot_at(peers[tid], a.ws, a.ws.done, rank), seq);
  // Alone, with the outputs in the buffer, nothing is left once my own rows are stored: their state
  // went with them. (One rank, 4096 tokens: the wait for the last block's `done` and the state's copy
  // after it were the op's tail.)
  if (W == 1 && out.x == nullptr) return;
  ok = true;
  if (tid < W && rank_live(live, tid)) ok = wait_signal(slot_at(mine, a.ws, a.ws.done, tid), seq, a, kPhaseDispatchData, tid);
  if (!__syncthreads_and(ok)) return;
  if (keep != 0 && out.x == nullptr) return;  // the state is right, and the outputs stay in the buffer

  // Received: keep what combine needs, and copy the outputs out when asked.
  const int64_t num = own_from_counts ? received : st.recv_offset[W];
  const uint64_t b = buf_base(a, peers, rank);
  const int64_t gthreads = int64_t(part.blocks) * blockDim.x;
  const int64_t gtid = int64_t(part.block) * blockDim.x + tid;
  const int32_t* rtok = reinterpret_cast<const int32_t*>(b + uint64_t(m.buf.src_token));
  const float* rw = reinterpret_cast<const float*>(b + uint64_t(m.buf.topk_weights));
  // The state of the other ranks' rows (mine is there already: [own_lo, own_hi)).
  const int64_t own_lo = offs[rank], own_hi = own_lo + (own_from_counts ? own_rows : st.recv_offset[rank + 1] - st.recv_offset[rank]);
  for (int64_t o = gtid; keep == 0 && o < num; o += gthreads)
    if (o < own_lo || o >= own_hi) st.recv_src_token[o] = rtok[o];
  for (int64_t i = gtid; keep == 0 && i < num * K; i += gthreads)
    if (i < own_lo * K || i >= own_hi * K) st.recv_topk_weights[i] = rw[i];
  if (out.x != nullptr) {
    const char* rx = reinterpret_cast<const char*>(b + uint64_t(m.buf.x));
    char* ox = static_cast<char*>(out.x);
    for (int64_t base = (gtid / kWarpSize) * kWarpSize * kUnroll; base < num * nvec;
         base += (gthreads / kWarpSize) * kWarpSize * kUnroll) {
      int4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * kWarpSize + lane;
        if (i < num * nvec) v[u] = ld_v4(rx + i * 16);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * kWarpSize + lane;
        if (i < num * nvec) st_v4(ox + i * 16, v[u]);
      }
    }
    if (S > 0) {
      const float* rs = reinterpret_cast<const float*>(b + uint64_t(m.buf.scales));
      for (int64_t i = gtid; i < num * S; i += gthreads) out.scales[i] = rs[i];
    }
    const int32_t* ri = reinterpret_cast<const int32_t*>(b + uint64_t(m.buf.topk_idx));
    for (int64_t i = gtid; i < num * K; i += gthreads) {
      out.topk_idx[i] = ri[i];
      out.topk_weights[i] = rw[i];
    }
    for (int64_t o = gtid; o < num; o += gthreads) {
      out.src_token[o] = rtok[o];
      out.src_rank[o] = st.recv_src_rank[o];
    }
  }
}

extern "C" __global__ void __launch_bounds__(512) rf_dispatch_data(const DispatchArgs args) {
  const int64_t wpb = blockDim.x / kWarpSize;
  const DataPart all{0, args.in.num_tokens, int64_t(blockIdx.x) * wpb + threadIdx.x / kWarpSize, int64_t(gridDim.x) * wpb,
                     gridDim.x, blockIdx.x, args.r.arrivals + 3};
  data_phase(args, all, /*own_from_counts=*/false, args.r.arrivals, true);
}

// A dispatch without a CPU sync in one launch: the notify's steps, and then each block copies the
// tokens it routed (their masks and slots are its own stores). With several blocks, block 0 meanwhile
// gives the peers the counts, arrives once it has read theirs and then writes the state, which the
// kernel's end orders before the next op. The end counts on arrivals[2].
extern "C" __global__ void __launch_bounds__(512) rf_dispatch_fused(const FusedDispatchArgs args) {
  int t_lo = 0, t_hi = 0;
  const uint64_t* peers = nullptr;
  const bool alone = gridDim.x == 1;
  unsigned int* end = args.data.r.arrivals + 2;
  // The first rows a block copies are asked of L2 once its topk is in, while it waits for its first
  // slots: HBM would idle until the first block copies. (Asked at the block's start, they delayed the
  // routing's own loads; one op back to back at 4096 tokens, 1 rank: 45.5 -> 43.6-43.9 µs.)
  const RowPrefetch rows{static_cast<const char*>(args.data.in.x), int64_t(args.data.m.hidden) * args.data.in.x_elem_bytes,
                         args.prefetch_rows};
  const bool ok = notify_phase(args.notify, /*fused=*/true, &t_lo, &t_hi, &peers, alone ? nullptr : end, rows);
  if (!alone && blockIdx.x == 0) return;
  const DataPart mine{t_lo, t_hi, threadIdx.x / kWarpSize, blockDim.x / kWarpSize, alone ? 1u : gridDim.x - 1,
                      alone ? 0u : blockIdx.x - 1};
  data_phase(args.data, mine, /*own_from_counts=*/true, end, ok, peers);
}

// rf_dispatch_local: the data kernel of a group of one rank whose outputs stay in the buffer (launch.cc
// picks it; a cached dispatch's: the routing is in the state). Every token goes to me or nowhere, at row
// send_slot[t] (my rows start at 0), with data_phase's stores, its state (source token, weights,
// send_offset) and no signal, wait or arrival: nobody else reads my buffer, and my later work is
// later in my stream. A kernel of its own for its registers: rf_dispatch_data holds 106 (the peers'
// paths), one block of 512 per SM; here 3 blocks of 256 per SM with the same 8 loads per lane.
extern "C" __global__ void __launch_bounds__(256, 3) rf_dispatch_local(const DispatchArgs args) {
  const RankArgs& a = args.r;
  const MoeShape& m = args.m;
  const MoeState& st = args.st;
  const DispatchIn& in = args.in;
  const int K = m.topk, E = m.num_experts, lane = int(threadIdx.x) & 31;
  if (gave_up(a.arrivals)) return;  // as data_phase: a rank that gave up moves nothing
  const int keep = args.keep_state;
  if (blockIdx.x == 0 && threadIdx.x == 0 && keep == 0) st.send_offset[0] = st.recv_offset[0];
  const uint64_t b = buf_base(a, a.peers, 0), live = live_ranks(a) & 1u;
  const int64_t row = int64_t(m.hidden) * in.x_elem_bytes, nvec = row / 16, T = in.num_tokens;
  const int S = in.scales != nullptr ? int(m.buf.scales_per_token) : 0;
  const char* x = static_cast<const char*>(in.x);
  char* bx = reinterpret_cast<char*>(b + uint64_t(m.buf.x));
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  const int64_t first = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  const RowChunks rc = row_chunks(T, warps, nvec);
  constexpr int64_t kStep = int64_t(kWarpSize) * kUnroll;
  for (int64_t j = first; j < T * rc.chunks; j += warps) {
    const int64_t t = j / rc.chunks, chunk = j - t * rc.chunks;
    const char* src = x + t * row;
    const int64_t lo = chunk * rc.vecs, hi = min(nvec, lo + rc.vecs);
    int4 v[kUnroll];  // the first step, the routing and the topk loaded at once (data_phase's reason)
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = lo + u * kWarpSize + lane;
      if (i < hi) v[u] = ld_nc_v4(src + i * 16);
    }
    const bool mine = (st.dest_mask[t] & live) != 0;
    const int64_t o = st.send_slot[t];
    int e = -1;
    float w = 0.0f;
    if (chunk == 0 && lane < K) {
      e = in.topk_idx[t * K + lane];
      w = in.topk_weights[t * K + lane];
      if (args.keep_weights != nullptr) args.keep_weights[t * K + lane] = w;
    }
    if (!mine) continue;
    char* dst = bx + o * row;
    for (int64_t base = lo; base < hi; base += kStep) {
      if (base != lo) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t i = base + u * kWarpSize + lane;
          if (i < hi) v[u] = ld_nc_v4(src + i * 16);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * kWarpSize + lane;
        if (i < hi) st_v4(dst + i * 16, v[u]);
      }
    }
    if (chunk != 0) continue;
    if (lane < K) {
      const bool to_me = e >= 0 && e < E;  // every expert is mine
      reinterpret_cast<int32_t*>(b + uint64_t(m.buf.topk_idx))[o * K + lane] = to_me ? e : -1;
      reinterpret_cast<float*>(b + uint64_t(m.buf.topk_weights))[o * K + lane] = to_me ? w : 0.0f;
      if (keep == 0) st.recv_topk_weights[o * K + lane] = to_me ? w : 0.0f;
    }
    if (lane == 0) {
      reinterpret_cast<int32_t*>(b + uint64_t(m.buf.src_token))[o] = int32_t(t);
      reinterpret_cast<int32_t*>(b + uint64_t(m.buf.src_rank))[o] = 0;
      if (keep == 0) st.recv_src_token[o] = int32_t(t);
    }
    for (int i = lane; i < S; i += kWarpSize)
      reinterpret_cast<float*>(b + uint64_t(m.buf.scales))[o * S + i] = in.scales[t * S + i];
  }
}
