// Helpers shared by the MoE kernels (dispatch.cu, combine.cu): vector loads/stores and the grid-wide
// "every block of this launch finished its stores" step that precedes a `done` signal.
#pragma once

#include "../native/src/cuda/moe_args.hpp"
#include "common.cuh"

namespace rankflow::kernels {

// kWarpSize, ld_nc_v4 and the grid-wide arrival (last_block_arrived) come from common.cuh.
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

// bf16x2 in a 32-bit word -> two floats (exact).
__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

}  // namespace rankflow::kernels
