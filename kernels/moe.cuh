// Helpers shared by the MoE kernels (notify.cu, dispatch.cu, combine.cu, combine_local.cu): the windows'
// buffer regions; a combine's fp32 sums of bf16 vectors and their rounding (float_to_bf16, RNE).
#pragma once

#include "common.cuh"

namespace rankflow::kernels {

__device__ __forceinline__ uint64_t buf_base(const RankArgs& a, const uint64_t* peers, int p) {
  return peers[p] + uint64_t(a.buffer_offset);
}

// acc[0..7] += the 8 bf16 of v, in fp32.
__device__ __forceinline__ void add8(float* acc, const int4& v) {
  const uint32_t w[4] = {uint32_t(v.x), uint32_t(v.y), uint32_t(v.z), uint32_t(v.w)};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    acc[2 * j] += bf_lo(w[j]);
    acc[2 * j + 1] += bf_hi(w[j]);
  }
}

// The 8 sums rounded to bf16 (float_to_bf16: the host's rounding), packed as one 16-byte vector.
__device__ __forceinline__ int4 pack8(const float* acc) {
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    w[j] = uint32_t(float_to_bf16(acc[2 * j])) | (uint32_t(float_to_bf16(acc[2 * j + 1])) << 16);
  return make_int4(int(w[0]), int(w[1]), int(w[2]), int(w[3]));
}

}  // namespace rankflow::kernels
