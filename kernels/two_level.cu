// The kernels of dispatch and combine across nodes on cuda (native/src/backends/cuda/two_level_moe.cc
// and two_level_combine.cc), deliberately plain: the host plans every copy and every sum, these only
// carry them out in stream order. None waits on another rank (the node's barrier kernel orders them
// with the node peers), so none can hang.
//   rf_tl_copy   : a list of copies, a warp per item (16-byte vectors where both ends allow, else
//                  4-byte words): token records into the NCCL send buffers, dispatched rows into the
//                  node peers' receive regions, combine rows into their forwarders' combine regions.
//   rf_tl_fold   : a block per item: an fp32 partial sum (or 0) plus the item's rows of my combine
//                  region, in the order given (ascending rank): the flat combine's sum, continued.
//   rf_tl_finish : a block per token: the sum plus bias0, then bias1, rounded to bf16 (RNE).
#include "moe.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

extern "C" __global__ void __launch_bounds__(256) rf_tl_copy(const CopyArgs args) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t i = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize; i < args.count; i += warps) {
    const CopyItem it = args.items[i];
    if (((it.src | it.dst | uint64_t(it.bytes)) & 15) == 0) {
      const int4* s = reinterpret_cast<const int4*>(it.src);
      int4* d = reinterpret_cast<int4*>(it.dst);
      for (int64_t v = lane; v < it.bytes / 16; v += kWarpSize) d[v] = s[v];
    } else {
      const uint32_t* s = reinterpret_cast<const uint32_t*>(it.src);
      uint32_t* d = reinterpret_cast<uint32_t*>(it.dst);
      for (int64_t v = lane; v < it.bytes / 4; v += kWarpSize) d[v] = s[v];
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) rf_tl_fold(const FoldArgs args) {
  const int H = args.hidden, K = args.topk, Z = H + K;
  for (int64_t i = blockIdx.x; i < args.count; i += gridDim.x) {
    const FoldItem it = args.items[i];
    const float* partial = reinterpret_cast<const float*>(it.partial);
    float* dst = reinterpret_cast<float*>(it.dst);
    for (int h = int(threadIdx.x); h < Z; h += int(blockDim.x)) {
      float acc = partial != nullptr ? partial[h] : 0.0f;
      for (int r = 0; r < it.count; ++r) {
        const int64_t slot = args.rows[it.first + r];
        acc += h < H ? bf16_to_float(args.combine_x[slot * H + h]) : args.combine_weights[slot * K + (h - H)];
      }
      dst[h] = acc;
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) rf_tl_finish(const FinishArgs args) {
  const int H = args.hidden, K = args.topk, Z = H + K;
  for (int64_t t = blockIdx.x; t < args.num_tokens; t += gridDim.x) {
    const float* sum = args.sums + t * Z;
    for (int h = int(threadIdx.x); h < H; h += int(blockDim.x)) {
      float acc = sum[h];
      if (args.bias0 != nullptr) acc += bf16_to_float(args.bias0[t * H + h]);
      if (args.bias1 != nullptr) acc += bf16_to_float(args.bias1[t * H + h]);
      args.out_x[t * H + h] = float_to_bf16(acc);
    }
    for (int k = int(threadIdx.x); k < K; k += int(blockDim.x)) args.out_weights[t * K + k] = sum[H + k];
  }
}
