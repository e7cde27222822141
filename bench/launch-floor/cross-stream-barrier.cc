// Kernels that wait for each other across streams (an n-way barrier, one kernel per stream), launched
// directly or through one-node graphs, cooperative or not, with and without a kernel holding SMs on
// another stream: does any of them wait for its peers until it gives up (1 s)?
#include "driver.hpp"

struct Kept { CUgraph g; CUgraphNode n; CUgraphExec e; };
int main() {
  CUmodule m = load_module("k3.cubin");
  CUfunction fx, fh; CK(P(cuModuleGetFunction)(&fx, m, "rf_xbar")); CK(P(cuModuleGetFunction)(&fh, m, "rf_hold"));
  CUdeviceptr flags, failed; CK(P(cuMemAlloc)(&flags, 4096)); CK(P(cuMemAlloc)(&failed, 4096)); CK(P(cuMemsetD8)(flags, 0, 4096)); CK(P(cuMemsetD8)(failed, 0, 4096));
  const int maxn = 8;
  std::vector<CUstream> st(maxn + 1);
  for (auto& s : st) CK(P(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING));
  unsigned long long seq = 0;
  for (int mode = 0; mode < 4; ++mode) {  // 0 direct, 1 graph, 2 direct coop, 3 graph coop
    const bool graph = mode & 1, coop = mode & 2;
    std::vector<Kept> kept(maxn, Kept{nullptr, nullptr, nullptr});
    for (int hold = 0; hold < 2; ++hold)
    for (int n = 2; n <= maxn; n *= 2) {
      int fails = 0; double worst = 0;
      for (int round = 0; round < (hold ? 5 : 50); ++round) {
        ++seq;
        if (hold) { unsigned long long ns = 100000000ull; void* hp[] = {&ns}; CK(P(cuLaunchKernel)(fh, 124, 1, 1, 32, 1, 1, 0, st[maxn], hp, nullptr)); }
        auto t0 = clk::now();
        for (int i = 0; i < n; ++i) {
          int ii = i, nn = n; unsigned long long sq = seq;
          void* params[] = {&flags, &ii, &nn, &sq, &failed};
          if (graph) {
            CUDA_KERNEL_NODE_PARAMS p = {}; p.func = fx; p.gridDimX = 1; p.gridDimY = p.gridDimZ = 1; p.blockDimX = 32; p.blockDimY = p.blockDimZ = 1; p.kernelParams = params;
            if (!kept[i].e) {
              CK(P(cuGraphCreate)(&kept[i].g, 0)); CK(P(cuGraphAddKernelNode)(&kept[i].n, kept[i].g, nullptr, 0, &p));
              if (coop) { CUkernelNodeAttrValue v = {}; v.cooperative = 1; CK(P(cuGraphKernelNodeSetAttribute)(kept[i].n, CU_KERNEL_NODE_ATTRIBUTE_COOPERATIVE, &v)); }
              CK(P(cuGraphInstantiateWithFlags)(&kept[i].e, kept[i].g, 0));
            } else CK(P(cuGraphExecKernelNodeSetParams)(kept[i].e, kept[i].n, &p));
            CK(P(cuGraphLaunch)(kept[i].e, st[i]));
          } else {
            CUlaunchConfig cfg = {}; cfg.gridDimX = 1; cfg.gridDimY = cfg.gridDimZ = 1; cfg.blockDimX = 32; cfg.blockDimY = cfg.blockDimZ = 1; cfg.hStream = st[i];
            CUlaunchAttribute at = {}; at.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE; at.value.cooperative = 1; if (coop) { cfg.attrs = &at; cfg.numAttrs = 1; }
            CK(P(cuLaunchKernelEx)(&cfg, fx, params, nullptr));
          }
        }
        for (int i = 0; i < n; ++i) CK(P(cuStreamSynchronize)(st[i]));
        double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count(); if (ms > worst) worst = ms;
        int fl = 0; CK(P(cuMemcpyDtoH)(&fl, failed, 4)); if (fl) { fails += fl; CK(P(cuMemsetD8)(failed, 0, 4)); }
        CK(P(cuStreamSynchronize)(st[maxn]));
      }
      printf("%-12s coop %d hold %d n %d: timed-out waits %d in %d rounds, worst round %.1f ms\n", graph ? "graph" : "direct", int(coop), hold, n, fails, hold ? 5 : 50, worst);
      fflush(stdout);
    }
  }
  return 0;
}
