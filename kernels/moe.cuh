// Helpers shared by the MoE kernels (dispatch.cu, combine.cu): vector loads/stores and the grid-wide
// "every block of this launch finished its stores" step that precedes a `done` signal.
#pragma once

#include "../native/src/cuda/moe_args.hpp"
#include "common.cuh"

namespace rankflow::kernels {

constexpr int kWarpSize = 32;

// Read-only input, streamed once: no L1 allocation.
__device__ __forceinline__ int4 ld_nc_v4(const void* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
// Data another agent wrote before a signal we acquired: a plain (coherent) load.
__device__ __forceinline__ int4 ld_v4(const void* p) { return *static_cast<const int4*>(p); }
__device__ __forceinline__ void st_v4(void* p, const int4& v) {
  asm volatile("st.global.L1::no_allocate.v4.s32 [%0], {%1, %2, %3, %4};"
               :
               : "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

__device__ __forceinline__ uint64_t ws_base(const moe::MoeArgs& a, const uint64_t* peers, int p) {
  return peers[p] + uint64_t(a.workspace_offset);
}
__device__ __forceinline__ uint64_t buf_base(const moe::MoeArgs& a, const uint64_t* peers, int p) {
  return peers[p] + uint64_t(a.buffer_offset);
}

// Every thread's stores are pushed to system scope, then the block counts itself in; returns true in
// the block that arrived last (it then resets the counter for the next launch on the stream, after
// acquiring the other blocks' arrivals).
__device__ __forceinline__ bool grid_arrive_last(unsigned int* arrivals) {
  __threadfence_system();
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
  __syncthreads();
  if (last) {
    __threadfence();
    if (threadIdx.x == 0) *arrivals = 0;
  }
  return last;
}

// bf16x2 in a 32-bit word -> two floats (exact).
__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

}  // namespace rankflow::kernels
