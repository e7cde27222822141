// The transport of AGRS sessions and pipeline send/recv on GPUs: the same phases, slots and layouts
// as the host executor (native/src/backends/host/agrs.cc).
//   rf_signal : one block; thread k writes `value` into slot array[my_rank] of its destination (for
//               the peers of the ring) and waits until my slot array[p] reached `value` (sources).
//               The batched write-and-wait of session open/close (seed 6.3), enter and done rounds.
//   rf_put    : my bytes into peers' windows over NVLink through peer pointers (16-byte vectors,
//               (peer, chunk) items interleaved), optional enter round first, then done: the last
//               block signals done[my_rank] to the destinations and waits for the sources' done.
//   rf_reduce : out[i] = sum over ranks q in rank order of region[q * n + i], fp32 accumulation,
//               bf16 in -> bf16 out with round to nearest even (rankflow::float_to_bf16).
//   rf_peer_reduce : the same sums with no gathered copy (kargs::PeerReduceArgs): an enter round that
//               publishes each rank's input and output addresses, rank r sums slice r of every
//               rank's input straight from where it lies and stores the sums into every rank's
//               output (ranks sharing a GPU, 3 and more: the chunks its blocks draw from one ticket
//               that all ranks share), then a done round. Each element is read W times and written W times in all,
//               by one rank (one block of one rank where drawn): in place (in == out) is safe. Ranks sharing one GPU (args.local) order
//               their signals at GPU scope (common.cuh Scope).
// Rings (kargs::Ring): allGather: 1, W-1 both; reduce-scatter: destinations 0, W (me included);
// pipeline: 1, 1 (next rank / previous rank).
#include "common.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

