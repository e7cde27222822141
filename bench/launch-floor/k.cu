struct Big { unsigned long long w[48]; };
extern "C" __global__ void rf_empty() {}
extern "C" __global__ void rf_flag(unsigned long long* host_flag, unsigned long long seq, Big b) {
  if (threadIdx.x == 0) asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(host_flag), "l"(seq + b.w[0]) : "memory");
}
extern "C" __global__ void rf_flag_relaxed(unsigned long long* host_flag, unsigned long long seq, Big b) {
  if (threadIdx.x == 0) asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(host_flag), "l"(seq + b.w[0]) : "memory");
}
