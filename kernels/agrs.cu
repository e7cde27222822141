// AGRS sessions, reduce-scatter, engram fetch and pipeline send/recv on GPUs: the same phases, slots
// and layouts as the host executor (native/src/ops/session.cc, native/src/ops/pipeline.cc).
//   rf_signal : one block; thread p writes `value` into slot array[my_rank] of peer p (for the peers
//               in the signal set) and waits until my slot array[p] reached `value` (wait set). The
//               batched write-and-wait of session open/close (seed 6.3), enter and done rounds.
//   rf_put    : my bytes into peers' windows over NVLink through peer pointers (16-byte vectors,
//               (peer, chunk) items interleaved), optional enter round first, then done: the last
//               block signals done[my_rank] to the destinations and waits for the sources' done.
//   rf_reduce : out[i] = sum over ranks q in rank order of region[q * n + i], fp32 accumulation,
//               bf16 in -> bf16 out with round to nearest even (rankflow::float_to_bf16).
//   rf_engram_fetch : row g of the global table = row g % entries of rank g / entries's host segment.
// Peer sets are rings around my rank: destinations (rank + dst_start + k) % W for k < dst_count,
// sources (rank - src_start - k) mod W for k < src_count. allGather: 1, W-1 both; reduce-scatter:
// destinations 0, W (me included); pipeline: 1, 1 (next rank / previous rank).
#include "common.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

namespace {


__device__ __forceinline__ int ring_dst(int rank, int world, int start, int k) { return (rank + start + k) % world; }
__device__ __forceinline__ int ring_src(int rank, int world, int start, int k) {
  return ((rank - start - k) % world + world) % world;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(kMaxRanks) rf_signal(
    const uint64_t* __restrict__ peer_base, int64_t workspace_offset, WorkspaceLayout ws, int rank,
    int64_t array, uint32_t value, int dst_start, int dst_count, int src_start, int src_count,
    uint64_t phase, uint64_t timeout_ns, Diagnostic* diag) {
  const int k = int(threadIdx.x);
  const int world = ws.world_size;
  // Everything this GPU wrote before (earlier kernels and copies on the stream) goes out first.
  __threadfence_system();
  if (k < dst_count) {
    const int p = ring_dst(rank, world, dst_start, k);
    if (p != rank)
      st_release_sys(slot_ptr(peer_base[p] + uint64_t(workspace_offset), ws, array, rank), encode_signal(value, 0));
  }
  if (k < src_count) {
    const int p = ring_src(rank, world, src_start, k);
    if (p != rank)
      wait_signal(slot_ptr(peer_base[rank] + uint64_t(workspace_offset), ws, array, p), value, timeout_ns, diag,
                  Phase(phase), p);
  }
  __syncthreads();
}

// src + p * src_stride goes to destination p's window at dst_offset (bytes each, all 16-byte
// aligned). With `enter`, I first announce enter[my_rank] to my sources and wait for my
// destinations' enter (nobody writes into a buffer its owner still reads). `arrivals`: a zeroed
// device word, left zeroed.
extern "C" __global__ void __launch_bounds__(256) rf_put(
    const uint64_t* __restrict__ peer_base, int64_t workspace_offset, WorkspaceLayout ws, int rank,
    const void* __restrict__ src, int64_t src_stride, int64_t bytes, int64_t dst_offset, int dst_start,
    int dst_count, int src_start, int src_count, int enter, uint32_t seq, uint64_t phase,
    unsigned int* arrivals, uint64_t timeout_ns, Diagnostic* diag) {
  const int world = ws.world_size;
  const uint64_t my_ws = peer_base[rank] + uint64_t(workspace_offset);
  if (enter) {
    if (blockIdx.x == 0)
      for (int k = int(threadIdx.x); k < src_count; k += int(blockDim.x)) {
        const int p = ring_src(rank, world, src_start, k);
        if (p != rank)
          st_release_sys(slot_ptr(peer_base[p] + uint64_t(workspace_offset), ws, ws.enter, rank), encode_signal(seq, 0));
      }
    for (int k = int(threadIdx.x); k < dst_count; k += int(blockDim.x)) {
      const int p = ring_dst(rank, world, dst_start, k);
      if (p != rank) wait_signal(slot_ptr(my_ws, ws, ws.enter, p), seq, timeout_ns, diag, kPhaseEnter, p);
    }
    __syncthreads();
  }

  const int64_t chunks = (bytes + kCopyChunkBytes - 1) / kCopyChunkBytes;
  const int64_t items = chunks * dst_count;
  const int lane = int(threadIdx.x) % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  const int64_t vecs = bytes / 16;
  for (int64_t item = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize; item < items;
       item += warps) {
    const int k = int(item % dst_count);
    const int64_t chunk = item / dst_count;
    const int p = ring_dst(rank, world, dst_start, k);
    // Rank p's part of my input (reduce-scatter: chunk p; allGather: src_stride 0).
    const int4* in = reinterpret_cast<const int4*>(static_cast<const uint8_t*>(src) + int64_t(p) * src_stride);
    int4* out = reinterpret_cast<int4*>(peer_base[p] + uint64_t(dst_offset));
    warp_copy_chunk(out, in, chunk, vecs, lane);
  }

  if (!last_block_arrived(arrivals)) return;
  for (int k = int(threadIdx.x); k < dst_count; k += int(blockDim.x)) {
    const int p = ring_dst(rank, world, dst_start, k);
    if (p != rank)
      st_release_sys(slot_ptr(peer_base[p] + uint64_t(workspace_offset), ws, ws.done, rank), encode_signal(seq, 0));
  }
  for (int k = int(threadIdx.x); k < src_count; k += int(blockDim.x)) {
    const int p = ring_src(rank, world, src_start, k);
    if (p != rank) wait_signal(slot_ptr(my_ws, ws, ws.done, p), seq, timeout_ns, diag, Phase(phase), p);
  }
}

// region: world parts of n elements each (fp32 or bf16), part q from rank q. out: n elements.
extern "C" __global__ void __launch_bounds__(256) rf_reduce(const void* __restrict__ region, int world, int64_t n,
                                                            int bf16, void* __restrict__ out) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (bf16) {
    const uint16_t* in = static_cast<const uint16_t*>(region);
    uint16_t* o = static_cast<uint16_t*>(out);
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
  const float* in = static_cast<const float*>(region);
  float* o = static_cast<float*>(out);
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

// One warp per fetched row. segments[p]: rank p's host segment in my address space (hybrid: my
// window for scale-up peers; else behind the peer's device segment), as cuda::SymmetricMemory maps it.
// ids were range-checked by the host. Rows of row_bytes % 16 == 0 move in 16-byte vectors.
extern "C" __global__ void __launch_bounds__(256) rf_engram_fetch(const uint64_t* __restrict__ segments,
                                                                  const int32_t* __restrict__ ids, int64_t n,
                                                                  int64_t entries, int64_t row_bytes,
                                                                  uint8_t* __restrict__ out) {
  const int lane = int(threadIdx.x) % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t i = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize; i < n; i += warps) {
    const int64_t g = ids[i];
    const uint8_t* row = reinterpret_cast<const uint8_t*>(segments[g / entries]) + (g % entries) * row_bytes;
    uint8_t* dst = out + i * row_bytes;
    if (row_bytes % 16 == 0) {
      for (int64_t v = lane; v < row_bytes / 16; v += kWarpSize)
        reinterpret_cast<int4*>(dst)[v] = reinterpret_cast<const int4*>(row)[v];
    } else {
      for (int64_t b = lane; b < row_bytes; b += kWarpSize) dst[b] = row[b];
    }
  }
}
