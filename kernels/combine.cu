// MoE combine on the GPU: the host executor's protocol (native/src/ops/combine.cc), bit-identical.
//   1. enter: block 0 announces the op to every peer; a block writes into peer p once p entered.
//   2. send: a warp per received row returns it (16-byte vectors, over NVLink) into its source rank's
//      buffer at slot my_rank * max_tokens + src_token (combine_x), with its topk weights
//      (combine_weights). Rows of my own tokens stay where they are: the reduce reads them from x.
//   3. done: the last block to finish signals every peer; every block waits for every peer's done.
//   4. reduce: a warp per token of mine sums, in fp32 and in rank order, the rows of the ranks the
//      token went to (mine straight from x at its dispatch row), adds bias0 then bias1, rounds to
//      bf16 (float_to_bf16, RNE: the host's rule); the weights likewise.
// Split mode (send_blocks > 0): blocks [0, send_blocks) only send, and after each row a warp stores
// a per-row arrival flag (seq << 32 | kFlagTag, release) into the source's flag region
// (moe::combine_flags_offset: after the combine region); blocks [send_blocks, grid) only reduce,
// waiting per token for the flags of the ranks it went to, so the reduction overlaps the transfer.
// `done` is still signalled once every block finished (nobody needs to wait for it: each reducer
// waited for exactly the rows it reads).
#include "moe.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

