// MoE dispatch on the GPU, its first kernel when a CPU sync follows (notify.cuh has its steps, which
// the fused dispatch of dispatch.cu runs too): rf_dispatch_notify routes the tokens, gives every peer
// its counts, waits for theirs, keeps them in the state and mirrors them into mapped host memory for
// the CPU-sync wait.
#include "notify.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

extern "C" __global__ void __launch_bounds__(kNotifyThreads) rf_dispatch_notify(const NotifyArgs args) {
  int t_lo = 0, t_hi = 0;
  notify_phase(args, /*fused=*/false, &t_lo, &t_hi);
}
