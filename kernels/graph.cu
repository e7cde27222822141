// The last node of a captured graph (native/src/backends/cuda/graph.cc): moves the rank's device
// epoch past the graph's ops, so that the next replay's kernels read new sequence numbers
// (common.cuh op_seq) and every replay is a new collective, with no host argument.
#include "common.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

extern "C" __global__ void __launch_bounds__(32) rf_epoch_advance(const EpochArgs args) {
  if (threadIdx.x == 0 && blockIdx.x == 0) *reinterpret_cast<volatile uint64_t*>(args.epoch) += args.advance;
}
