// Launch floor on this machine: CPU cost per submission and round trips (submit -> GPU -> flag seen).
#include "driver.hpp"

struct Big { unsigned long long w[48]; };
int main(int argc, char** argv) {
  const int N = argc > 1 ? atoi(argv[1]) : 20000;
  const unsigned flags = argc > 2 ? unsigned(atoi(argv[2])) : 0;
  CUmodule m = load_module("k.cubin", flags);
  CUfunction fe, ff, fr; CK(P(cuModuleGetFunction)(&fe, m, "rf_empty")); CK(P(cuModuleGetFunction)(&ff, m, "rf_flag")); CK(P(cuModuleGetFunction)(&fr, m, "rf_flag_relaxed"));
  CUstream s; CK(P(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING));
  volatile unsigned long long* hflag; CK(P(cuMemHostAlloc)((void**)&hflag, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  CUdeviceptr dflag; CK(P(cuMemHostGetDevicePointer)(&dflag, (void*)hflag, 0));
  CUdeviceptr slot; CK(P(cuMemAlloc)(&slot, 4096)); CK(P(cuMemsetD8)(slot, 0, 4096));
  *hflag = 0;
  unsigned long long seq = 0;
  Big big = {};
  printf("flags %u, N %d\n", flags, N);
  // A barrier of stream memory ops: my slot written, waited for, then the host flag written.
  auto batch = [&](CUstreamBatchMemOpParams* ops, unsigned long long v) {
    for (int k = 0; k < 3; ++k) ops[k] = CUstreamBatchMemOpParams{};
    ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64; ops[0].writeValue.address = slot; ops[0].writeValue.value64 = v;
    ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64; ops[1].waitValue.address = slot; ops[1].waitValue.value64 = v; ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    ops[2].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64; ops[2].writeValue.address = dflag; ops[2].writeValue.value64 = v;
  };
  auto spin = [&](unsigned long long want) { while (*hflag < want) __builtin_ia32_pause(); };
  for (int rep = 0; rep < 2; ++rep) {
    { // A: back-to-back P(cuLaunchKernel)(empty), CPU per call
      std::vector<double> v;
      for (int i = 0; i < N; ++i) { auto t0 = clk::now(); CK(P(cuLaunchKernel)(fe, 1, 1, 1, 64, 1, 1, 0, s, nullptr, nullptr)); v.push_back(us(t0, clk::now())); if (i % 64 == 63) CK(P(cuStreamSynchronize)(s)); }
      CK(P(cuStreamSynchronize)(s)); report("A cuLaunchKernel(empty) CPU per call", v);
    }
    { // B: P(cuLaunchKernelEx)(empty)
      std::vector<double> v; CUlaunchConfig cfg = {}; cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1; cfg.blockDimX = 64; cfg.blockDimY = cfg.blockDimZ = 1; cfg.hStream = s;
      for (int i = 0; i < N; ++i) { auto t0 = clk::now(); CK(P(cuLaunchKernelEx)(&cfg, fe, nullptr, nullptr)); v.push_back(us(t0, clk::now())); if (i % 64 == 63) CK(P(cuStreamSynchronize)(s)); }
      CK(P(cuStreamSynchronize)(s)); report("B cuLaunchKernelEx(empty) CPU per call", v);
    }
    { // C: P(cuLaunchKernel)(flag, 400-byte args)
      std::vector<double> v;
      for (int i = 0; i < N; ++i) { ++seq; void* p[] = {&dflag, &seq, &big}; auto t0 = clk::now(); CK(P(cuLaunchKernel)(ff, 1, 1, 1, 64, 1, 1, 0, s, p, nullptr)); v.push_back(us(t0, clk::now())); if (i % 64 == 63) CK(P(cuStreamSynchronize)(s)); }
      CK(P(cuStreamSynchronize)(s)); report("C cuLaunchKernel(flag, 400 B args) CPU per call", v);
    }
    { // G: cuStreamWriteValue64 CPU per call
      std::vector<double> v;
      for (int i = 0; i < N; ++i) { auto t0 = clk::now(); CK(P(cuStreamWriteValue64)(s, slot, ++seq, 0)); v.push_back(us(t0, clk::now())); if (i % 64 == 63) CK(P(cuStreamSynchronize)(s)); }
      CK(P(cuStreamSynchronize)(s)); report("G cuStreamWriteValue64(dev) CPU per call", v);
    }
    { // G2: cuStreamBatchMemOp 3 ops CPU per call
      std::vector<double> v;
      for (int i = 0; i < N; ++i) {
        ++seq; CUstreamBatchMemOpParams ops[3]; batch(ops, seq);
        auto t0 = clk::now(); CK(P(cuStreamBatchMemOp)(s, 3, ops, 0)); v.push_back(us(t0, clk::now())); if (i % 64 == 63) CK(P(cuStreamSynchronize)(s));
      }
      CK(P(cuStreamSynchronize)(s)); report("G2 cuStreamBatchMemOp(write, wait, write host) CPU per call", v);
    }
    { // D: round trip: launch flag kernel, spin on host flag
      std::vector<double> v, w;
      for (int i = 0; i < N; ++i) { ++seq; unsigned long long a = seq; void* p[] = {&dflag, &a, &big}; auto t0 = clk::now(); CK(P(cuLaunchKernel)(ff, 1, 1, 1, 64, 1, 1, 0, s, p, nullptr)); auto t1 = clk::now(); spin(seq); v.push_back(us(t0, clk::now())); w.push_back(us(t0, t1)); }
      report("D round trip: cuLaunchKernel(flag release.sys) + spin", v); report("  of it the launch call", w);
    }
    { // D2: relaxed
      std::vector<double> v;
      for (int i = 0; i < N; ++i) { ++seq; unsigned long long a = seq; void* p[] = {&dflag, &a, &big}; auto t0 = clk::now(); CK(P(cuLaunchKernel)(fr, 1, 1, 1, 64, 1, 1, 0, s, p, nullptr)); spin(seq); v.push_back(us(t0, clk::now())); }
      report("D2 round trip: cuLaunchKernel(flag relaxed.sys) + spin", v);
    }
    { // E: round trip: cuStreamWriteValue64 to host flag + spin
      std::vector<double> v;
      for (int i = 0; i < N; ++i) { ++seq; auto t0 = clk::now(); CK(P(cuStreamWriteValue64)(s, dflag, seq, 0)); spin(seq); v.push_back(us(t0, clk::now())); }
      report("E round trip: cuStreamWriteValue64(host flag) + spin", v);
    }
    { // F: round trip: batch (write dev slot, wait slot, write host flag) + spin
      std::vector<double> v;
      for (int i = 0; i < N; ++i) {
        ++seq; CUstreamBatchMemOpParams ops[3]; batch(ops, seq);
        auto t0 = clk::now(); CK(P(cuStreamBatchMemOp)(s, 3, ops, 0)); spin(seq); v.push_back(us(t0, clk::now()));
      }
      report("F round trip: cuStreamBatchMemOp(write, wait, write host) + spin", v);
    }
    { // H: graph of one flag kernel reading seq from device epoch? (fixed args) round trip via host flag value increments: use kernel writing seq+b.w[0]; relaunch writes same value -> use writeValue after
      CUgraph g; CUgraphExec ge; CK(P(cuStreamBeginCapture)(s, CU_STREAM_CAPTURE_MODE_RELAXED));
      unsigned long long a = 0; void* p[] = {&dflag, &a, &big}; CK(P(cuLaunchKernel)(fe, 1, 1, 1, 64, 1, 1, 0, s, nullptr, nullptr)); (void)p;
      CK(P(cuStreamEndCapture)(s, &g)); CK(P(cuGraphInstantiate)(&ge, g, 0));
      std::vector<double> v, w;
      for (int i = 0; i < N; ++i) { ++seq; auto t0 = clk::now(); CK(P(cuGraphLaunch)(ge, s)); auto t1 = clk::now(); CK(P(cuStreamWriteValue64)(s, dflag, seq, 0)); spin(seq); v.push_back(us(t0, clk::now())); w.push_back(us(t0, t1)); }
      report("H round trip: cuGraphLaunch(1 empty kernel) + writeValue + spin", v); report("  of it cuGraphLaunch", w);
      CK(P(cuGraphExecDestroy)(ge)); CK(P(cuGraphDestroy)(g));
    }
    { // I: round trip: empty launch + writeValue(host) + spin (like a sync after an op)
      std::vector<double> v;
      for (int i = 0; i < N; ++i) { ++seq; auto t0 = clk::now(); CK(P(cuLaunchKernel)(fe, 1, 1, 1, 64, 1, 1, 0, s, nullptr, nullptr)); CK(P(cuStreamWriteValue64)(s, dflag, seq, 0)); spin(seq); v.push_back(us(t0, clk::now())); }
      report("I round trip: cuLaunchKernel(empty) + writeValue(host) + spin", v);
    }
    { // J: cuStreamQuery cost on an idle stream
      std::vector<double> v;
      for (int i = 0; i < N; ++i) { auto t0 = clk::now(); (void)P(cuStreamQuery)(s); v.push_back(us(t0, clk::now())); }
      report("J cuStreamQuery(idle) CPU per call", v);
    }
  }
  return 0;
}
