// Helpers shared by the MoE kernels (notify.cu, dispatch.cu, combine.cu): the windows' buffer regions.
#pragma once

#include "common.cuh"

namespace rankflow::kernels {

__device__ __forceinline__ uint64_t buf_base(const RankArgs& a, const uint64_t* peers, int p) {
  return peers[p] + uint64_t(a.buffer_offset);
}

}  // namespace rankflow::kernels
