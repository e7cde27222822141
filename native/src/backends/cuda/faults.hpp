// How the CUDA backend's failures reach the runtime: a CudaError (a driver or NCCL call, a launcher's
// precondition) becomes the runtime's Error, and a kernel fault (not a timeout: device waits give up
// without trapping) poisons CUDA for the whole process, which the other ranks' errors then name.
#pragma once

#include <string>

#include "error.hpp"
#include "runtime/errors.hpp"

namespace rankflow::cuda {

// EINVAL and BACKEND_UNAVAILABLE keep their code (the op is refused, the rank stays usable); a failed
// driver or NCCL call fails the rank (or names the rank whose fault poisoned the process).
Error to_error(const CudaError& e, int rank);

// Runs f, turning CudaErrors into the runtime's errors for `rank`.
template <typename F>
auto translating(int rank, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const CudaError& e) {
    throw to_error(e, rank);
  }
}

// A kernel of `rank` faulted (CUDA's launch failures are sticky for the whole process: every other
// rank's context then fails too). The first one is remembered, so that the others can say who.
void record_fault(int rank, const std::string& what);
// The rank whose kernel poisoned this process when it is not `rank` (then *note says so), else -1.
int faulted_elsewhere(int rank, std::string* note);

}  // namespace rankflow::cuda
