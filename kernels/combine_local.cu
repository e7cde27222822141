// MoE combine of a group of one rank on the GPU: rf_combine_local (launch.cc picks it for world 1),
// bit-identical to rf_combine (kernels/combine.cu) and the host executor, with no peer to signal, wait
// for or arrive at.
#include "moe.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

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
// whose first group is in its range) are loaded at the start and stored at the end. One H200, 4096 x
// 7168: 38.8 µs against a warp per token's 41.6 and the copy of its bytes' 30.7 (bench/results/
// floors-2026-12-03.md; pipelining the next step's loads, with 4 or 8 loads per lane: 39.4, not better);
// with plain rows stored as they came (copies_exactly): 36.2 (floors-2026-12-03-s21.md).
// Without biases a token's output is 0 + its row in fp32, rounded: the row's own bits except where a
// half is -0 (0 + -0 is +0) or a NaN (the GPU's NaN, quieted by the rounding). A vector with neither is
// stored as it came, without add8 and pack8's 8 conversions, adds and roundings; one with either takes
// them. Per 32-bit word w of two halves: (w & 0x7fff7fff) + 0x007f007f sets a half's top bit where
// its magnitude is above inf's 0x7f80 (a NaN; no carry between halves); x = w ^ 0x80008000 has a zero
// half where w has -0, and (x - 0x00010001) & ~x sets that half's top bit (a borrow may also set the
// upper half's: a vector sent the slow way that needed not be, never the reverse).
__device__ __forceinline__ bool copies_exactly(const int4& v) {
  const uint32_t w[4] = {uint32_t(v.x), uint32_t(v.y), uint32_t(v.z), uint32_t(v.w)};
  uint32_t hit = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t x = w[j] ^ 0x80008000u;
    hit |= ((w[j] & 0x7fff7fffu) + 0x007f007fu) | ((x - 0x00010001u) & ~x);
  }
  return (hit & 0x80008000u) == 0;
}

extern "C" __global__ void __launch_bounds__(256, 2) rf_combine_local(const CombineArgs args) {
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
  const bool plain = bias0 == nullptr && bias1 == nullptr;  // an output is its one row, or zero
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
  constexpr int U = 8;  // loads per lane in flight: (256, 2) holds them in 100 registers, no spill
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
      const bool mine = (bits >> u) & 1u;
      if (plain && (!mine || copies_exactly(v[u]))) {  // 0 + b rounded is b: no arithmetic
        st_v4(ox + at, mine ? v[u] : make_int4(0, 0, 0, 0));
        continue;
      }
      float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      if (mine) add8(acc, v[u]);
      if (bias0 != nullptr) add8(acc, ld_nc_v4(bias0 + at));
      if (bias1 != nullptr) add8(acc, ld_nc_v4(bias1 + at));
      st_v4(ox + at, pack8(acc));
    }
  };
  auto advance = [&](int& t, int& g) {
    g += U;
    while (g >= gpr) g -= gpr, ++t;
  };
  int t = tw, g = q0 - tw * gpr;
  for (int q = q0; q < q1; q += U) {
    int4 v[U];
    unsigned bits;
    load_step(v, bits, t, g, q);
    store_step(v, bits, t, g, q);
    advance(t, g);
  }
  if (lane < nw) args.out.topk_weights[int64_t(wt0) * K + wk0] = m0 ? 0.0f + w0 : 0.0f;
  for (int j = lane + kWarpSize; j < nw; j += kWarpSize) {  // more than 32 (token, k) pairs: rows of few groups
    const int64_t tj = ts + j / K;
    const int k = j % K;
    const bool mj = (st.dest_mask[tj] & live) != 0;
    const float wj = mj ? wsrc[int64_t(st.send_slot[tj]) * K + k] : 0.0f;
    args.out.topk_weights[tj * K + k] = mj ? 0.0f + wj : 0.0f;
  }
}
