// MoE dispatch on the GPU, its first kernel: the host executor's protocol (native/src/backends/host/
// moe.cc) with the same slots, encodings and receive order; dispatch.cu has the data kernel, and the
// fused dispatch that runs these steps (notify_phase with `fused`: see there) and the data kernel's
// in one launch.
//
// rf_dispatch_notify (one block of 1024 threads up to 1024 tokens, else a block per ~256 tokens up to
//   the rank's share of the SMs): each block routes a contiguous run of tokens (destination ranks,
//   topk copies, counts per expert and per destination, the first bad id); several blocks leave
//   these in a scratch after the routing and meet at a grid-wide barrier. A token's index among the
//   tokens sent to a rank is the earlier blocks' and warps' counts plus a ballot in its warp. Block 0
//   alone adds the counts up and speaks to the peers: the counts go as signals (payload = count, then
//   the op's sequence number, release) into every receiver's workspace (expert_count, then
//   rank_count); then it waits for every peer's counts in its own workspace, keeps them in the state,
//   mirrors the raw slot words into mapped host memory for the CPU-sync wait (0 = not yet), and
//   signals `enter` to every peer carrying the first output row of that peer's tokens in this rank's
//   buffer (its payload; the host executor ignores it). No other block waits on a peer. An expert id
//   outside [-1, numExperts) is dropped (as -1); the first one is reported in the Control block.
//   Elastic: a slot whose expert lives on a rank outside the live mask is dropped as a -1 slot (the
//   token's mask leaves that rank out; its expert count still counts it: block 0 sums those into
//   the masked-slot count it mirrors for the CPU), and no count goes to, nor is waited for from, it.
#pragma once

#include "moe.cuh"

