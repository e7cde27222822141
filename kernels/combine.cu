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
// A group of one rank runs rf_combine_local instead (kernels/combine_local.cu).
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
