// Launchers of kernels/agrs.cu (AGRS sessions, reduce-scatter, engram fetch, pipeline send/recv).
// Peer sets are rings around the rank: destinations (rank + dst_start + k) % W for k < dst_count,
// sources (rank - src_start - k) mod W for k < src_count.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "launch.hpp"

namespace rankflow::cuda {

class Kernels;

struct Ring {
  int dst_start = 1, dst_count = 0, src_start = 1, src_count = 0;
};

class AgrsKernels {
 public:
  explicit AgrsKernels(Kernels& k);
  // Batched write-and-wait of `value` in slot `array` (a.seq is ignored).
  void signal(CUstream s, const SignalArgs& a, int64_t array, uint32_t value, Ring ring, uint64_t phase) const;
  // src + p * src_stride -> destination p's window at dst_offset, bytes each (16-byte multiples and
  // aligned), then done (a.seq) to the destinations, waiting for the sources' done (phase on timeout).
  void put(CUstream s, const SignalArgs& a, CUdeviceptr src, int64_t src_stride, int64_t bytes, int64_t dst_offset,
           Ring ring, bool enter, uint64_t phase, CUdeviceptr arrivals, int sm_count) const;
  // out[i] = sum_q region[q * n + i] (rank order, fp32 accumulation; bf16 RNE).
  void reduce(CUstream s, CUdeviceptr region, int world, int64_t n, bool bf16, CUdeviceptr out, int sm_count) const;
  void engram_fetch(CUstream s, CUdeviceptr segments, CUdeviceptr ids, int64_t n, int64_t entries, int64_t row_bytes,
                    CUdeviceptr out, int sm_count) const;

 private:
  CUfunction signal_ = nullptr, put_ = nullptr, reduce_ = nullptr, fetch_ = nullptr;
};

}  // namespace rankflow::cuda
