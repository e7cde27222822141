// MoE dispatch on the GPU: the host executor's protocol (native/src/ops/dispatch.cc) with the same
// slots, encodings and receive order, and bit-identical outputs.
//
// rf_dispatch_notify (one block): from topk_idx, each token's destination ranks, each token's index
//   among the tokens sent to a rank (a block-wide prefix sum, no atomics), and per-expert counts;
//   the counts go encoded (seq << 32 | -(count + 1)) with system-scope release stores into every
//   receiver's workspace (expert_count, then rank_count); then it waits for every peer's counts in
//   its own workspace, keeps them in the state, mirrors the raw slot values into mapped host memory
//   for the CPU-sync wait (0 = not yet), and signals `enter` to every peer carrying the first output
//   row of that peer's tokens in this rank's buffer (its payload; the host executor ignores it).
// rf_dispatch_data (num_sms blocks): waits for every receiver's enter (and learns its offset), then a
//   warp per token loads the row once (16-byte vectors) and stores it straight into every receiver's
//   buffer over NVLink, already compacted at row offset + index (receive order: source rank, then
//   token), with scales, local expert ids (-1 elsewhere), weights (0 elsewhere) and the source token.
//   The last block to finish signals `done` to every rank (itself too); every block waits for all
//   `done`s, then the grid keeps src_token and weights in the state (for combine) and copies the
//   outputs out of the buffer when asked to.
#include "moe.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

namespace {
constexpr int kNotifyThreads = 1024;
constexpr int kUnroll = 8;  // 16-byte loads in flight per lane before the stores
}  // namespace

