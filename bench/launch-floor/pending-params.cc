// 16 launches of one graph, each with new parameters (cuGraphExecKernelNodeSetParams), queued behind a
// 50 ms kernel: does each run with its own parameters, and does the update wait for the queue?
#include "driver.hpp"

int main() {
  CUmodule m = load_module("k4.cubin");
  CUfunction fs, fh; CK(P(cuModuleGetFunction)(&fs, m, "rf_slot")); CK(P(cuModuleGetFunction)(&fh, m, "rf_hold"));
  CUdeviceptr slots; CK(P(cuMemAlloc)(&slots, 8 * 64));
  CUstream s; CK(P(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING));
  int ii = 0; unsigned long long vv = 0; void* params[] = {&slots, &ii, &vv};
  CUDA_KERNEL_NODE_PARAMS p = {}; p.func = fs; p.gridDimX = 1; p.gridDimY = p.gridDimZ = 1; p.blockDimX = 32; p.blockDimY = p.blockDimZ = 1; p.kernelParams = params;
  CUgraph g; CUgraphNode n; CUgraphExec e; CK(P(cuGraphCreate)(&g, 0)); CK(P(cuGraphAddKernelNode)(&n, g, nullptr, 0, &p)); CK(P(cuGraphInstantiateWithFlags)(&e, g, 0));
  for (int hold = 0; hold < 2; ++hold) {
    CK(P(cuMemsetD8)(slots, 0, 8 * 64));
    if (hold) { unsigned long long ns = 50000000ull; void* hp[] = {&ns}; CK(P(cuLaunchKernel)(fh, 1, 1, 1, 32, 1, 1, 0, s, hp, nullptr)); }
    double maxset = 0;
    for (int i = 0; i < 16; ++i) {
      ii = i; vv = 1000 + i;
      auto t0 = clk::now(); CK(P(cuGraphExecKernelNodeSetParams)(e, n, &p)); double us = std::chrono::duration<double, std::micro>(clk::now() - t0).count(); if (us > maxset) maxset = us;
      CK(P(cuGraphLaunch)(e, s));
    }
    CK(P(cuStreamSynchronize)(s));
    unsigned long long h[64]; CK(P(cuMemcpyDtoH)(h, slots, 8 * 64));
    printf("hold %d: slots", hold); for (int i = 0; i < 16; ++i) printf(" %llu", h[i]); printf("  (longest SetParams %.1f us)\n", maxset);
  }
  return 0;
}
