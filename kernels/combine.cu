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
// Pull mode (args.pull: every rank is a rank of this process on this GPU, x a device tensor): no send
// and no copy. Each rank's enter carries its x and its weights' addresses (words 3 and 4 of the slot;
// device addresses, valid for every rank of the process), and the reduce reads each pair's row where
// it lies: rank p's x at row send_offset[p] + send_slot[t][p]. The same bytes the send would have
// copied, summed in the same order: bit-identical. The last block signals `done` once every block
// has reduced, and waits for every peer's `done` before the kernel ends (a peer may still read my x
// until then). Ranks sharing a GPU thus read every received row once instead of three times (two
// ranks, 4096 tokens: 352 MB instead of 587 MB moved).
// A group of one rank runs rf_combine_local instead (at the end of this file).
// A wait that gives up (common.cuh) skips the work after it; nothing is signalled by a rank that gave up.
// Elastic: no rank outside the live mask is signalled or waited for, and no row of one is summed.
#include "moe.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

namespace {
constexpr int kSendUnroll = 8;
constexpr int kReduceUnroll = 4;
// The sources whose weights a reduce loads before the rows (the rest after them).
constexpr int kEarlyWeights = 2;

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
  __shared__ const char* px[kMaxRanks];   // pull: rank p's x
  __shared__ const float* pw[kMaxRanks];  // pull: rank p's weights
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
  const bool pull = args.pull != 0;
  const float* wsrc = in.topk_weights != nullptr ? in.topk_weights : st.recv_topk_weights;
  const char* x = reinterpret_cast<const char*>(in.x);
  if (tid < W) peers[tid] = a.peers[tid];
  if (tid == 0) refused_bits = 0;
  if (tid == rank) px[tid] = x, pw[tid] = wsrc;
  __syncthreads();
  const uint64_t mine = peers[rank];
  const bool peer = tid < W && tid != rank && rank_live(live, tid);
  if (blockIdx.x == 0 && peer && !gave_up(a.arrivals)) {
    uint64_t* s = slot_at(peers[tid], a.ws, a.ws.enter, rank);
    if (pull) {  // my addresses, after what my stream wrote there (the release below orders them)
      __threadfence();
      st_relaxed_sys(s + kSignalAddrWord, uint64_t(reinterpret_cast<uintptr_t>(x)));
      st_relaxed_sys(s + kSignalAddrWord + 1, uint64_t(reinterpret_cast<uintptr_t>(wsrc)));
    }
    signal(s, seq, 0, args.fingerprint);
  }
  bool ok = true;
  if (peer) {
    uint64_t tag = 0;
    const uint64_t* s = slot_at(mine, a.ws, a.ws.enter, tid);
    ok = wait_signal(s, seq, a, kPhaseEnter, tid, nullptr, &tag);
    if (ok && pull) {
      px[tid] = reinterpret_cast<const char*>(ld_relaxed_sys(s + kSignalAddrWord));
      pw[tid] = reinterpret_cast<const float*>(ld_relaxed_sys(s + kSignalAddrWord + 1));
    }
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

  // 2. send: the rows of other ranks' tokens (received rows minus my own range). Pull: none.
  for (int64_t item = first_warp; ok && sender && !pull && item < sent * send_chunks; item += send_warps) {
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

  // 3. done (pull: after the reduce).
  if (!pull && last_block_arrived(a.arrivals) && peer && !gave_up(a.arrivals))
    signal(slot_at(peers[tid], a.ws, a.ws.done, rank), seq);
  if (!split && !pull) {
    bool arrived = true;
    if (peer) arrived = wait_signal(slot_at(mine, a.ws, a.ws.done, tid), seq, a, kPhaseCombineData, tid);
    ok = __syncthreads_and(ok && arrived);
  }
  if ((!ok && !pull) || (split && sender)) return;

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
  const int* soff = st.send_offset;  // pull: my tokens' first row at rank p
  const bool biased = bias0 != nullptr || bias1 != nullptr;
  for (int64_t item = reduce_first; ok && item < T * reduce_chunks; item += reduce_warps) {
    const int64_t t = item / reduce_chunks, chunk = item - t * reduce_chunks;
    const uint64_t mask0 = st.dest_mask[t] & live;  // the dispatch's routing left the dead out already
    // The token's slot at every rank (lane p: rank p, and p + 32), loaded beside the mask: each
    // source row's address is then one shuffle away, not a load after the mask's.
    const int s_lo = lane < W ? st.send_slot[t * W + lane] : -1;
    const int s_hi = lane + 32 < W ? st.send_slot[t * W + lane + 32] : -1;
    if (split) {
      bool arrived = true;
      if (lane == 0) {
        uint64_t mm = mask0 & ~(uint64_t(1) << rank) & ~refused;  // a refused peer sends no rows
        while (arrived && mm != 0) {
          const int p = __ffsll(static_cast<long long>(mm)) - 1;
          mm &= mm - 1;
          arrived = wait_until(flags + int64_t(p) * maxT + t, [flag](uint64_t v) { return v == flag; }, a,
                               kPhaseCombineData, p);
        }
      }
      if (__shfl_sync(0xffffffffu, arrived ? 1 : 0, 0) == 0) return;  // gave up: the whole warp stops
    }
    const uint64_t mask = pull ? mask0 & ~refused : mask0;  // pull: a refused peer's offsets mean nothing here
    // Row index of the token's row at rank p: in p's x (pull, or p = me), else in my combine region.
    auto row_at = [&](int p) -> int64_t {
      const int sl = __shfl_sync(0xffffffffu, p < 32 ? s_lo : s_hi, p & 31);
      if (pull) return int64_t(soff[p]) + sl;
      return p == rank ? my_first + sl : int64_t(p) * maxT + t;
    };
    auto src_of = [&](int p) { return (pull || p == rank ? px[p] : cx) + row_at(p) * row; };
    auto w_of = [&](int p) { return (pull || p == rank ? pw[p] : cw) + row_at(p) * K; };
    // The first sources' weights are loaded now and summed after the rows (same order): their
    // latency hides behind the rows' instead of following them.
    float wv[kEarlyWeights];
    uint64_t wm = mask;
    int early = 0;
    if (chunk == 0) {
#pragma unroll
      for (int k = 0; k < kEarlyWeights; ++k) {
        wv[k] = 0.0f;
        if (wm == 0) continue;
        const int p = __ffsll(static_cast<long long>(wm)) - 1;
        wm &= wm - 1;
        const float* wp = w_of(p);
        if (lane < K) wv[k] = wp[lane];
        early = k + 1;
      }
    }
    const int64_t lo = chunk * reduce_chunk_vecs, hi = min(nvec, lo + reduce_chunk_vecs);
      // One source and no bias (every token of one rank, most of a rank's own): the second source's
      // registers take the row's next step instead, so twice the loads are in flight; that step's
      // output is its row through fp32 and back (0 + x, rounded), as the sum of one row is.
      const bool one = __popcll(mask) == 1 && !biased;
      const int64_t step = one ? 2 * kReduceStep : kReduceStep;
      for (int64_t base = lo; base < hi; base += step) {
        float acc[kReduceUnroll][8];
#pragma unroll
        for (int u = 0; u < kReduceUnroll; ++u)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[u][j] = 0.0f;
        // Two source ranks at a time (in rank order), so that twice the loads are in flight.
        int4 v0[kReduceUnroll], v1[kReduceUnroll];
        uint64_t mm = mask;
        while (mm != 0) {
          const int p0 = __ffsll(static_cast<long long>(mm)) - 1;
          mm &= mm - 1;
          const int p1 = mm != 0 ? __ffsll(static_cast<long long>(mm)) - 1 : -1;
          if (p1 >= 0) mm &= mm - 1;
          const char* src0 = src_of(p0);
          const char* src1 = one ? src0 + kReduceStep * 16 : p1 >= 0 ? src_of(p1) : src0;
#pragma unroll
          for (int u = 0; u < kReduceUnroll; ++u) {
            const int64_t i = base + u * kWarpSize + lane;
            if (i < hi) v0[u] = ld_v4(src0 + i * 16);
            if (one ? i + kReduceStep < hi : p1 >= 0 && i < hi) v1[u] = ld_v4(src1 + i * 16);
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
        if (one)
#pragma unroll
          for (int u = 0; u < kReduceUnroll; ++u) {
            const int64_t i = base + kReduceStep + u * kWarpSize + lane;
            float next[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            add8(next, v1[u]);
            if (i < hi) st_v4(ox + t * row + i * 16, pack8(next));
          }
      }
    if (chunk == 0) {
      float w = 0.0f;
#pragma unroll
      for (int k = 0; k < kEarlyWeights; ++k)
        if (k < early) w += wv[k];
      while (wm != 0) {
        const int p = __ffsll(static_cast<long long>(wm)) - 1;
        wm &= wm - 1;
        const float* wp = w_of(p);
        if (lane < K) w += wp[lane];
      }
      if (lane < K) out.topk_weights[t * K + lane] = w;
    }
  }

  // Pull: done, once every block has read its rows; the last block waits for every peer's (my x may
  // be read until then). A block whose enter gave up arrives too: the count ends at zero.
  if (pull && last_block_arrived(a.arrivals) && peer) {
    if (!gave_up(a.arrivals)) signal(slot_at(peers[tid], a.ws, a.ws.done, rank), seq);
    wait_signal(slot_at(mine, a.ws, a.ws.done, tid), seq, a, kPhaseCombineData, tid);
  }
}

// rf_combine_local: the combine of a group of one rank (launch.cc picks it; no peer, so no signal, no
// wait and no arrival). Each token's output is its one row (if it went to me: mask bit 0) plus the
// biases, in fp32 in that order and rounded as rf_combine rounds: the same bits. A kernel of its
// own because rf_combine's peer paths hold 128 registers per thread, one block of 512 threads per
// SM: 16 warps with 4 loads each in flight did not keep HBM busy (1 rank, 4096 tokens: 44 µs, the
// copy of the same bytes 31 µs).
// Balanced (issue 36, v37): the op is T x ceil(nvec / 32) groups of 32 vectors (a group is one warp
// load, all in one token's row), and warp w of the grid takes the contiguous groups
// [Q w / warps, Q (w + 1) / warps): every warp moves the same bytes, whereas a warp per token left
// 4096 tokens on 3168 warps as one full round and a 29% one (the op's tail). A warp's routing (slot
// and mask of 32 tokens from its first, lane l: token + l) is loaded once, before its first row
// loads; each group's slot is a shuffle away, not a load after the mask's. Its tokens' weights (those
// whose first group is in its range) are loaded at the start and stored at the end.
// RF_CL_PIPE: the next step's loads are issued before this step's sums and stores (two steps in
// flight per warp, kLocalUnroll loads each). RF_CL_CS: the output rows stored with st.global.cs.
#ifndef RF_CL_UNROLL
#define RF_CL_UNROLL 8
#endif
#ifndef RF_CL_PIPE
#define RF_CL_PIPE 0
#endif
#ifndef RF_CL_MINB
#define RF_CL_MINB 2
#endif
#ifndef RF_CL_CS
#define RF_CL_CS 0
#endif
namespace {
constexpr int kLocalUnroll = RF_CL_UNROLL;
__device__ __forceinline__ void st_out_v4(void* p, const int4& v) {
#if RF_CL_CS
  asm volatile("st.global.cs.v4.s32 [%0], {%1, %2, %3, %4};" : : "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
#else
  st_v4(p, v);
#endif
}
}  // namespace

extern "C" __global__ void __launch_bounds__(256, RF_CL_MINB) rf_combine_local(const CombineArgs args) {
  const MoeShape& m = args.m;
  const MoeState& st = args.st;
  const CombineIn& in = args.in;
  const int K = m.topk, lane = int(threadIdx.x) & 31;
  const float* wsrc = in.topk_weights != nullptr ? in.topk_weights : st.recv_topk_weights;
  const char* x = reinterpret_cast<const char*>(in.x);
  const char* bias0 = reinterpret_cast<const char*>(in.bias0);
  const char* bias1 = reinterpret_cast<const char*>(in.bias1);
  char* ox = reinterpret_cast<char*>(args.out.x);
  const int64_t row = int64_t(m.hidden) * 2, nvec = row / 16, T = in.num_tokens;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  const int64_t wid = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  const uint64_t live = live_ranks(args.r) & 1u;
  const int gpr = int((nvec + kWarpSize - 1) / kWarpSize), nv = int(nvec);  // groups per row (32-bit indices: fewer registers)
  const int64_t Q = T * gpr;
  const int q0 = int(Q * wid / warps), q1 = int(Q * (wid + 1) / warps);
  if (q0 >= q1) return;
  // The weights of the tokens whose first group is mine: the first 32 (token, k) now, stored at the end.
  const int ts = (q0 + gpr - 1) / gpr, te = (q1 + gpr - 1) / gpr, nw = (te - ts) * K;
  float w0 = 0.0f;
  bool m0 = false;
  int wt0 = 0;
  int wk0 = 0;
  if (lane < nw) {
    wt0 = ts + lane / K, wk0 = lane % K;
    m0 = (st.dest_mask[wt0] & live) != 0;
    const int s = st.send_slot[wt0];
    if (m0) w0 = wsrc[int64_t(s) * K + wk0];
  }
  // The routing window: lane l holds token tw + l's slot and whether it came to me.
  int tw = q0 / gpr;
  int wslot = 0, wmine = 0;
  auto load_window = [&](int t0) {
    const int t = t0 + lane;
    wslot = t < T ? st.send_slot[t] : 0;
    wmine = t < T && (st.dest_mask[t] & live) != 0 ? 1 : 0;
  };
  load_window(tw);
  constexpr int U = kLocalUnroll;
  // A step: U groups from (token t, group g of its row), flat group q.
  auto load_step = [&](int4 (&v)[U], unsigned& bits, int t, int g, int q) {
    if (t + U > tw + kWarpSize) {  // warp-uniform; only rows of fewer than U groups get here
      tw = t;
      load_window(tw);
    }
    bits = 0;
    int tu = t, gu = g;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u != 0 && ++gu >= gpr) gu = 0, ++tu;
      const int sl = __shfl_sync(0xffffffffu, wslot, (tu - tw) & 31);
      const int mn = __shfl_sync(0xffffffffu, wmine, (tu - tw) & 31);
      const int i = gu * kWarpSize + lane;
      if (q + u < q1 && mn != 0) {
        bits |= 1u << u;
        if (i < nv) v[u] = ld_nc_v4(x + int64_t(sl) * row + int64_t(i) * 16);
      }
    }
  };
  auto store_step = [&](const int4 (&v)[U], unsigned bits, int t, int g, int q) {
    int tu = t, gu = g;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u != 0 && ++gu >= gpr) gu = 0, ++tu;
      const int i = gu * kWarpSize + lane;
      if (q + u >= q1 || i >= nv) continue;
      const int64_t at = int64_t(tu) * row + int64_t(i) * 16;
      float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      if ((bits >> u) & 1u) add8(acc, v[u]);
      if (bias0 != nullptr) add8(acc, ld_nc_v4(bias0 + at));
      if (bias1 != nullptr) add8(acc, ld_nc_v4(bias1 + at));
      st_out_v4(ox + at, pack8(acc));
    }
  };
  auto advance = [&](int& t, int& g) {
    g += U;
    while (g >= gpr) g -= gpr, ++t;
  };
  int t = tw, g = q0 - tw * gpr;
#if RF_CL_PIPE
  int4 v[U];
  unsigned bits;
  load_step(v, bits, t, g, q0);
  for (int q = q0; q < q1; q += U) {
    int tn = t, gn = g;
    advance(tn, gn);
    int4 vn[U];
    unsigned bn = 0;
    if (q + U < q1) load_step(vn, bn, tn, gn, q + U);
    store_step(v, bits, t, g, q);
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = vn[u];
    bits = bn, t = tn, g = gn;
  }
#else
  for (int q = q0; q < q1; q += U) {
    int4 v[U];
    unsigned bits;
    load_step(v, bits, t, g, q);
    store_step(v, bits, t, g, q);
    advance(t, g);
  }
#endif
  if (lane < nw) args.out.topk_weights[int64_t(wt0) * K + wk0] = m0 ? 0.0f + w0 : 0.0f;
  for (int j = lane + kWarpSize; j < nw; j += kWarpSize) {  // more than 32 (token, k) pairs: rows of few groups
    const int64_t tj = ts + j / K;
    const int k = j % K;
    const bool mj = (st.dest_mask[tj] & live) != 0;
    const float wj = mj ? wsrc[int64_t(st.send_slot[tj]) * K + k] : 0.0f;
    args.out.topk_weights[tj * K + k] = mj ? 0.0f + wj : 0.0f;
  }
}
