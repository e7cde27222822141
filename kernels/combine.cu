// MoE combine on the GPU: the host executor's protocol (native/src/backends/host/moe.cc), bit-identical.
//   1. enter: block 0 announces the op to every peer; a block writes into peer p once p entered.
//   (2. and 4. split rows into chunks of whole lane loads when there are more warps than rows: at
//   small batches a row's steps run side by side in several warps; the sums are the same per element.)
//   2. send: a warp per received row returns it (16-byte vectors, over NVLink) into its source rank's
//      buffer at slot my_rank * max_tokens + src_token (combine_x), with its topk weights
//      (combine_weights). Rows of my own tokens stay where they are: the reduce reads them from x.
//   3. done: the last block to finish signals every peer; every block waits for every peer's done.
//   4. reduce: a warp per token of mine sums, in fp32 and in rank order, the rows of the ranks the
//      token went to (mine straight from x at its dispatch row), adds bias0 then bias1, rounds to
//      bf16 (float_to_bf16, RNE: the host's rule); the weights likewise.
// Split mode (send_blocks > 0): blocks [0, send_blocks) only send, and after each row a warp stores
// a per-row arrival flag (combine_flag(seq), release) into the source's flag region
// (buf.combine_flags); blocks [send_blocks, grid) only reduce, waiting per token for the flags of
// the ranks it went to, so the reduction overlaps the transfer.
// `done` is still signalled once every block finished (nobody needs to wait for it: each reducer
// waited for exactly the rows it reads).
// A wait that gives up (common.cuh) skips the work after it; nothing is signalled by a rank that gave up.
// Elastic: no rank outside the live mask is signalled or waited for, and no row of one is summed.
#include "moe.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

namespace {
constexpr int kSendUnroll = 8;
constexpr int kReduceUnroll = 4;

__device__ __forceinline__ void add8(float* acc, const int4& v) {
  const uint32_t w[4] = {uint32_t(v.x), uint32_t(v.y), uint32_t(v.z), uint32_t(v.w)};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    acc[2 * j] += bf_lo(w[j]);
    acc[2 * j + 1] += bf_hi(w[j]);
  }
}

__device__ __forceinline__ int4 pack8(const float* acc) {
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    w[j] = uint32_t(float_to_bf16(acc[2 * j])) | (uint32_t(float_to_bf16(acc[2 * j + 1])) << 16);
  return make_int4(int(w[0]), int(w[1]), int(w[2]), int(w[3]));
}
}  // namespace