namespace {

__device__ __forceinline__ int ring_dst(int rank, int world, int start, int k) { return (rank + start + k) % world; }
__device__ __forceinline__ int ring_src(int rank, int world, int start, int k) {
  return ((rank - start - k) % world + world) % world;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kMaxRanks) rf_signal(const SignalArgs args) {
  const RankArgs& a = args.r;
  const int k = int(threadIdx.x);
  const int world = a.world, rank = a.rank;
  const Ring& ring = args.ring;
  // Everything this GPU wrote before (earlier kernels and copies on the stream) goes out first.
  __threadfence_system();
  if (k < ring.dst_count && !gave_up(a.arrivals)) {
    const int p = ring_dst(rank, world, ring.dst_start, k);
    if (p != rank) signal(slot_at(a.peers[p], a.ws, args.array, rank), args.value);
  }
  if (k < ring.src_count) {
    const int p = ring_src(rank, world, ring.src_start, k);
    if (p != rank) wait_signal(slot_at(a.peers[rank], a.ws, args.array, p), args.value, a, Phase(args.phase), p);
  }
  __syncthreads();
}

extern "C" __global__ void __launch_bounds__(256) rf_put(const PutArgs args) {
  const RankArgs& a = args.r;
  const int world = a.world, rank = a.rank;
  const Ring& ring = args.ring;
  const uint64_t seq = op_seq(a);
  __shared__ uint64_t peers[kMaxRanks];
  load_peers(peers, a);
  bool ok = true;
  if (args.enter != 0) {
    if (blockIdx.x == 0 && !gave_up(a.arrivals))
      for (int k = int(threadIdx.x); k < ring.src_count; k += int(blockDim.x)) {
        const int p = ring_src(rank, world, ring.src_start, k);
        if (p != rank) signal(slot_at(peers[p], a.ws, a.ws.enter, rank), seq);
      }
    for (int k = int(threadIdx.x); k < ring.dst_count; k += int(blockDim.x)) {
      const int p = ring_dst(rank, world, ring.dst_start, k);
      if (p != rank) ok = wait_signal(slot_at(peers[rank], a.ws, a.ws.enter, p), seq, a, kPhaseEnter, p) && ok;
    }
  }
  ok = __syncthreads_and(ok);

  if (ok) {
    const int64_t bytes = args.bytes;
    const int64_t chunks = (bytes + kCopyChunkBytes - 1) / kCopyChunkBytes;
    const int64_t items = chunks * ring.dst_count;
    const int lane = int(threadIdx.x) % kWarpSize;
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
    const int64_t vecs = bytes / 16;
    for (int64_t item = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize; item < items;
         item += warps) {
      const int k = int(item % ring.dst_count);
      const int64_t chunk = item / ring.dst_count;
      const int p = ring_dst(rank, world, ring.dst_start, k);
      // Rank p's part of my input (reduce-scatter: chunk p; allGather: src_stride 0).
      const int4* in = reinterpret_cast<const int4*>(static_cast<const uint8_t*>(args.src) + int64_t(p) * args.src_stride);
      int4* out = reinterpret_cast<int4*>(peers[p] + uint64_t(args.dst_offset));
      warp_copy_chunk(out, in, chunk, vecs, lane);
    }
  }

  if (!last_block_arrived(a.arrivals) || gave_up(a.arrivals)) return;
  for (int k = int(threadIdx.x); k < ring.dst_count; k += int(blockDim.x)) {
    const int p = ring_dst(rank, world, ring.dst_start, k);
    if (p != rank) signal(slot_at(peers[p], a.ws, a.ws.done, rank), seq);
  }
  for (int k = int(threadIdx.x); k < ring.src_count; k += int(blockDim.x)) {
    const int p = ring_src(rank, world, ring.src_start, k);
    if (p != rank) wait_signal(slot_at(peers[rank], a.ws, a.ws.done, p), seq, a, Phase(args.phase), p);
  }
}

// region: world parts of n elements each (fp32 or bf16), part q from rank q. out: n elements.
extern "C" __global__ void __launch_bounds__(256) rf_reduce(const ReduceArgs args) {
  const int64_t n = args.n;
  const int world = args.world;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (args.bf16 != 0) {
    const uint16_t* in = static_cast<const uint16_t*>(args.region);
    uint16_t* o = static_cast<uint16_t*>(args.out);
    if (n % 8 == 0) {  // 8 bf16 per 16-byte vector
      const int64_t nv = n / 8;
      for (int64_t v = first; v < nv; v += stride) {
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int q = 0; q < world; ++q) {
          const int4 x = ld_nc_v4(reinterpret_cast<const int4*>(in + int64_t(q) * n) + v);
          const uint32_t w[4] = {uint32_t(x.x), uint32_t(x.y), uint32_t(x.z), uint32_t(x.w)};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            acc[2 * j] = __fadd_rn(acc[2 * j], bf16_to_float(uint16_t(w[j] & 0xffffu)));
            acc[2 * j + 1] = __fadd_rn(acc[2 * j + 1], bf16_to_float(uint16_t(w[j] >> 16)));
          }
        }
        uint32_t r[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) r[j] = uint32_t(float_to_bf16(acc[2 * j])) | (uint32_t(float_to_bf16(acc[2 * j + 1])) << 16);
        reinterpret_cast<int4*>(o)[v] = make_int4(int(r[0]), int(r[1]), int(r[2]), int(r[3]));
      }
      return;
    }
    for (int64_t i = first; i < n; i += stride) {
      float acc = 0.0f;
      for (int q = 0; q < world; ++q) acc = __fadd_rn(acc, bf16_to_float(in[int64_t(q) * n + i]));
      o[i] = float_to_bf16(acc);
    }
    return;
  }
  const float* in = static_cast<const float*>(args.region);
  float* o = static_cast<float*>(args.out);
  if (n % 4 == 0) {
    const int64_t nv = n / 4;
    for (int64_t v = first; v < nv; v += stride) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int q = 0; q < world; ++q) {
        const int4 x = ld_nc_v4(reinterpret_cast<const int4*>(in + int64_t(q) * n) + v);
        acc.x = __fadd_rn(acc.x, __int_as_float(x.x));
        acc.y = __fadd_rn(acc.y, __int_as_float(x.y));
        acc.z = __fadd_rn(acc.z, __int_as_float(x.z));
        acc.w = __fadd_rn(acc.w, __int_as_float(x.w));
      }
      reinterpret_cast<float4*>(o)[v] = acc;
    }
    return;
  }
  for (int64_t i = first; i < n; i += stride) {
    float acc = 0.0f;
    for (int q = 0; q < world; ++q) acc = __fadd_rn(acc, in[int64_t(q) * n + i]);
    o[i] = acc;
  }
}

