// Tests only: a kernel whose every block spins for `ns` nanoseconds, holding its SM, so that the GPU
// tests can show that rankflow's kernels complete while other work occupies most SMs (the
// compute-overlap case). Launched on a stream of its own by the test hook of the CUDA backend.
#include "common.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

extern "C" __global__ void __launch_bounds__(1024) rf_busy(const BusyArgs args) {
  const uint64_t start = globaltimer_ns();
  while (globaltimer_ns() - start < args.ns) __nanosleep(1000);
}