extern "C" __global__ void __launch_bounds__(512) rf_combine(const CombineArgs args) {
  __shared__ uint64_t peers[kMaxRanks];
  __shared__ unsigned long long refused_bits;
  const RankArgs& a = args.r;
  const MoeShape& m = args.m;
  const MoeState& st = args.st;
  const CombineIn& in = args.in;
  const CombineOut& out = args.out;
  const int send_blocks = args.send_blocks;
  const int W = a.world, K = m.topk, rank = a.rank;
  const int tid = int(threadIdx.x);
  const int lane = tid & 31;
  const uint64_t seq = op_seq(a), live = live_ranks(a);
  if (tid < W) peers[tid] = a.peers[tid];
  if (tid == 0) refused_bits = 0;
  __syncthreads();
  const uint64_t mine = peers[rank];
  const bool peer = tid < W && tid != rank && rank_live(live, tid);
  if (blockIdx.x == 0 && peer && !gave_up(a.arrivals))
    signal(slot_at(peers[tid], a.ws, a.ws.enter, rank), seq, 0, args.fingerprint);
  bool ok = true;
  if (peer) {
    uint64_t tag = 0;
    ok = wait_signal(slot_at(mine, a.ws, a.ws.enter, tid), seq, a, kPhaseEnter, tid, nullptr, &tag);
    // Rank tid combines another dispatch's handle: its rows go nowhere, and the op is reported.
    if (ok && tag != args.fingerprint) {
      if (blockIdx.x == 0) report_bad(a.ctl, seq, kBadHandle, tid);
      atomicOr(&refused_bits, 1ull << tid);
    }
  }
  ok = __syncthreads_and(ok);
  const uint64_t refused = refused_bits, skip = refused | ~live;  // no row goes to a refused or dead rank

  const int64_t maxT = m.max_tokens;
  const int64_t row = int64_t(m.hidden) * 2;
  const int64_t nvec = row / 16;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  const int64_t first_warp = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + tid / kWarpSize;
  const float* wsrc = in.topk_weights != nullptr ? in.topk_weights : st.recv_topk_weights;
  const char* x = reinterpret_cast<const char*>(in.x);
  const int64_t num = st.recv_offset[W];
  const int64_t my_first = st.recv_offset[rank], my_count = st.recv_offset[rank + 1] - my_first;

  const bool split = send_blocks > 0;
  const bool sender = !split || int(blockIdx.x) < send_blocks;
  const int64_t send_warps = split ? int64_t(send_blocks) * (blockDim.x / kWarpSize) : warps;
  const int64_t reduce_warps = split ? warps - send_warps : warps;
  const int64_t reduce_first = split ? first_warp - send_warps : first_warp;
  const uint64_t flag = combine_flag(seq);
  // Rows in chunks when there are more warps than rows (row_chunks, common.cuh). Split mode sends whole
  // rows (counted as no spare warps): a row's arrival flag follows all of its stores.
  constexpr int64_t kSendStep = int64_t(kWarpSize) * kSendUnroll, kReduceStep = int64_t(kWarpSize) * kReduceUnroll;
  const int64_t sent = num - my_count;
  const RowChunks send_rc = row_chunks(sent, split ? 0 : send_warps, nvec);
  const int64_t send_chunks = send_rc.chunks, send_chunk_vecs = send_rc.vecs;

  // 2. send: the rows of other ranks' tokens (received rows minus my own range).
  for (int64_t item = first_warp; ok && sender && item < sent * send_chunks; item += send_warps) {
    const int64_t j = item / send_chunks, chunk = item - j * send_chunks;
    const int64_t o = j < my_first ? j : j + my_count;
    const int r = st.recv_src_rank[o];
    if ((skip >> r) & 1) continue;
    const int64_t slot = int64_t(rank) * maxT + st.recv_src_token[o];
    const uint64_t b = buf_base(a, peers, r);
    char* dst = reinterpret_cast<char*>(b + uint64_t(m.buf.combine_x)) + slot * row;
    const char* src = x + o * row;
    const int64_t lo = chunk * send_chunk_vecs, hi = min(nvec, lo + send_chunk_vecs);
    for (int64_t base = lo; base < hi; base += kSendStep) {
      int4 v[kSendUnroll];
#pragma unroll
      for (int u = 0; u < kSendUnroll; ++u) {
        const int64_t i = base + u * kWarpSize + lane;
        if (i < hi) v[u] = ld_nc_v4(src + i * 16);
      }
#pragma unroll
      for (int u = 0; u < kSendUnroll; ++u) {
        const int64_t i = base + u * kWarpSize + lane;
        if (i < hi) st_v4(dst + i * 16, v[u]);
      }
    }
    if (chunk != 0) continue;
    if (lane < K)
      reinterpret_cast<float*>(b + uint64_t(m.buf.combine_weights))[slot * K + lane] = wsrc[o * K + lane];
    if (split) {
      __syncwarp();  // every lane's stores of the row come before lane 0's release
      if (lane == 0) st_release_sys(reinterpret_cast<uint64_t*>(b + uint64_t(m.buf.combine_flags)) + slot, flag);
    }
  }

  // 3. done.
  if (last_block_arrived(a.arrivals) && peer && !gave_up(a.arrivals))
    signal(slot_at(peers[tid], a.ws, a.ws.done, rank), seq);
  if (!split) {
    bool arrived = true;
    if (peer) arrived = wait_signal(slot_at(mine, a.ws, a.ws.done, tid), seq, a, kPhaseCombineData, tid);
    ok = __syncthreads_and(ok && arrived);
  }
  if (!ok || (split && sender)) return;

  // 4. reduce.
  const int64_t T = in.num_tokens;
  const uint64_t b = buf_base(a, peers, rank);
  const char* cx = reinterpret_cast<const char*>(b + uint64_t(m.buf.combine_x));
  const float* cw = reinterpret_cast<const float*>(b + uint64_t(m.buf.combine_weights));
  const char* bias0 = reinterpret_cast<const char*>(in.bias0);
  const char* bias1 = reinterpret_cast<const char*>(in.bias1);
  char* ox = reinterpret_cast<char*>(out.x);
  const uint64_t* flags = reinterpret_cast<const uint64_t*>(b + uint64_t(m.buf.combine_flags));
  const RowChunks reduce_rc = row_chunks(T, reduce_warps, nvec);
  const int64_t reduce_chunks = reduce_rc.chunks, reduce_chunk_vecs = reduce_rc.vecs;
  for (int64_t item = reduce_first; item < T * reduce_chunks; item += reduce_warps) {
    const int64_t t = item / reduce_chunks, chunk = item - t * reduce_chunks;
    const uint64_t mask = st.dest_mask[t] & live;  // the dispatch's routing left the dead out already
    if (split) {
      bool arrived = true;
      if (lane == 0) {
        uint64_t mm = mask & ~(uint64_t(1) << rank) & ~refused;  // a refused peer sends no rows
        while (arrived && mm != 0) {
          const int p = __ffsll(static_cast<long long>(mm)) - 1;
          mm &= mm - 1;
          arrived = wait_until(flags + int64_t(p) * maxT + t, [flag](uint64_t v) { return v == flag; }, a,
                               kPhaseCombineData, p);
        }
      }
      if (__shfl_sync(0xffffffffu, arrived ? 1 : 0, 0) == 0) return;  // gave up: the whole warp stops
    }
    const int64_t local_row = ((mask >> rank) & 1) ? my_first + st.send_slot[t * W + rank] : -1;
    const int64_t lo = chunk * reduce_chunk_vecs, hi = min(nvec, lo + reduce_chunk_vecs);
    for (int64_t base = lo; base < hi; base += kReduceStep) {
      float acc[kReduceUnroll][8];
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[u][j] = 0.0f;
      // Two source ranks at a time (in rank order), so that twice the loads are in flight.
      uint64_t mm = mask;
      while (mm != 0) {
        const int p0 = __ffsll(static_cast<long long>(mm)) - 1;
        mm &= mm - 1;
        const int p1 = mm != 0 ? __ffsll(static_cast<long long>(mm)) - 1 : -1;
        if (p1 >= 0) mm &= mm - 1;
        const char* src0 = p0 == rank ? x + local_row * row : cx + (int64_t(p0) * maxT + t) * row;
        const char* src1 = p1 == rank ? x + local_row * row : cx + (int64_t(p1) * maxT + t) * row;
        int4 v0[kReduceUnroll], v1[kReduceUnroll];
#pragma unroll
        for (int u = 0; u < kReduceUnroll; ++u) {
          const int64_t i = base + u * kWarpSize + lane;
          if (i < hi) {
            v0[u] = ld_v4(src0 + i * 16);
            if (p1 >= 0) v1[u] = ld_v4(src1 + i * 16);
          }
        }
#pragma unroll
        for (int u = 0; u < kReduceUnroll; ++u)
          if (base + u * kWarpSize + lane < hi) {
            add8(acc[u], v0[u]);
            if (p1 >= 0) add8(acc[u], v1[u]);
          }
      }
      const char* biases[2] = {bias0, bias1};
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        if (biases[k] == nullptr) continue;
        int4 v[kReduceUnroll];
#pragma unroll
        for (int u = 0; u < kReduceUnroll; ++u) {
          const int64_t i = base + u * kWarpSize + lane;
          if (i < hi) v[u] = ld_nc_v4(biases[k] + t * row + i * 16);
        }
#pragma unroll
        for (int u = 0; u < kReduceUnroll; ++u)
          if (base + u * kWarpSize + lane < hi) add8(acc[u], v[u]);
      }
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u) {
        const int64_t i = base + u * kWarpSize + lane;
        if (i < hi) st_v4(ox + t * row + i * 16, pack8(acc[u]));
      }
    }
    if (lane < K && chunk == 0) {
      float w = 0.0f;
      uint64_t mm = mask;
      while (mm != 0) {
        const int p = __ffsll(static_cast<long long>(mm)) - 1;
        mm &= mm - 1;
        w += p == rank ? wsrc[local_row * K + lane] : cw[(int64_t(p) * maxT + t) * K + lane];
      }
      out.topk_weights[t * K + lane] = w;
    }
  }
}
