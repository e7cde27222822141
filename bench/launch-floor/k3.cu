// n-way barrier across streams: block 0 thread 0 of kernel i sets flags[i] = seq, then waits for all n flags (bounded 1 s).
extern "C" __global__ void rf_xbar(unsigned long long* flags, int i, int n, unsigned long long seq, int* failed) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  asm volatile("st.release.gpu.global.u64 [%0], %1;" :: "l"(flags + i), "l"(seq) : "memory");
  unsigned long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (int p = 0; p < n; ++p) {
    while (true) {
      unsigned long long v; asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(flags + p) : "memory");
      if (v >= seq) break;
      unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      if (t - t0 > 1000000000ull) { atomicAdd(failed, 1); return; }
    }
  }
}
extern "C" __global__ void rf_hold(unsigned long long ns) {
  unsigned long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (true) { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); if (t - t0 > ns) break; }
}
