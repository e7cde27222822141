// Does a graph launch ever queue behind a kernel of another stream? An app stream holds a kernel for
// 200 ms; then on the rank's stream, launches of E distinct one-node graphs (or direct launches).
// `./queue-behind` launches the holding kernels directly (1, 4, 12 app streams, E = 40);
// `./queue-behind graph` as graphs of their own (1, 4 app streams, E = 12).
#include "driver.hpp"

int main(int argc, char** argv) {
  const bool graph_holders = argc > 1 && std::string(argv[1]) == "graph";
  CUmodule m = load_module("k4.cubin");
  CUfunction fs, fh; CK(P(cuModuleGetFunction)(&fs, m, "rf_slot")); CK(P(cuModuleGetFunction)(&fh, m, "rf_hold"));
  CUdeviceptr slots; CK(P(cuMemAlloc)(&slots, 8 * 64));
  for (int apps : graph_holders ? std::vector<int>{1, 4} : std::vector<int>{1, 4, 12}) {
    std::vector<CUstream> app(apps); for (auto& s : app) CK(P(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING));
    unsigned long long hns = 200000000ull; void* hpar[] = {&hns};
    CUDA_KERNEL_NODE_PARAMS hp_ = {}; hp_.func = fh; hp_.gridDimX = 1; hp_.gridDimY = hp_.gridDimZ = 1; hp_.blockDimX = 32; hp_.blockDimY = hp_.blockDimZ = 1; hp_.kernelParams = hpar;
    std::vector<CUgraphExec> hx(graph_holders ? apps : 0);
    for (auto& e : hx) { CUgraph hg; CUgraphNode hn; CK(P(cuGraphCreate)(&hg, 0)); CK(P(cuGraphAddKernelNode)(&hn, hg, nullptr, 0, &hp_)); CK(P(cuGraphInstantiateWithFlags)(&e, hg, 0)); }
    CUstream mine; CK(P(cuStreamCreate)(&mine, CU_STREAM_NON_BLOCKING));
    for (int graph = 0; graph < 2; ++graph) {
      const int E = graph_holders ? 12 : 40;
      int ii = 0; unsigned long long vv = 0; void* params[] = {&slots, &ii, &vv};
      CUDA_KERNEL_NODE_PARAMS p = {}; p.func = fs; p.gridDimX = 1; p.gridDimY = p.gridDimZ = 1; p.blockDimX = 32; p.blockDimY = p.blockDimZ = 1; p.kernelParams = params;
      std::vector<CUgraphExec> ex(E); std::vector<CUgraph> gs(E);
      for (int e = 0; e < E; ++e) { CUgraphNode n; CK(P(cuGraphCreate)(&gs[e], 0)); CK(P(cuGraphAddKernelNode)(&n, gs[e], nullptr, 0, &p)); CK(P(cuGraphInstantiateWithFlags)(&ex[e], gs[e], 0)); }
      // warm: launch each once
      for (int e = 0; e < E; ++e) CK(P(cuGraphLaunch)(ex[e], mine));
      CK(P(cuStreamSynchronize)(mine));
      int slow = 0; double worst = 0;
      for (int e = 0; e < E; ++e) {
        for (int a = 0; a < apps; ++a) {
          if (graph_holders) CK(P(cuGraphLaunch)(hx[a], app[a]));
          else CK(P(cuLaunchKernel)(fh, 1, 1, 1, 32, 1, 1, 0, app[a], hpar, nullptr));
        }
        auto t0 = clk::now();
        if (graph) CK(P(cuGraphLaunch)(ex[e], mine)); else CK(P(cuLaunchKernel)(fs, 1, 1, 1, 32, 1, 1, 0, mine, params, nullptr));
        CK(P(cuStreamSynchronize)(mine));
        double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
        if (ms > 50) ++slow;
        if (ms > worst) worst = ms;
        for (auto& s : app) CK(P(cuStreamSynchronize)(s));
      }
      printf("%d app streams each holding a %skernel; %-6s launches on my stream: %d of %d waited for an app kernel (worst %.1f ms)\n", apps, graph_holders ? "GRAPH-launched " : "", graph ? "graph" : "direct", slow, E, worst);
      fflush(stdout);
      for (int e = 0; e < E; ++e) { CK(P(cuGraphExecDestroy)(ex[e])); CK(P(cuGraphDestroy)(gs[e])); }
    }
  }
  return 0;
}