namespace {
constexpr int kSendUnroll = 8;
constexpr int kReduceUnroll = 4;

__device__ __forceinline__ uint64_t flag_value(uint32_t seq) { return (uint64_t(seq) << 32) | moe::kCombineFlagTag; }

// Spins until *flag == want (exact: the flag region is reused and may hold other data); acquire.
__device__ __forceinline__ void wait_flag(const uint64_t* flag, uint64_t want, uint64_t timeout_ns, Diagnostic* diag,
                                          int peer) {
  uint64_t v = ld_acquire_sys(flag);
  if (v == want) return;
  const uint64_t start = globaltimer_ns();
  while (true) {
    v = ld_acquire_sys(flag);
    if (v == want) return;
    if (globaltimer_ns() - start > timeout_ns) fail_timeout(diag, kPhaseCombineData, peer, v);
  }
}

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

extern "C" __global__ void __launch_bounds__(512) rf_combine(moe::MoeArgs a, moe::MoeState st,
                                                             moe::CombineIn in, moe::CombineOut out,
                                                             int send_blocks) {
  __shared__ uint64_t peers[kMaxRanks];
  const int W = a.world, K = a.topk, rank = a.rank;
  const int tid = int(threadIdx.x);
  const int lane = tid & 31;
  if (tid < W) peers[tid] = a.peer_table[tid];
  __syncthreads();
  const uint64_t mine = ws_base(a, peers, rank);
  if (blockIdx.x == 0 && tid < W && tid != rank)
    st_release_sys(slot_ptr(ws_base(a, peers, tid), a.ws, a.ws.enter, rank), encode_signal(a.seq, 0));
  if (tid < W && tid != rank)
    wait_signal(slot_ptr(mine, a.ws, a.ws.enter, tid), a.seq, a.timeout_ns, a.diag, kPhaseEnter, tid);
  __syncthreads();

  const int64_t maxT = a.max_tokens;
  const int64_t row = int64_t(a.hidden) * 2;
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
  const uint64_t flag = flag_value(a.seq);

  // 2. send: the rows of other ranks' tokens (received rows minus my own range).
  for (int64_t j = first_warp; sender && j < num - my_count; j += send_warps) {
    const int64_t o = j < my_first ? j : j + my_count;
    const int r = st.recv_src_rank[o];
    const int64_t slot = int64_t(rank) * maxT + st.recv_src_token[o];
    const uint64_t b = buf_base(a, peers, r);
    char* dst = reinterpret_cast<char*>(b + uint64_t(a.buf.combine_x)) + slot * row;
    const char* src = x + o * row;
    for (int64_t base = 0; base < nvec; base += kWarpSize * kSendUnroll) {
      int4 v[kSendUnroll];
#pragma unroll
      for (int u = 0; u < kSendUnroll; ++u) {
        const int64_t i = base + u * kWarpSize + lane;
        if (i < nvec) v[u] = ld_nc_v4(src + i * 16);
      }
#pragma unroll
      for (int u = 0; u < kSendUnroll; ++u) {
        const int64_t i = base + u * kWarpSize + lane;
        if (i < nvec) st_v4(dst + i * 16, v[u]);
      }
    }
    if (lane < K)
      reinterpret_cast<float*>(b + uint64_t(a.buf.combine_weights))[slot * K + lane] = wsrc[o * K + lane];
    if (split) {
      __syncwarp();  // every lane's stores of the row come before lane 0's release
      if (lane == 0)
        st_release_sys(reinterpret_cast<uint64_t*>(b + uint64_t(moe::combine_flags_offset(a.buf))) + slot, flag);
    }
  }

  // 3. done.
  if (last_block_arrived(a.arrivals) && tid < W && tid != rank)
    st_release_sys(slot_ptr(ws_base(a, peers, tid), a.ws, a.ws.done, rank), encode_signal(a.seq, 0));
  if (!split && tid < W && tid != rank)
    wait_signal(slot_ptr(mine, a.ws, a.ws.done, tid), a.seq, a.timeout_ns, a.diag, kPhaseCombineData, tid);
  if (!split) __syncthreads();
  if (split && sender) return;

  // 4. reduce.
  const int64_t T = in.num_tokens;
  const uint64_t b = buf_base(a, peers, rank);
  const char* cx = reinterpret_cast<const char*>(b + uint64_t(a.buf.combine_x));
  const float* cw = reinterpret_cast<const float*>(b + uint64_t(a.buf.combine_weights));
  const char* bias0 = reinterpret_cast<const char*>(in.bias0);
  const char* bias1 = reinterpret_cast<const char*>(in.bias1);
  char* ox = reinterpret_cast<char*>(out.x);
  const uint64_t* flags = reinterpret_cast<const uint64_t*>(b + uint64_t(moe::combine_flags_offset(a.buf)));
  for (int64_t t = reduce_first; t < T; t += reduce_warps) {
    const uint64_t mask = st.dest_mask[t];
    if (split) {
      if (lane == 0) {
        uint64_t m = mask & ~(uint64_t(1) << rank);
        while (m != 0) {
          const int p = __ffsll(static_cast<long long>(m)) - 1;
          m &= m - 1;
          wait_flag(flags + int64_t(p) * maxT + t, flag, a.timeout_ns, a.diag, p);
        }
      }
      __syncwarp();
    }
    const int64_t local_row = ((mask >> rank) & 1) ? my_first + st.send_slot[t * W + rank] : -1;
    for (int64_t base = 0; base < nvec; base += kWarpSize * kReduceUnroll) {
      float acc[kReduceUnroll][8];
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[u][j] = 0.0f;
      // Two source ranks at a time (in rank order), so that twice the loads are in flight.
      uint64_t m = mask;
      while (m != 0) {
        const int p0 = __ffsll(static_cast<long long>(m)) - 1;
        m &= m - 1;
        const int p1 = m != 0 ? __ffsll(static_cast<long long>(m)) - 1 : -1;
        if (p1 >= 0) m &= m - 1;
        const char* src0 = p0 == rank ? x + local_row * row : cx + (int64_t(p0) * maxT + t) * row;
        const char* src1 = p1 == rank ? x + local_row * row : cx + (int64_t(p1) * maxT + t) * row;
        int4 v0[kReduceUnroll], v1[kReduceUnroll];
#pragma unroll
        for (int u = 0; u < kReduceUnroll; ++u) {
          const int64_t i = base + u * kWarpSize + lane;
          if (i < nvec) {
            v0[u] = ld_v4(src0 + i * 16);
            if (p1 >= 0) v1[u] = ld_v4(src1 + i * 16);
          }
        }
#pragma unroll
        for (int u = 0; u < kReduceUnroll; ++u)
          if (base + u * kWarpSize + lane < nvec) {
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
          if (i < nvec) v[u] = ld_nc_v4(biases[k] + t * row + i * 16);
        }
#pragma unroll
        for (int u = 0; u < kReduceUnroll; ++u)
          if (base + u * kWarpSize + lane < nvec) add8(acc[u], v[u]);
      }
#pragma unroll
      for (int u = 0; u < kReduceUnroll; ++u) {
        const int64_t i = base + u * kWarpSize + lane;
        if (i < nvec) st_v4(ox + t * row + i * 16, pack8(acc[u]));
      }
    }
    if (lane < K) {
      float w = 0.0f;
      uint64_t m = mask;
      while (m != 0) {
        const int p = __ffsll(static_cast<long long>(m)) - 1;
        m &= m - 1;
        w += p == rank ? wsrc[local_row * K + lane] : cw[(int64_t(p) * maxT + t) * K + lane];
      }
      out.topk_weights[t * K + lane] = w;
    }
  }
}