namespace rankflow::kernels {

constexpr int kNotifyThreads = 1024;
constexpr int kNotifyWarps = kNotifyThreads / kWarpSize;

// The routing's copy of topk_weights (cached dispatches replay it), spread over the grid's G blocks
// (16-byte vectors where both ends allow them).
__device__ __forceinline__ void copy_weights(const NotifyArgs& args, int blk, int G) {
  const int T = int(args.num_tokens), K = args.m.topk, tid = int(threadIdx.x), nt = int(blockDim.x);
  if (args.keep_weights != nullptr) {
    const int64_t n = int64_t(T) * K, first = int64_t(blk) * nt + tid, stride = int64_t(G) * nt;
    const float* w = args.topk_weights;
    float* keep = args.keep_weights;
    if (n % 4 == 0 && ((reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(keep)) & 15) == 0) {
      for (int64_t i = first; i < n / 4; i += stride) reinterpret_cast<int4*>(keep)[i] = __ldg(reinterpret_cast<const int4*>(w) + i);
    } else {
      for (int64_t i = first; i < n; i += stride) keep[i] = __ldg(w + i);
    }
  }
}

// Rows of x the fused dispatch's routing blocks ask L2 for (prefetch_rows_l2) once their topk is
// loaded (notify_phase's `late`): the first `rows` of their run.
struct RowPrefetch {
  const char* x = nullptr;
  int64_t row_bytes = 0;
  int rows = 0;
};

// The notify's steps as a block runs them, for rf_dispatch_notify (notify.cu) and for the fused
// dispatch (dispatch.cu: `fused`), whose blocks go on to copy the tokens they routed: there, with
// several blocks, block 0 routes none (its part is the counts, the peers' counts and the state, off
// the copies' path) and blocks 1.. split the tokens (kargs::notify_route_tokens). [*t_lo, *t_hi): the
// tokens this block routed. Returns whether the block's part went through (false: a wait gave up,
// and the op's outputs are void). Blocks return together (every exit is block-uniform).
// Dynamic shared memory: a uint64 mask per token of the block's run, num_experts ints, num_experts bytes.
// *peers_out: the peers' window bases as this block loaded them into shared memory (the fused
// dispatch's data part reads them from there instead of loading them again). arrive (fused, several
// blocks): the word the copies' end counts on (an arrival of every block of the grid); block 0 arrives there
// once it has read every peer's counts (after my `done`, a peer may reuse those slots for its next
// op), before it writes the state. late: rows this block asks L2 for once its topk is in (fused).
__device__ __forceinline__ bool notify_phase(const NotifyArgs& args, bool fused, int* t_lo, int* t_hi,
                                             const uint64_t** peers_out = nullptr, unsigned int* arrive = nullptr,
                                             const RowPrefetch late = {}) {
  extern __shared__ uint64_t smem[];
  __shared__ uint64_t peers[kMaxRanks];
  __shared__ int warp_cnt[kNotifyWarps][kMaxRanks];  // per warp and destination: its tokens, then the earlier warps'
  __shared__ int base[kMaxRanks];                    // per destination: the earlier blocks' tokens
  __shared__ int send_cnt[kMaxRanks];                // per destination: the block's tokens (block 0: then the grid's)
  __shared__ int recv_cnt[kMaxRanks];
  __shared__ int recv_off[kMaxRanks + 1];
  __shared__ long long bad_at;
  __shared__ int masked;  // block 0: my slots of a dead rank's expert (elastic)
  const RankArgs& a = args.r;
  const MoeShape& m = args.m;
  const MoeState& st = args.st;
  const int W = a.world, K = m.topk, E = m.num_experts, epr = m.experts_per_rank, rank = a.rank;
  const int tid = int(threadIdx.x), nt = int(blockDim.x);
  const int lane = tid & 31, warp = tid >> 5, nwarps = nt >> 5;
  const int G = int(gridDim.x), blk = int(blockIdx.x), T = int(args.num_tokens);
  // Fused with several blocks, block 0 routes no tokens, and no block waits for the grid: each routing
  // block publishes its counts (a row and a flag in args.fused_scratch, its expert counts added into
  // the grid's totals) and waits only for the flags of the blocks before it (its first slots); block 0
  // waits for all of them. A grid-wide barrier with a row of 256 expert counts per block for block 0
  // to add up, or every block counting the tokens before it from topk, kept the copies from starting
  // for 4-7 µs at 132 blocks (stamped with %globaltimer).
  const bool spare0 = fused && G > 1;
  const int run = int(notify_route_tokens(T, G, fused));
  const int slot = spare0 ? blk - 1 : blk;
  const int t0 = slot < 0 ? 0 : min(T, slot * run), ntok = slot < 0 ? 0 : min(T, t0 + run) - t0;  // [t0, t0 + ntok)
  *t_lo = t0;
  *t_hi = t0 + ntok;
  if (peers_out != nullptr) *peers_out = peers;
  const uint64_t seq = op_seq(a), live = live_ranks(a);
  uint64_t* masks = smem;                                        // [run]: token t0 + i at i
  int* expert_cnt = reinterpret_cast<int*>(smem + run);          // [E]
  uint8_t* owner = reinterpret_cast<uint8_t*>(expert_cnt + E);   // [E]: each expert's rank (W <= 64)
  for (int p = tid; p < W; p += nt) peers[p] = a.peers[p];
  for (int p = tid; p < W; p += nt) base[p] = 0;
  for (int e = tid; e < E; e += nt) {
    expert_cnt[e] = 0;
    owner[e] = uint8_t(e / epr);  // once per expert: a division per topk entry was most of the routing's instructions
  }
  if (tid == 0) bad_at = -1, masked = 0;
  __syncthreads();

  // 1. Routing: the ranks each token goes to (a thread per token: coalesced reads of topk_idx), and
  //    the topk entries naming each expert. Masks stay in shared memory; the state gets a copy.
  const int32_t* topk_idx = args.topk_idx;
  int32_t* keep_idx = args.keep_idx;
  const bool vec8 = K == 8 && (reinterpret_cast<uintptr_t>(topk_idx) & 15) == 0 && (reinterpret_cast<uintptr_t>(keep_idx) & 15) == 0;
  for (int i = tid; i < ntok; i += nt) {
    const int t = t0 + i;
    int ids[8];
    const int32_t* row = topk_idx + int64_t(t) * K;
    if (vec8) {  // the common case: two 16-byte loads in flight at once
      const int4 lo = __ldg(reinterpret_cast<const int4*>(row));
      const int4 hi = __ldg(reinterpret_cast<const int4*>(row) + 1);
      ids[0] = lo.x; ids[1] = lo.y; ids[2] = lo.z; ids[3] = lo.w;
      ids[4] = hi.x; ids[5] = hi.y; ids[6] = hi.z; ids[7] = hi.w;
      if (keep_idx != nullptr) {
        reinterpret_cast<int4*>(keep_idx + int64_t(t) * K)[0] = lo;
        reinterpret_cast<int4*>(keep_idx + int64_t(t) * K)[1] = hi;
      }
    }
    uint64_t mask = 0;
    auto count = [&](int e, int k) {
      if (e < 0 || e >= E) {
        if (e != -1) atomicMin(reinterpret_cast<unsigned long long*>(&bad_at), (unsigned long long)(int64_t(t) * K + k));
        return;
      }
      mask |= uint64_t(1) << owner[e];
      atomicAdd(&expert_cnt[e], 1);
    };
    if (vec8) {
#pragma unroll
      for (int k = 0; k < 8; ++k) count(ids[k], k);
    } else {
      for (int k = 0; k < K; ++k) {
        const int e = __ldg(row + k);
        if (keep_idx != nullptr) keep_idx[int64_t(t) * K + k] = e;
        count(e, k);
      }
    }
    mask &= live;  // a slot of a dead rank's expert is dropped as a -1 slot
    masks[i] = mask;
    st.dest_mask[t] = mask;
  }
  if (!spare0) copy_weights(args, blk, G);
  __syncthreads();
  if (late.rows > 0 && ntok > 0) prefetch_rows_l2(late.x, t0, min(late.rows, ntok), late.row_bytes);

  // Per destination, each token's index among the tokens sent there, in token order. Each warp takes
  // a contiguous run of the block's tokens (warp order = token order), `tps` tokens a step: `lpt`
  // lanes per token, lane p0 of a token for destination p0 (and p0 + 32), so a step's slots are one
  // coalesced store. Ballots count each destination's tokens per warp, a scan over the warps follows
  // (then, with several blocks, the blocks' counts), and a second pass writes the slots.
  const int lpt = W >= kWarpSize ? kWarpSize : 1 << (32 - __clz(W - 1));  // W rounded up to a power of 2
  const int tps = kWarpSize / lpt, j = lane / lpt, p0 = lane % lpt;
  const unsigned same = (lpt == kWarpSize ? 1u : 0xffffffffu / ((1u << lpt) - 1u)) << p0;  // the lanes of p0
  const unsigned below = (1u << lane) - 1u;
  const int per = (ntok + nwarps - 1) / nwarps;
  const int w0 = min(ntok, warp * per), w1 = min(ntok, w0 + per);
  int pos[2] = {0, 0};  // the lane's destinations p0 and p0 + 32: their tokens so far
  auto walk = [&](bool write) {
    for (int i = w0; i < w1; i += tps) {
      const int t = i + j;
      const uint64_t mk = t < w1 ? masks[t] : 0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int p = p0 + h * kWarpSize;
        if (h == 1 && W <= kWarpSize) break;
        const bool bit = (mk >> p) & 1;
        const unsigned v = __ballot_sync(0xffffffffu, bit) & same;
        if (write && t < w1 && p < W) st.send_slot[int64_t(t0 + t) * W + p] = bit ? pos[h] + __popc(v & below) : -1;
        pos[h] += __popc(v);
      }
    }
  };
  walk(false);
  for (int h = 0; h < 2; ++h)
    if (lane < lpt && p0 + h * kWarpSize < W) warp_cnt[warp][p0 + h * kWarpSize] = pos[h];
  __syncthreads();
  for (int p = warp; p < W; p += nwarps) {
    const int v = lane < nwarps ? warp_cnt[lane][p] : 0;
    int incl = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += u;
    }
    if (lane < nwarps) warp_cnt[lane][p] = incl - v;
    if (lane == 31) send_cnt[p] = incl;
  }
  __syncthreads();
  bool synced = true;
  if (spare0) {
    const FusedScratch fl = FusedScratch::make(args.fused_blocks, W, E);
    auto* row_send = reinterpret_cast<uint64_t*>(args.fused_scratch + fl.send_count);
    auto* row_bad = reinterpret_cast<long long*>(args.fused_scratch + fl.bad);
    auto* expert_flag = reinterpret_cast<uint64_t*>(args.fused_scratch + fl.expert_flag);
    auto* expert_total = reinterpret_cast<int32_t*>(args.fused_scratch + fl.expert_total);
    bool ok = true;
    // What the later blocks wait for first: a word per destination, which needs no fence (with a
    // flag after a fence, the routing blocks' counts came out ~2.3 µs later; a 4096-token dispatch of
    // 1 rank back to back went 43.8-44.2 -> 41.7 µs). Then what only block 0 needs: the first bad
    // id, the expert counts added into the grid's totals (a flag after them), the weights' copy.
    if (blk != 0) {
      for (int p = tid; p < W; p += nt) st_relaxed_gpu(row_send + int64_t(blk) * W + p, fused_count_word(seq, send_cnt[p]));
      if (tid == 0) row_bad[blk] = bad_at;
      for (int e = tid; e < E; e += nt)
        if (expert_cnt[e] != 0) atomicAdd(expert_total + e, expert_cnt[e]);
    }
    copy_weights(args, blk, G);
    if (blk != 0) {
      __syncthreads();
      if (tid == 0) {
        __threadfence();
        st_release_gpu(expert_flag + blk, seq);
      }
    }
    // The counts of blocks [1, blk) (block 0: of all of them): a thread per word waits for this op's.
    const int64_t words = int64_t((blk == 0 ? G : blk) - 1) * W;
    for (int64_t i = tid; ok && i < words; i += nt) {
      const int g = 1 + int(i / W), p = int(i % W);
      uint64_t v = 0;
      ok = wait_until<false>(row_send + int64_t(g) * W + p, [seq](uint64_t w) { return fused_count_is(w, seq); }, a,
                             kPhaseNotify, rank, &v);
      const int n = ok ? fused_count_of(v) : 0;
      if (n != 0) atomicAdd(blk == 0 ? &send_cnt[p] : &base[p], n);
    }
    if (blk == 0)
      for (int g = 1 + tid; ok && g < G; g += nt) {
        ok = wait_until(expert_flag + g, [seq](uint64_t v) { return seq_reached(v, seq); }, a, kPhaseNotify, rank, nullptr, seq);
        if (ok && row_bad[g] >= 0) atomicMin(reinterpret_cast<unsigned long long*>(&bad_at), (unsigned long long)row_bad[g]);
      }
    synced = __syncthreads_and(ok);
    if (blk == 0 && synced)
      for (int e = tid; e < E; e += nt) expert_cnt[e] = atomicExch(expert_total + e, 0);
    __syncthreads();
  }
  // Several blocks: each leaves its counts and its first bad id in the scratch and meets the others
  // at the grid's barrier; then block 0 adds the other blocks' to its own (the rank's), and every
  // other block adds up those of the blocks before it (its tokens' first slot per destination).
  if (G > 1 && !spare0) {
    const NotifyScratch sl = NotifyScratch::make(args.scratch_blocks, W, E);
    auto* blk_bad = reinterpret_cast<long long*>(args.scratch + sl.bad);
    auto* blk_send = reinterpret_cast<int32_t*>(args.scratch + sl.send_count);
    auto* blk_expert = reinterpret_cast<int32_t*>(args.scratch + sl.expert_count);
    for (int p = tid; p < W; p += nt) blk_send[blk * W + p] = send_cnt[p];
    for (int e = tid; e < E; e += nt) blk_expert[int64_t(blk) * E + e] = expert_cnt[e];
    if (tid == 0) blk_bad[blk] = bad_at;
    synced = grid_barrier(a, kPhaseNotify);
    if (synced && blk == 0) {
      add_rows(send_cnt, blk_send, W, 1, G);
      add_rows(expert_cnt, blk_expert, E, 1, G);
      for (int g = 1 + tid; g < G; g += nt)
        if (blk_bad[g] >= 0) atomicMin(reinterpret_cast<unsigned long long*>(&bad_at), (unsigned long long)blk_bad[g]);
    } else if (synced) {
      add_rows(base, blk_send, W, 0, blk);
    }
    __syncthreads();
  }
  if (blk == 0 && synced) {
    if (tid == 0 && bad_at >= 0) report_bad(a.ctl, seq, bad_at, topk_idx[bad_at]);
    // 2. Counts into every receiver's workspace: the expert counts (relaxed), then the rank count,
    //    whose release (after the block's barrier) orders them all before it.
    //    Receivers acquire the rank counts first, then read every expert slot, as the host does.
    for (int i = tid; i < W * epr; i += nt) {
      const int p = i / epr, e = i % epr;
      if (rank_live(live, p))
        signal_relaxed(reinterpret_cast<uint64_t*>(peers[p] + uint64_t(a.ws.expert_slot(rank, e))), seq,
                     uint64_t(expert_cnt[p * epr + e]));
    }
    __syncthreads();
    if (tid < W && rank_live(live, tid))  // its release is cumulative over the expert counts the block's barrier ordered before it
      signal(slot_at(peers[tid], a.ws, a.ws.rank_count, rank), seq, uint64_t(send_cnt[tid]));
  }
  if (synced) {  // the slots (a block that gave up at the grid's barrier has no first slots)
    for (int h = 0; h < 2; ++h) {
      const int p = p0 + h * kWarpSize;
      pos[h] = p < W ? base[p] + warp_cnt[warp][p] : 0;
    }
    walk(true);
  }
  if (blk != 0) return synced;  // the other blocks never wait on a peer
  for (int p = tid; p < W; p += nt) st.send_count[p] = synced ? send_cnt[p] : 0;
  if (synced && live != all_ranks_mask(W))  // the masked slots: my counts of a dead rank's experts
    for (int e = tid; e < E; e += nt)
      if (!rank_live(live, owner[e]) && expert_cnt[e] != 0) atomicAdd(&masked, expert_cnt[e]);
  __syncthreads();  // expert_cnt is reused below

  // 3. Every peer's counts, from my workspace (a device wait).
  const uint64_t mine = peers[rank];
  for (int e = tid; e < epr; e += nt) expert_cnt[e] = 0;
  uint64_t* mirror = args.host_counts;
  bool ok = synced;
  if (tid < W) {
    uint64_t n = 0;
    if (rank_live(live, tid)) ok = ok && wait_signal(slot_at(mine, a.ws, a.ws.rank_count, tid), seq, a, kPhaseNotify, tid, &n);
    recv_cnt[tid] = ok ? int(n) : 0;
  }
  ok = __syncthreads_and(ok);
  if (tid == 0) {
    int o = 0;
    for (int p = 0; p < W; ++p) {
      recv_off[p] = o;
      o += recv_cnt[p];
    }
    recv_off[W] = o;
  }
  __syncthreads();
  // 4. enter, first (the peers' data phase waits for it): rank tid may write into my buffer for
  //    this op, from row recv_off[tid] on. Nothing is announced by a rank that gave up.
  if (ok && tid < W && rank_live(live, tid)) signal(slot_at(peers[tid], a.ws, a.ws.enter, rank), seq, uint64_t(recv_off[tid]), args.fingerprint);
  // 5. The state, and the host mirror (rank counts last: once the CPU sees them, it sees the rest).
  //    Every peer's rank count was acquired above (then the block's barrier): its expert counts are
  //    visible, and a relaxed load reads them (a wait only if one is not there, which would be a bug).
  for (int i = tid; ok && i < W * epr; i += nt) {
    const int p = i / epr, e = i % epr;
    const uint64_t* slot = reinterpret_cast<const uint64_t*>(mine + uint64_t(a.ws.expert_slot(p, e)));
    uint64_t n = 0;
    if (!rank_live(live, p)) n = 0;  // it sent nothing
    else if (seq_reached(ld_relaxed_sys(slot + kSignalSeqWord), seq)) n = ld_relaxed_sys(slot + kSignalPayloadWord);
    else if (!wait_signal(slot, seq, a, kPhaseNotify, p, &n)) break;
    atomicAdd(&expert_cnt[e], int(n));
    if (mirror != nullptr) {
      mirror[2 * (W + i) + 1] = n;
      mirror[2 * (W + i)] = seq;
    }
  }
  ok = __syncthreads_and(ok && !gave_up(a.arrivals));
  if (arrive != nullptr && last_block_arrived(arrive) && tid < W && rank_live(live, tid) && !gave_up(a.arrivals))
    signal(slot_at(peers[tid], a.ws, a.ws.done, rank), seq);
  for (int p = tid; p <= W; p += nt) st.recv_offset[p] = ok ? recv_off[p] : 0;
  for (int p = tid; p < W; p += nt) st.recv_count[p] = ok ? recv_cnt[p] : 0;
  for (int o = tid; ok && o < recv_off[W]; o += nt) {
    int p = 0;
    while (o >= recv_off[p + 1]) ++p;
    st.recv_src_rank[o] = p;
  }
  for (int e = tid; e < epr; e += nt) st.tokens_per_expert[e] = ok ? expert_cnt[e] : 0;
  if (!ok || mirror == nullptr) return ok;
  if (tid == 0) {  // the slots this rank dropped for a dead rank's expert
    mirror[2 * (W + W * epr) + 1] = uint64_t(masked);
    mirror[2 * (W + W * epr)] = seq;
  }
  __syncthreads();  // the state above comes first: each release below is cumulative over the barrier
  if (tid < W) {
    mirror[2 * tid + 1] = uint64_t(recv_cnt[tid]);
    st_release_sys(mirror + 2 * tid, seq);
  }
  return true;
}

}  // namespace rankflow::kernels
