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
//   `done`s, then the grid keeps src_token and weights in the state (for combine) and copies the
//   outputs out of the buffer when asked to.
#include "moe.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

namespace {
constexpr int kUnroll = 8;  // 16-byte loads in flight per lane before the stores
}  // namespace

extern "C" __global__ void __launch_bounds__(512) rf_dispatch_data(const DispatchArgs args) {
  __shared__ uint64_t peers[kMaxRanks];
  __shared__ int offs[kMaxRanks];
  __shared__ unsigned long long refused_bits;
  const RankArgs& a = args.r;
  const MoeShape& m = args.m;
  const MoeState& st = args.st;
  const DispatchIn& in = args.in;
  const DispatchOut& out = args.out;
  const int W = a.world, K = m.topk, E = m.num_experts, epr = m.experts_per_rank, rank = a.rank;
  const int tid = int(threadIdx.x);
  const int lane = tid & 31;
  const uint64_t seq = op_seq(a);
  if (tid < W) peers[tid] = a.peers[tid];
  if (tid == 0) refused_bits = 0;
  __syncthreads();
  const uint64_t mine = peers[rank];
  // My own rows need no enter: my buffer's earlier readers are earlier work of my stream, and my
  // offset in it is in my state (a wait on my own slot cost every op ~1.7 µs: the signal's round
  // trip through the memory system, block 0's store to the other blocks' loads).
  if (args.announce != 0 && blockIdx.x == 0 && tid < W && tid != rank && !gave_up(a.arrivals))
    signal(slot_at(peers[tid], a.ws, a.ws.enter, rank), seq, uint64_t(st.recv_offset[tid]), args.fingerprint);
  bool ok = true;
  if (tid == rank) {
    ok = !gave_up(a.arrivals);  // a notify that gave up announced nothing, to me neither
    offs[tid] = st.recv_offset[tid];
    if (blockIdx.x == 0) st.send_offset[tid] = offs[tid];
  } else if (tid < W) {
    uint64_t o = 0, tag = 0;
    ok = wait_signal(slot_at(mine, a.ws, a.ws.enter, tid), seq, a, kPhaseEnter, tid, &o, &tag);
    offs[tid] = int(o);
    if (ok && blockIdx.x == 0) st.send_offset[tid] = int(o);
    // Receiver tid replays another dispatch's routing: its offsets mean nothing to me. Nothing is
    // sent to it (done still is), and the op is reported; tid finds my tag wrong as well.
    if (ok && tag != args.fingerprint) {
      if (blockIdx.x == 0) report_bad(a.ctl, seq, kBadHandle, tid);
      atomicOr(&refused_bits, 1ull << tid);
    }
  }
  ok = __syncthreads_and(ok);
  const uint64_t refused = refused_bits;

  const int64_t T = in.num_tokens;
  const int64_t row = int64_t(m.hidden) * in.x_elem_bytes;  // bytes, a multiple of 16
  const int64_t nvec = row / 16;
  const int S = in.scales != nullptr ? int(m.buf.scales_per_token) : 0;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  const int64_t first_warp = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + tid / kWarpSize;
  const char* x = static_cast<const char*>(in.x);
  // Work items: (token, chunk of its row): row_chunks (common.cuh).
  constexpr int64_t kStep = int64_t(kWarpSize) * kUnroll;  // vectors per warp step
  const RowChunks rc = row_chunks(T, warps, nvec);
  const int64_t chunks = rc.chunks, chunk_vecs = rc.vecs;
  for (int64_t j = first_warp; ok && j < T * chunks; j += warps) {
    const int64_t t = j / chunks, chunk = j - t * chunks;
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
    }
    if (mask == 0) continue;
    // Lane l holds the output row of this token at rank l (and at rank l + 32).
    const int o_lo = lane < W && ((mask >> lane) & 1) ? offs[lane] + s_lo : -1;
    const int o_hi = lane + 32 < W && ((mask >> (lane + 32)) & 1) ? offs[lane + 32] + s_hi : -1;
    mask &= ~refused;  // receivers that replay another handle get nothing
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
      }
      if (lane == 0) {
        reinterpret_cast<int32_t*>(b + uint64_t(m.buf.src_token))[o] = int32_t(t);
        reinterpret_cast<int32_t*>(b + uint64_t(m.buf.src_rank))[o] = rank;
      }
      for (int i = lane; i < S; i += kWarpSize)
        reinterpret_cast<float*>(b + uint64_t(m.buf.scales))[o * S + i] = in.scales[t * S + i];
    }
  }

  // done: the last block signals every rank (me too: my other blocks wait for my own rows).
  if (last_block_arrived(a.arrivals) && tid < W && !gave_up(a.arrivals))
    signal(slot_at(peers[tid], a.ws, a.ws.done, rank), seq);
  ok = true;
  if (tid < W) ok = wait_signal(slot_at(mine, a.ws, a.ws.done, tid), seq, a, kPhaseDispatchData, tid);
  if (!__syncthreads_and(ok)) return;

  // Received: keep what combine needs, and copy the outputs out when asked.
  const int64_t num = st.recv_offset[W];
  const uint64_t b = buf_base(a, peers, rank);
  const int64_t gthreads = int64_t(gridDim.x) * blockDim.x;
  const int64_t gtid = int64_t(blockIdx.x) * blockDim.x + tid;
  const int32_t* rtok = reinterpret_cast<const int32_t*>(b + uint64_t(m.buf.src_token));
  const float* rw = reinterpret_cast<const float*>(b + uint64_t(m.buf.topk_weights));
  for (int64_t o = gtid; o < num; o += gthreads) st.recv_src_token[o] = rtok[o];
  for (int64_t i = gtid; i < num * K; i += gthreads) st.recv_topk_weights[i] = rw[i];
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
