// Graph-launched single kernels: cuGraphExecKernelNodeSetParams + cuGraphLaunch against cuLaunchKernel.
#include "driver.hpp"

struct Big { unsigned long long w[48]; };
int main(int argc, char** argv) {
  const int N = argc > 1 ? atoi(argv[1]) : 20000;
  CUmodule m = load_module("k.cubin");
  CUfunction ff; CK(P(cuModuleGetFunction)(&ff, m, "rf_flag"));
  CUstream s; CK(P(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING));
  volatile unsigned long long* hflag; CK(P(cuMemHostAlloc)((void**)&hflag, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  CUdeviceptr dflag; CK(P(cuMemHostGetDevicePointer)(&dflag, (void*)hflag, 0));
  *hflag = 0;
  unsigned long long seq = 0;
  Big big = {};
  auto spin = [&](unsigned long long want) { while (*hflag < want) __builtin_ia32_pause(); };
  for (int coop = 0; coop < 2; ++coop)
  for (int grid : {1, 132}) {
    const unsigned block = grid == 1 ? 64 : 512;
    // the graph: one kernel node
    CUgraph g; CK(P(cuGraphCreate)(&g, 0));
    unsigned long long a = 0;
    void* params[] = {&dflag, &a, &big};
    CUDA_KERNEL_NODE_PARAMS kp = {};
    kp.func = ff; kp.gridDimX = grid; kp.gridDimY = kp.gridDimZ = 1; kp.blockDimX = block; kp.blockDimY = kp.blockDimZ = 1; kp.kernelParams = params;
    CUgraphNode node; CK(P(cuGraphAddKernelNode)(&node, g, nullptr, 0, &kp));
    if (coop) { CUkernelNodeAttrValue v = {}; v.cooperative = 1; CK(P(cuGraphKernelNodeSetAttribute)(node, CU_KERNEL_NODE_ATTRIBUTE_COOPERATIVE, &v)); }
    CUgraphExec ge; CK(P(cuGraphInstantiateWithFlags)(&ge, g, 0));
    char name[128];
    for (int rep = 0; rep < 2; ++rep) {
      { std::vector<double> rt, sp, gl;
        for (int i = 0; i < N; ++i) {
          a = ++seq;
          auto t0 = clk::now(); CK(P(cuGraphExecKernelNodeSetParams)(ge, node, &kp)); auto t1 = clk::now(); CK(P(cuGraphLaunch)(ge, s)); auto t2 = clk::now(); spin(seq);
          rt.push_back(us(t0, clk::now())); sp.push_back(us(t0, t1)); gl.push_back(us(t1, t2));
        }
        snprintf(name, sizeof name, "grid %d coop %d: graph SetParams+Launch round trip (kernel writes flag)", grid, coop); report(name, rt, 66);
        report("   of it SetParams", sp, 66); report("   of it cuGraphLaunch", gl, 66);
      }
      { std::vector<double> rt, lc;
        CUlaunchConfig cfg = {}; cfg.gridDimX = grid; cfg.gridDimY = cfg.gridDimZ = 1; cfg.blockDimX = block; cfg.blockDimY = cfg.blockDimZ = 1; cfg.hStream = s;
        CUlaunchAttribute at = {}; at.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE; at.value.cooperative = 1; if (coop) { cfg.attrs = &at; cfg.numAttrs = 1; }
        for (int i = 0; i < N; ++i) {
          a = ++seq;
          auto t0 = clk::now(); CK(P(cuLaunchKernelEx)(&cfg, ff, params, nullptr)); auto t1 = clk::now(); spin(seq);
          rt.push_back(us(t0, clk::now())); lc.push_back(us(t0, t1));
        }
        snprintf(name, sizeof name, "grid %d coop %d: cuLaunchKernelEx round trip (kernel writes flag)", grid, coop); report(name, rt, 66);
        report("   of it the launch", lc, 66);
      }
      { // back to back, no wait: CPU per call
        std::vector<double> g1, l1;
        CUlaunchConfig cfg = {}; cfg.gridDimX = grid; cfg.gridDimY = cfg.gridDimZ = 1; cfg.blockDimX = block; cfg.blockDimY = cfg.blockDimZ = 1; cfg.hStream = s;
        CUlaunchAttribute at = {}; at.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE; at.value.cooperative = 1; if (coop) { cfg.attrs = &at; cfg.numAttrs = 1; }
        for (int i = 0; i < N; ++i) { a = ++seq; auto t0 = clk::now(); CK(P(cuGraphExecKernelNodeSetParams)(ge, node, &kp)); CK(P(cuGraphLaunch)(ge, s)); g1.push_back(us(t0, clk::now())); if (i % 32 == 31) CK(P(cuStreamSynchronize)(s)); }
        CK(P(cuStreamSynchronize)(s));
        for (int i = 0; i < N; ++i) { a = ++seq; auto t0 = clk::now(); CK(P(cuLaunchKernelEx)(&cfg, ff, params, nullptr)); l1.push_back(us(t0, clk::now())); if (i % 32 == 31) CK(P(cuStreamSynchronize)(s)); }
        CK(P(cuStreamSynchronize)(s));
        report("   back to back CPU: SetParams+cuGraphLaunch", g1, 66); report("   back to back CPU: cuLaunchKernelEx", l1, 66);
      }
    }
    if (*hflag != seq) { fprintf(stderr, "flag %llu != seq %llu\n", (unsigned long long)*hflag, seq); return 1; }
    CK(P(cuGraphExecDestroy)(ge)); CK(P(cuGraphDestroy)(g));
  }
  { // CPU of creating + instantiating one single-node graph (the cache miss)
    std::vector<double> v;
    for (int i = 0; i < 200; ++i) {
      unsigned long long a = 0; void* params[] = {&dflag, &a, &big};
      CUDA_KERNEL_NODE_PARAMS kp = {}; kp.func = ff; kp.gridDimX = 1; kp.gridDimY = kp.gridDimZ = 1; kp.blockDimX = 64; kp.blockDimY = kp.blockDimZ = 1; kp.kernelParams = params;
      auto t0 = clk::now(); CUgraph g; CK(P(cuGraphCreate)(&g, 0)); CUgraphNode node; CK(P(cuGraphAddKernelNode)(&node, g, nullptr, 0, &kp)); CUgraphExec ge; CK(P(cuGraphInstantiateWithFlags)(&ge, g, 0));
      v.push_back(us(t0, clk::now())); CK(P(cuGraphExecDestroy)(ge)); CK(P(cuGraphDestroy)(g));
    }
    report("create + instantiate a one-node graph", v, 66);
  }
  puts("ok");
  return 0;
}
