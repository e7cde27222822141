// What the launch-floor programs share: the CUDA driver by dlopen (P(cuX) is the entry point cuda.h's
// macros name, looked up once), a check that exits naming the failed call, a clock, the percentiles
// a program prints, and a cubin loaded from the working folder.
#pragma once

#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

inline void* sym(const char* n) {
  static void* h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) { fprintf(stderr, "no libcuda\n"); exit(1); }
  void* p = dlsym(h, n);
  if (!p) { fprintf(stderr, "no %s\n", n); exit(1); }
  return p;
}
#define STR_(x) #x
#define XSTR(x) STR_(x)
#define P(fn) ([] { static auto f = (decltype(&fn))sym(XSTR(fn)); return f; }())
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char* s; P(cuGetErrorName)(r_, &s); fprintf(stderr, "%s: %s\n", #x, s); exit(1); } } while (0)

using clk = std::chrono::steady_clock;
inline double us(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }

// p50, p10, p90 and mean of v (sorted in place), after `name` padded to `width`.
inline void report(const char* name, std::vector<double>& v, int width = 62) {
  std::sort(v.begin(), v.end());
  double s = 0;
  for (double x : v) s += x;
  printf("%-*s p50 %6.2f  p10 %6.2f  p90 %6.2f  mean %6.2f us\n", width, name, v[v.size() / 2], v[v.size() / 10],
         v[v.size() * 9 / 10], s / v.size());
}

// Device 0's primary context made current, and the module of `cubin` (a file in the working folder).
inline CUmodule load_module(const char* cubin, unsigned ctx_flags = 0) {
  CK(P(cuInit)(0));
  CUdevice dev;
  CK(P(cuDeviceGet)(&dev, 0));
  CUcontext ctx;
  if (ctx_flags != 0) CK(P(cuDevicePrimaryCtxSetFlags)(dev, ctx_flags));
  CK(P(cuDevicePrimaryCtxRetain)(&ctx, dev));
  CK(P(cuCtxSetCurrent)(ctx));
  std::ifstream f(cubin, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string img = ss.str();
  CUmodule m;
  CK(P(cuModuleLoadData)(&m, img.data()));
  return m;
}