namespace {

// Loads in flight per thread: F ranks' vectors at a time, U 16-byte vectors of each. Eight keep a
// reduce near the copy's bandwidth: 4 x 2 for 3 ranks and more (64 MiB bf16 at 4 ranks: 81.0-82.2% of
// the copy floor against 79.9-80.5% for 2 x 4), 2 x 4 for 2 ranks (4 x 2 leaves only 4 in flight there:
// 73.1-77.0% at 64 MiB against 80.5-82.9%). bench/results/all-reduce-variants-2026-12-02.md.
constexpr int kFewRanks = 2;  // and fewer: 2 x 4

// acc (4 fp32 or 8 bf16 lanes of one 16-byte vector) += x, in the same order as rf_reduce.
template <bool kBf16>
__device__ __forceinline__ void add_vector(float* acc, const int4& x) {
  const uint32_t w[4] = {uint32_t(x.x), uint32_t(x.y), uint32_t(x.z), uint32_t(x.w)};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (kBf16) {
      acc[2 * j] = __fadd_rn(acc[2 * j], bf16_to_float(uint16_t(w[j] & 0xffffu)));
      acc[2 * j + 1] = __fadd_rn(acc[2 * j + 1], bf16_to_float(uint16_t(w[j] >> 16)));
    } else {
      acc[j] = __fadd_rn(acc[j], __uint_as_float(w[j]));
    }
  }
}

// Two sums rounded to bf16 (nearest even) in one instruction, lo in the low half; a NaN as
// rankflow::float_to_bf16 makes it (the host's bits), not cvt's canonical one.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t p;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(hi), "f"(lo));
  if (lo != lo) p = (p & 0xffff0000u) | float_to_bf16(lo);
  if (hi != hi) p = (p & 0xffffu) | (uint32_t(float_to_bf16(hi)) << 16);
  return p;
}

template <bool kBf16>
__device__ __forceinline__ int4 pack_vector(const float* acc) {
  uint32_t r[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if constexpr (kBf16) r[j] = pack_bf16x2(acc[2 * j], acc[2 * j + 1]);
    else r[j] = __float_as_uint(acc[j]);
  return make_int4(int(r[0]), int(r[1]), int(r[2]), int(r[3]));
}

// Vectors [v0, v1) of every source, summed into every destination (from the next rank on, so that
// the ranks' stores spread over the outputs), with F ranks x U vectors of loads in flight.
// `first`: this thread's first vector; `stride`: between a thread's vectors (the grid's threads, or the
// block's for a chunk of its own).
template <bool kBf16, int F, int U>
__device__ void reduce_vectors(const uint8_t* const* src, uint8_t* const* dst, int world, int rank, int64_t first, int64_t stride,
                               int64_t v1) {
  constexpr int kLanes = kBf16 ? 8 : 4;
  for (int64_t base = first; base < v1; base += stride * U) {
    float acc[U][kLanes];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int l = 0; l < kLanes; ++l) acc[u][l] = 0.0f;
    // F ranks' vectors in flight at a time (F U loads per thread), summed in rank order.
    for (int q = 0; q < world; q += F) {
      int4 x[F][U];
#pragma unroll
      for (int f = 0; f < F; ++f)
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t v = base + u * stride;
          if (q + f < world && v < v1) x[f][u] = ld_nc_v4(src[q + f] + v * 16);
        }
#pragma unroll
      for (int f = 0; f < F; ++f)
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (q + f < world && base + u * stride < v1) add_vector<kBf16>(acc[u], x[f][u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t v = base + u * stride;
      if (v >= v1) continue;
      const int4 r = pack_vector<kBf16>(acc[u]);
      for (int k = 1, d = rank + 1; k <= world; ++k, ++d) st_v4(dst[d < world ? d : d - world] + v * 16, r);
    }
  }
}

// Elements [e0, e1), one at a time (a tail, or addresses not 16-byte aligned).
template <bool kBf16>
__device__ void reduce_elements(const uint8_t* const* src, uint8_t* const* dst, int world, int rank, int64_t e0, int64_t e1) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = e0 + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < e1; i += stride) {
    float acc = 0.0f;
    for (int q = 0; q < world; ++q)
      acc = __fadd_rn(acc, kBf16 ? bf16_to_float(reinterpret_cast<const uint16_t*>(src[q])[i]) : reinterpret_cast<const float*>(src[q])[i]);
    for (int k = 1; k <= world; ++k) {
      uint8_t* d = dst[(rank + k) % world];
      if constexpr (kBf16) reinterpret_cast<uint16_t*>(d)[i] = float_to_bf16(acc);
      else reinterpret_cast<float*>(d)[i] = acc;
    }
  }
}

