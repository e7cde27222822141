// The CUDA backend of a rank, behind the core's DeviceBackend interface (context.hpp). Built only
// when cuda.h is found; RegisterCuda (register.cc) installs the factory at addon load.
#pragma once

#include <memory>

#include "../context.hpp"

namespace rankflow::gpu {

// Creates rank c.rank()'s GPU side on the calling thread (the rank's executor): primary context on
// GPU c.cfg.device (or rank % GPU count), symmetric memory, kernels, stream, mapped host workspace.
std::unique_ptr<DeviceBackend> make_cuda_rank(Context& c);

}  // namespace rankflow::gpu
