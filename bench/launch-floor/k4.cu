extern "C" __global__ void rf_slot(unsigned long long* slots, int i, unsigned long long v) { if (threadIdx.x == 0) slots[i] = v; }
extern "C" __global__ void rf_hold(unsigned long long ns) {
  unsigned long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (true) { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); if (t - t0 > ns) break; }
}