__device__ __forceinline__ bool aligned_all(const uint8_t* const* src, uint8_t* const* dst, int world) {
  bool aligned = true;
  for (int p = 0; p < world; ++p) aligned = aligned && ((reinterpret_cast<uintptr_t>(src[p]) | reinterpret_cast<uintptr_t>(dst[p])) & 15) == 0;
  return aligned;
}

template <bool kBf16>
__device__ void reduce_slice(const uint8_t* const* src, uint8_t* const* dst, int world, int rank, int64_t lo, int64_t hi) {
  constexpr int64_t kLanes = kBf16 ? 8 : 4;
  if (!aligned_all(src, dst, world)) return reduce_elements<kBf16>(src, dst, world, rank, lo, hi);
  // lo is a multiple of 8 elements: whole vectors from there, the last partial one element-wise.
  const int64_t first = lo / kLanes + int64_t(blockIdx.x) * blockDim.x + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  if (world <= kFewRanks) reduce_vectors<kBf16, 2, 4>(src, dst, world, rank, first, stride, hi / kLanes);
  else reduce_vectors<kBf16, 4, 2>(src, dst, world, rank, first, stride, hi / kLanes);
  reduce_elements<kBf16>(src, dst, world, rank, hi / kLanes * kLanes, hi);
}

// Ranks sharing one GPU, 3 and more: all n / lanes vectors in chunks of kChunkPasses passes of a block,
// handed out by one ticket word in rank 0's workspace that every rank's blocks draw from (`base`: its
// value when rank 0 entered), so that a rank whose kernel started late or whose SMs ran slower does
// less; each chunk is summed and stored by one block, so the bits are those of the slices. The
// elements after the last whole vector are rank W - 1's. 64 MiB at 4 ranks: 80.3-82.8% of the copy
// floor against 77.9-80.9% for slices (bench/results/all-reduce-variants-2026-12-03.md); 2 ranks keep
// their slices (2 x 4 loads in flight), which drawn chunks did not beat.
constexpr int kChunkPasses = 2;
template <bool kBf16>
__device__ void reduce_shared(const uint8_t* const* src, uint8_t* const* dst, int world, int rank, int64_t n,
                              unsigned long long* ticket, uint64_t base) {
  constexpr int64_t kLanes = kBf16 ? 8 : 4;
  constexpr int F = 4, U = 2;
  const int64_t vectors = n / kLanes, chunk = int64_t(blockDim.x) * U * kChunkPasses;
  const int64_t chunks = (vectors + chunk - 1) / chunk;
  __shared__ int64_t tickets[2];  // the chunk this pass works on, the next one's
  if (threadIdx.x == 0) tickets[0] = int64_t(atomicAdd(ticket, 1ull) - base);
  __syncthreads();
  for (int k = 0;; k ^= 1) {
    const int64_t c = tickets[k];
    if (c >= chunks) break;
    unsigned long long next = 0;
    if (threadIdx.x == 0) next = atomicAdd(ticket, 1ull);  // the next chunk's, while this one runs
    const int64_t v0 = c * chunk;
    reduce_vectors<kBf16, F, U>(src, dst, world, rank, v0 + threadIdx.x, blockDim.x, min(v0 + chunk, vectors));
    if (threadIdx.x == 0) tickets[k ^ 1] = int64_t(next - base);
    __syncthreads();
  }
  if (rank == world - 1) reduce_elements<kBf16>(src, dst, world, rank, vectors * kLanes, n);
}

