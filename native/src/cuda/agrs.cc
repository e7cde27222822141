// Launchers of kernels/agrs.cu: argument checks and cuLaunchKernel parameter lists, one for one with
// the kernels' signatures.
#include "agrs.hpp"

#include <algorithm>
#include <string>

#include "driver.hpp"
#include "kernels.hpp"

namespace rankflow::cuda {

AgrsKernels::AgrsKernels(Kernels& k)
    : signal_(k.entry("agrs", "rf_signal")),
      put_(k.entry("agrs", "rf_put")),
      reduce_(k.entry("agrs", "rf_reduce")),
      fetch_(k.entry("agrs", "rf_engram_fetch")) {}

void AgrsKernels::signal(CUstream s, const SignalArgs& a, int64_t array, uint32_t value, Ring ring,
                         uint64_t phase) const {
  RF_CUDA_REQUIRE(value != 0, "signal: value 0 is reserved (an untouched slot).");
  CUdeviceptr peers = a.peer_table, diag = a.diag;
  int64_t workspace_offset = a.workspace_offset, arr = array;
  WorkspaceLayout ws = a.ws;
  int rank = a.rank;
  uint32_t v = value;
  int ds = ring.dst_start, dc = ring.dst_count, ss = ring.src_start, sc = ring.src_count;
  uint64_t ph = phase, timeout_ns = a.timeout_ns;
  void* params[] = {&peers, &workspace_offset, &ws, &rank, &arr, &v, &ds, &dc, &ss, &sc, &ph, &timeout_ns, &diag};
  RF_CU_FOR("signal, rank " + std::to_string(rank), cuLaunchKernel, signal_, 1, 1, 1, unsigned(kMaxRanks), 1, 1, 0, s,
            params, nullptr);
}

void AgrsKernels::put(CUstream s, const SignalArgs& a, CUdeviceptr src, int64_t src_stride, int64_t bytes,
                      int64_t dst_offset, Ring ring, bool enter, uint64_t phase, CUdeviceptr arrivals,
                      int sm_count) const {
  RF_CUDA_REQUIRE(bytes % 16 == 0 && src % 16 == 0 && src_stride % 16 == 0 && dst_offset % 16 == 0,
                  "put: bytes (" + std::to_string(bytes) + "), source, stride and destination must be multiples of 16.");
  RF_CUDA_REQUIRE(a.seq != 0 && arrivals != 0, "put: sequence 0 is reserved; arrivals is required.");
  // 32 KiB per block: 1 MiB already spreads over 32 SMs (256 KiB per block left 1-4 MiB puts
  // latency-bound at 59-227 GB/s in the first bench run).
  constexpr int64_t kBytesPerBlock = int64_t(32) << 10;
  const int cap = std::max(1, sm_count);
  const int64_t total = bytes * std::max(1, ring.dst_count);
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>(cap, (total + kBytesPerBlock - 1) / kBytesPerBlock)));
  CUdeviceptr peers = a.peer_table, diag = a.diag, source = src, counter = arrivals;
  int64_t workspace_offset = a.workspace_offset, stride = src_stride, n = bytes, dst = dst_offset;
  WorkspaceLayout ws = a.ws;
  int rank = a.rank, ds = ring.dst_start, dc = ring.dst_count, ss = ring.src_start, sc = ring.src_count,
      en = enter ? 1 : 0;
  uint32_t seq = a.seq;
  uint64_t ph = phase, timeout_ns = a.timeout_ns;
  void* params[] = {&peers, &workspace_offset, &ws,   &rank, &source, &stride,  &n,          &dst,  &ds,
                    &dc,    &ss,               &sc,   &en,   &seq,    &ph,      &counter,    &timeout_ns, &diag};
  RF_CU_FOR("put, rank " + std::to_string(rank), cuLaunchKernel, put_, unsigned(blocks), 1, 1, 256, 1, 1, 0, s,
            params, nullptr);
}

void AgrsKernels::reduce(CUstream s, CUdeviceptr region, int world, int64_t n, bool bf16, CUdeviceptr out,
                         int sm_count) const {
  if (n <= 0) return;
  const int64_t per = bf16 ? (n % 8 == 0 ? n / 8 : n) : (n % 4 == 0 ? n / 4 : n);
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>(int64_t(sm_count) * 8, (per + 255) / 256)));
  CUdeviceptr r = region, o = out;
  int w = world, b = bf16 ? 1 : 0;
  int64_t count = n;
  void* params[] = {&r, &w, &count, &b, &o};
  RF_CU_FOR("reduce", cuLaunchKernel, reduce_, unsigned(blocks), 1, 1, 256, 1, 1, 0, s, params, nullptr);
}

void AgrsKernels::engram_fetch(CUstream s, CUdeviceptr segments, CUdeviceptr ids, int64_t n, int64_t entries,
                               int64_t row_bytes, CUdeviceptr out, int sm_count) const {
  if (n <= 0) return;
  const int blocks = int(std::max<int64_t>(1, std::min<int64_t>(int64_t(sm_count) * 8, (n + 7) / 8)));
  CUdeviceptr seg = segments, id = ids, o = out;
  int64_t count = n, e = entries, rb = row_bytes;
  void* params[] = {&seg, &id, &count, &e, &rb, &o};
  RF_CU_FOR("engram fetch", cuLaunchKernel, fetch_, unsigned(blocks), 1, 1, 256, 1, 1, 0, s, params, nullptr);
}

}  // namespace rankflow::cuda