// Dynamic shared memory: num_experts ints, then num_tokens uint64 masks (8-byte aligned).
extern "C" __global__ void __launch_bounds__(kNotifyThreads) rf_dispatch_notify(
    moe::MoeArgs a, moe::MoeState st, const int32_t* __restrict__ topk_idx, int64_t num_tokens,
    uint64_t* host_counts) {
  extern __shared__ uint64_t smem[];
  __shared__ uint64_t peers[kMaxRanks];
  __shared__ int warp_sums[32];
  __shared__ int send_cnt[kMaxRanks];
  __shared__ int recv_cnt[kMaxRanks];
  __shared__ int recv_off[kMaxRanks + 1];
  const int W = a.world, K = a.topk, E = a.num_experts, epr = a.experts_per_rank, rank = a.rank;
  const int tid = int(threadIdx.x), nt = int(blockDim.x);
  const int lane = tid & 31, warp = tid >> 5, nwarps = nt >> 5;
  const int T = int(num_tokens);
  uint64_t* masks = smem;                                        // [T]
  int* expert_cnt = reinterpret_cast<int*>(smem + T);            // [E]
  for (int p = tid; p < W; p += nt) peers[p] = a.peer_table[p];
  for (int e = tid; e < E; e += nt) expert_cnt[e] = 0;
  __syncthreads();

  // 1. Routing: the ranks each token goes to (a thread per token: coalesced reads of topk_idx), and
  //    the topk entries naming each expert. Masks stay in shared memory; the state gets a copy.
  const bool vec8 = K == 8 && (reinterpret_cast<uintptr_t>(topk_idx) & 15) == 0;
  for (int t = tid; t < T; t += nt) {
    int ids[8];
    const int32_t* row = topk_idx + int64_t(t) * K;
    if (vec8) {  // the common case: two 16-byte loads in flight at once
      const int4 lo = __ldg(reinterpret_cast<const int4*>(row));
      const int4 hi = __ldg(reinterpret_cast<const int4*>(row) + 1);
      ids[0] = lo.x; ids[1] = lo.y; ids[2] = lo.z; ids[3] = lo.w;
      ids[4] = hi.x; ids[5] = hi.y; ids[6] = hi.z; ids[7] = hi.w;
    }
    uint64_t mask = 0;
    auto count = [&](int e) {
      if (e < 0 || e >= E) return;
      mask |= uint64_t(1) << (e / epr);
      atomicAdd(&expert_cnt[e], 1);
    };
    if (vec8) {
#pragma unroll
      for (int k = 0; k < 8; ++k) count(ids[k]);
    } else {
      for (int k = 0; k < K; ++k) count(__ldg(row + k));
    }
    masks[t] = mask;
    st.dest_mask[t] = mask;
  }
  __syncthreads();
  const int chunk = (T + nt - 1) / nt;
  const int t0 = min(T, tid * chunk), t1 = min(T, t0 + chunk);

  // 2. Counts into every receiver's workspace: the expert counts (relaxed), then, after a fence, the
  //    rank count (release). Receivers wait on every slot by sequence, as the host does.
  for (int i = tid; i < W * epr; i += nt) {
    const int p = i / epr, e = i % epr;
    volatile uint64_t* slot =
        reinterpret_cast<volatile uint64_t*>(ws_base(a, peers, p) + uint64_t(a.ws.expert_slot(rank, e)));
    *slot = encode_signal(a.seq, expert_cnt[p * epr + e]);
  }
  // Per destination, each token's index among the tokens sent there: an exclusive scan over the
  // contiguous chunks (thread order = token order).
  for (int p = 0; p < W; ++p) {
    int c = 0;
    for (int t = t0; t < t1; ++t) c += int((masks[t] >> p) & 1);
    int incl = c;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += v;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      const int v = lane < nwarps ? warp_sums[lane] : 0;
      int sum = v;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, sum, d);
        if (lane >= d) sum += u;
      }
      if (lane < nwarps) warp_sums[lane] = sum - v;
      if (lane == 31) send_cnt[p] = sum;
    }
    __syncthreads();
    int pos = warp_sums[warp] + incl - c;
    for (int t = t0; t < t1; ++t) st.send_slot[int64_t(t) * W + p] = ((masks[t] >> p) & 1) ? pos++ : -1;
    __syncthreads();  // warp_sums is reused by the next destination
  }
  if (tid < W) {
    __threadfence_system();  // the expert counts (stored before the barrier above) come first
    st_release_sys(slot_ptr(ws_base(a, peers, tid), a.ws, a.ws.rank_count, rank),
                   encode_signal(a.seq, send_cnt[tid]));
    st.send_count[tid] = send_cnt[tid];
  }
  __syncthreads();  // expert_cnt is reused below

  // 3. Every peer's counts, from my workspace (a device wait).
  const uint64_t mine = ws_base(a, peers, rank);
  for (int e = tid; e < epr; e += nt) expert_cnt[e] = 0;
  __syncthreads();
  volatile uint64_t* mirror = host_counts;
  uint64_t rank_v = 0;
  if (tid < W) {
    rank_v = wait_signal(slot_ptr(mine, a.ws, a.ws.rank_count, tid), a.seq, a.timeout_ns, a.diag,
                         kPhaseNotify, tid);
    recv_cnt[tid] = int(decode_count(rank_v));
  }
  __syncthreads();
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
  //    this op, from row recv_off[tid] on.
  if (tid < W)
    st_release_sys(slot_ptr(ws_base(a, peers, tid), a.ws, a.ws.enter, rank), encode_signal(a.seq, recv_off[tid]));
  // 5. The state, and the host mirror (rank counts last: once the CPU sees them, it sees the rest).
  for (int i = tid; i < W * epr; i += nt) {
    const int p = i / epr, e = i % epr;
    const uint64_t v = wait_signal(reinterpret_cast<const uint64_t*>(mine + uint64_t(a.ws.expert_slot(p, e))),
                                   a.seq, a.timeout_ns, a.diag, kPhaseNotify, p);
    atomicAdd(&expert_cnt[e], int(decode_count(v)));
    if (mirror != nullptr) mirror[W + i] = v;
  }
  for (int p = tid; p <= W; p += nt) st.recv_offset[p] = recv_off[p];
  for (int p = tid; p < W; p += nt) st.recv_count[p] = recv_cnt[p];
  for (int o = tid; o < recv_off[W]; o += nt) {
    int p = 0;
    while (o >= recv_off[p + 1]) ++p;
    st.recv_src_rank[o] = p;
  }
  if (mirror != nullptr) __threadfence_system();
  __syncthreads();
  for (int e = tid; e < epr; e += nt) st.tokens_per_expert[e] = expert_cnt[e];
  if (tid < W && mirror != nullptr) {
    mirror[tid] = rank_v;
    __threadfence_system();
  }
}