// The peer reduce at scope S (the kernel picks it from args.local).
template <Scope S>
__device__ __forceinline__ void peer_reduce(const PeerReduceArgs& args) {
  const RankArgs& a = args.r;
  const int world = a.world, rank = a.rank;
  const uint64_t seq = op_seq(a);
  __shared__ uint64_t peers[kMaxRanks];
  __shared__ const uint8_t* src[kMaxRanks];
  __shared__ uint8_t* dst[kMaxRanks];
  __shared__ int refused;
  __shared__ uint64_t ticket_base;
  if (threadIdx.x == 0) refused = -1;
  load_peers(peers, a);
  const bool drawn = S == Scope::Gpu && world > kFewRanks;  // chunks drawn from a ticket (reduce_shared)
  unsigned long long* ticket = reinterpret_cast<unsigned long long*>(peers[0] + a.ws.ticket);

  // 1. enter: block 0 publishes my addresses with my enter in every rank's slot of mine (after what
  // the stream wrote before, e.g. a staged input), every block reads everyone's.
  if (blockIdx.x == 0 && !gave_up(a.arrivals)) {
    if constexpr (S == Scope::Sys) __threadfence_system();
    else __threadfence();
    for (int p = int(threadIdx.x); p < world; p += int(blockDim.x)) {
      uint64_t* s = slot_at(peers[p], a.ws, a.ws.enter, rank);
      st_relaxed_sys(s + kSignalAddrWord, uint64_t(reinterpret_cast<uintptr_t>(args.in)));
      st_relaxed_sys(s + kSignalAddrWord + 1, uint64_t(reinterpret_cast<uintptr_t>(args.out)));
      st_relaxed_sys(s + kSignalAddrWord + 2, uint64_t(args.window));
      // Rank 0, ranks sharing a GPU: where the ticket stands as this op begins (every draw of earlier
      // ops ended before their done round, which my stream finished).
      if (drawn && rank == 0) st_relaxed_sys(s + kSignalTicketWord, ld_relaxed_sys(reinterpret_cast<const uint64_t*>(ticket)));
      signal<S>(s, seq, 0, args.tag);
    }
  }
  bool ok = true;
  for (int p = int(threadIdx.x); p < world; p += int(blockDim.x)) {
    const uint64_t* s = slot_at(peers[rank], a.ws, a.ws.enter, p);
    uint64_t tag = 0;
    if (!wait_signal<S>(s, seq, a, kPhaseEnter, p, nullptr, &tag)) {
      ok = false;
      continue;
    }
    const uint64_t in = ld_relaxed_sys(s + kSignalAddrWord), out = ld_relaxed_sys(s + kSignalAddrWord + 1);
    const uint64_t window = ld_relaxed_sys(s + kSignalAddrWord + 2);
    src[p] = reinterpret_cast<const uint8_t*>((window & 1u) != 0 ? peers[p] + in : in);
    dst[p] = reinterpret_cast<uint8_t*>((window & 2u) != 0 ? peers[p] + out : out);
    if (tag != args.tag) atomicMax(&refused, p);
    if (drawn && p == 0) ticket_base = ld_relaxed_sys(s + kSignalTicketWord);
  }
  ok = __syncthreads_and(ok);

  // 2. data: my slice, in units of 8 elements (whole 16-byte vectors of either dtype), or the chunks
  // my blocks draw.
  if (ok && refused >= 0) {
    if (blockIdx.x == 0 && threadIdx.x == 0) report_bad(a.ctl, seq, kBadShape, refused);
  } else if (ok && drawn && aligned_all(src, dst, world)) {
    if (args.bf16 != 0) reduce_shared<true>(src, dst, world, rank, args.n, ticket, ticket_base);
    else reduce_shared<false>(src, dst, world, rank, args.n, ticket, ticket_base);
  } else if (ok) {
    int64_t lo = 0, hi = 0;
    peer_reduce_slice(args.n, world, rank, &lo, &hi);
    if (args.bf16 != 0) reduce_slice<true>(src, dst, world, rank, lo, hi);
    else reduce_slice<false>(src, dst, world, rank, lo, hi);
  }

  // 3. done: my sums are in every output; after everyone's, mine holds all of them and nobody reads my input.
  if (!last_block_arrived<S>(a.arrivals) || gave_up(a.arrivals)) return;
  for (int p = int(threadIdx.x); p < world; p += int(blockDim.x)) signal<S>(slot_at(peers[p], a.ws, a.ws.done, rank), seq);
  for (int p = int(threadIdx.x); p < world; p += int(blockDim.x))
    wait_signal<S>(slot_at(peers[rank], a.ws, a.ws.done, p), seq, a, kPhasePeerReduce, p);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(512) rf_peer_reduce(const PeerReduceArgs args) {
  if (args.local != 0) peer_reduce<Scope::Gpu>(args);
  else peer_reduce<Scope::Sys>(args);
}
