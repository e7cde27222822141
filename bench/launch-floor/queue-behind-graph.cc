// Does a graph launch ever queue behind a kernel of another stream? An app stream holds a kernel for
// 200 ms; then on the rank's stream, launches of E distinct one-node graphs (or direct launches).
#include <cuda.h>
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
static void* sym(const char* n) { static void* h = dlopen("libcuda.so.1", RTLD_NOW); if (!h) { fprintf(stderr, "no libcuda\n"); exit(1); } void* p = dlsym(h, n); if (!p) { fprintf(stderr, "no %s\n", n); exit(1); } return p; }
#define STR_(x) #x
#define XSTR(x) STR_(x)
#define P(fn) ([] { static auto f = (decltype(&fn))sym(XSTR(fn)); return f; }())
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s; P(cuGetErrorName)(r_, &s); fprintf(stderr, "%s: %s\n", #x, s); exit(1); } } while (0)
using clk = std::chrono::steady_clock;
int main() {
  CK(P(cuInit)(0)); CUdevice dev; CK(P(cuDeviceGet)(&dev, 0));
  CUcontext ctx; CK(P(cuDevicePrimaryCtxRetain)(&ctx, dev)); CK(P(cuCtxSetCurrent)(ctx));
  std::ifstream f("k4.cubin", std::ios::binary); std::stringstream ss; ss << f.rdbuf(); std::string img = ss.str();
  CUmodule m; CK(P(cuModuleLoadData)(&m, img.data()));
  CUfunction fs, fh; CK(P(cuModuleGetFunction)(&fs, m, "rf_slot")); CK(P(cuModuleGetFunction)(&fh, m, "rf_hold"));
  CUdeviceptr slots; CK(P(cuMemAlloc)(&slots, 8 * 64));
  for (int apps : {1, 4}) {
    std::vector<CUstream> app(apps); for (auto& s : app) CK(P(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING));
    unsigned long long hns = 200000000ull; void* hpar[] = {&hns};
    CUDA_KERNEL_NODE_PARAMS hp_ = {}; hp_.func = fh; hp_.gridDimX = 1; hp_.gridDimY = hp_.gridDimZ = 1; hp_.blockDimX = 32; hp_.blockDimY = hp_.blockDimZ = 1; hp_.kernelParams = hpar;
    std::vector<CUgraphExec> hx(apps);
    for (int a = 0; a < apps; ++a) { CUgraph hg; CUgraphNode hn; CK(P(cuGraphCreate)(&hg, 0)); CK(P(cuGraphAddKernelNode)(&hn, hg, nullptr, 0, &hp_)); CK(P(cuGraphInstantiateWithFlags)(&hx[a], hg, 0)); }
    CUstream mine; CK(P(cuStreamCreate)(&mine, CU_STREAM_NON_BLOCKING));
    for (int graph = 0; graph < 2; ++graph) {
      const int E = 12;
      int ii = 0; unsigned long long vv = 0; void* params[] = {&slots, &ii, &vv};
      CUDA_KERNEL_NODE_PARAMS p = {}; p.func = fs; p.gridDimX = 1; p.gridDimY = p.gridDimZ = 1; p.blockDimX = 32; p.blockDimY = p.blockDimZ = 1; p.kernelParams = params;
      std::vector<CUgraphExec> ex(E); std::vector<CUgraph> gs(E);
      for (int e = 0; e < E; ++e) { CUgraphNode n; CK(P(cuGraphCreate)(&gs[e], 0)); CK(P(cuGraphAddKernelNode)(&n, gs[e], nullptr, 0, &p)); CK(P(cuGraphInstantiateWithFlags)(&ex[e], gs[e], 0)); }
      // warm: launch each once
      for (int e = 0; e < E; ++e) CK(P(cuGraphLaunch)(ex[e], mine));
      CK(P(cuStreamSynchronize)(mine));
      int slow = 0; double worst = 0;
      for (int e = 0; e < E; ++e) {
        for (int a = 0; a < apps; ++a) CK(P(cuGraphLaunch)(hx[a], app[a]));
        auto t0 = clk::now();
        if (graph) CK(P(cuGraphLaunch)(ex[e], mine)); else CK(P(cuLaunchKernel)(fs, 1, 1, 1, 32, 1, 1, 0, mine, params, nullptr));
        CK(P(cuStreamSynchronize)(mine));
        double ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
        if (ms > 50) ++slow; if (ms > worst) worst = ms;
        for (auto& s : app) CK(P(cuStreamSynchronize)(s));
      }
      printf("%d app streams each holding a GRAPH-launched kernel; %-6s launches on my stream: %d of %d waited for an app kernel (worst %.1f ms)\n", apps, graph ? "graph" : "direct", slow, E, worst);
      fflush(stdout);
      for (int e = 0; e < E; ++e) { CK(P(cuGraphExecDestroy)(ex[e])); CK(P(cuGraphDestroy)(gs[e])); }
    }
  }
  return 0;
}