// announce: cached dispatch (no notify ran for this seq): this kernel sends `enter` itself, with the
// offsets in the state (copied from the cached layout).
extern "C" __global__ void __launch_bounds__(512) rf_dispatch_data(
    moe::MoeArgs a, moe::MoeState st, moe::DispatchIn in, moe::DispatchOut out, int announce) {
  __shared__ uint64_t peers[kMaxRanks];
  __shared__ int offs[kMaxRanks];
  const int W = a.world, K = a.topk, E = a.num_experts, epr = a.experts_per_rank, rank = a.rank;
  const int tid = int(threadIdx.x);
  const int lane = tid & 31;
  if (tid < W) peers[tid] = a.peer_table[tid];
  __syncthreads();
  const uint64_t mine = ws_base(a, peers, rank);
  if (announce != 0 && blockIdx.x == 0 && tid < W)
    st_release_sys(slot_ptr(ws_base(a, peers, tid), a.ws, a.ws.enter, rank), encode_signal(a.seq, st.recv_offset[tid]));
  if (tid < W) {
    const uint64_t v = wait_signal(slot_ptr(mine, a.ws, a.ws.enter, tid), a.seq, a.timeout_ns, a.diag, kPhaseEnter, tid);
    offs[tid] = int(decode_count(v));
    if (blockIdx.x == 0) st.send_offset[tid] = offs[tid];
  }
  __syncthreads();

  const int64_t T = in.num_tokens;
  const int64_t row = int64_t(a.hidden) * in.x_elem_bytes;  // bytes, a multiple of 16
  const int64_t nvec = row / 16;
  const int S = in.scales != nullptr ? int(a.buf.scales_per_token) : 0;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  const int64_t first_warp = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + tid / kWarpSize;
  const char* x = static_cast<const char*>(in.x);
  for (int64_t t = first_warp; t < T; t += warps) {
    const uint64_t mask = st.dest_mask[t];
    if (mask == 0) continue;
    // Lane l holds the output row of this token at rank l (and at rank l + 32).
    int o_lo = -1, o_hi = -1;
    if (lane < W && ((mask >> lane) & 1)) o_lo = offs[lane] + st.send_slot[t * W + lane];
    if (lane + 32 < W && ((mask >> (lane + 32)) & 1)) o_hi = offs[lane + 32] + st.send_slot[t * W + lane + 32];
    const char* src = x + t * row;
    for (int64_t base = 0; base < nvec; base += kWarpSize * kUnroll) {
      int4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = base + u * kWarpSize + lane;
        if (i < nvec) v[u] = ld_nc_v4(src + i * 16);
      }
      uint64_t m = mask;
      while (m != 0) {
        const int p = __ffsll(static_cast<long long>(m)) - 1;
        m &= m - 1;
        const int o = __shfl_sync(0xffffffffu, p < 32 ? o_lo : o_hi, p & 31);
        char* dst = reinterpret_cast<char*>(buf_base(a, peers, p) + uint64_t(a.buf.x)) + int64_t(o) * row;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t i = base + u * kWarpSize + lane;
          if (i < nvec) st_v4(dst + i * 16, v[u]);
        }
      }
    }
    // Scales, topk (local expert ids and weights for that receiver only) and the source token.
    int e = -1;
    float w = 0.0f;
    if (lane < K) {
      e = in.topk_idx[t * K + lane];
      w = in.topk_weights[t * K + lane];
    }
    uint64_t m = mask;
    while (m != 0) {
      const int p = __ffsll(static_cast<long long>(m)) - 1;
      m &= m - 1;
      const int64_t o = __shfl_sync(0xffffffffu, p < 32 ? o_lo : o_hi, p & 31);
      const uint64_t b = buf_base(a, peers, p);
      if (lane < K) {
        const bool to_p = e >= 0 && e < E && e / epr == p;
        reinterpret_cast<int32_t*>(b + uint64_t(a.buf.topk_idx))[o * K + lane] = to_p ? e - p * epr : -1;
        reinterpret_cast<float*>(b + uint64_t(a.buf.topk_weights))[o * K + lane] = to_p ? w : 0.0f;
      }
      if (lane == 0) reinterpret_cast<int32_t*>(b + uint64_t(a.buf.src_token))[o] = int32_t(t);
      for (int i = lane; i < S; i += kWarpSize)
        reinterpret_cast<float*>(b + uint64_t(a.buf.scales))[o * S + i] = in.scales[t * S + i];
    }
  }

  // done: the last block signals every rank (me too: my other blocks wait for my own rows).
  if (last_block_arrived(a.arrivals) && tid < W)
    st_release_sys(slot_ptr(ws_base(a, peers, tid), a.ws, a.ws.done, rank), encode_signal(a.seq, 0));
  if (tid < W) wait_signal(slot_ptr(mine, a.ws, a.ws.done, tid), a.seq, a.timeout_ns, a.diag, kPhaseDispatchData, tid);
  __syncthreads();

  // Received: keep what combine needs, and copy the outputs out when asked.
  const int64_t num = st.recv_offset[W];
  const uint64_t b = buf_base(a, peers, rank);
  const int64_t gthreads = int64_t(gridDim.x) * blockDim.x;
  const int64_t gtid = int64_t(blockIdx.x) * blockDim.x + tid;
  const int32_t* rtok = reinterpret_cast<const int32_t*>(b + uint64_t(a.buf.src_token));
  const float* rw = reinterpret_cast<const float*>(b + uint64_t(a.buf.topk_weights));
  for (int64_t o = gtid; o < num; o += gthreads) st.recv_src_token[o] = rtok[o];
  for (int64_t i = gtid; i < num * K; i += gthreads) st.recv_topk_weights[i] = rw[i];
  if (out.x != nullptr) {
    const char* rx = reinterpret_cast<const char*>(b + uint64_t(a.buf.x));
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
      const float* rs = reinterpret_cast<const float*>(b + uint64_t(a.buf.scales));
      for (int64_t i = gtid; i < num * S; i += gthreads) out.scales[i] = rs[i];
    }
    const int32_t* ri = reinterpret_cast<const int32_t*>(b + uint64_t(a.buf.topk_idx));
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
