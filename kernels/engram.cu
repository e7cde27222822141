// engram fetch on GPUs: one warp per fetched row. segments[p] is rank p's host segment in my address
// space (hybrid: my own window for scale-up peers; else behind the peer's device segment), as
// native/src/backends/cuda/symmetric.cc maps it. The host range-checked the ids. Rows of
// row_bytes % 16 == 0 move in 16-byte vectors.
#include "common.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

extern "C" __global__ void __launch_bounds__(256) rf_engram_fetch(const FetchArgs args) {
  const int lane = int(threadIdx.x) % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  const int64_t row_bytes = args.row_bytes;
  for (int64_t i = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize; i < args.n; i += warps) {
    const int64_t g = args.ids[i];
    const uint8_t* row = reinterpret_cast<const uint8_t*>(args.segments[g / args.entries]) + (g % args.entries) * row_bytes;
    uint8_t* dst = args.out + i * row_bytes;
    if (row_bytes % 16 == 0) {
      for (int64_t v = lane; v < row_bytes / 16; v += kWarpSize)
        reinterpret_cast<int4*>(dst)[v] = reinterpret_cast<const int4*>(row)[v];
    } else {
      for (int64_t b = lane; b < row_bytes; b += kWarpSize) dst[b] = row[b];
    }
  }
}
