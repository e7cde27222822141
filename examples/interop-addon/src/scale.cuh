// The example's CUDA side, as plain C++ the binding (addon.cc) calls: kernels that scale bf16 rows by
// per-row fp32 factors, launched on a stream the caller names (rankflow's, or one of its own), and
// the few runtime calls the binding needs. Every function returns a cudaError_t.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace example {

// dst[r, :] = bf16(src[r, :] * factors[r]) for r < rows (dst may equal src: in place). Before writing,
// every block waits `delay_ns` on the GPU, so that a consumer not ordered after this kernel would
// read the rows unwritten (what the events are for).
cudaError_t scale_rows(uint16_t* dst, const uint16_t* src, const float* factors, int64_t rows, int64_t hidden,
                       uint64_t delay_ns, cudaStream_t stream);

}  // namespace example
