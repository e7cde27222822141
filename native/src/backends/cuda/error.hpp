// The exception the CUDA backend throws. `code` is a rankflow public error code
// (BACKEND_UNAVAILABLE when the driver, a GPU or NCCL is missing) or, for a failed driver/NCCL call,
// the CUDA error name (CUDA_ERROR_OUT_OF_MEMORY, ...) or NCCL result name. `call` names the API call.
// Kept apart from the host backend's rankflow::Error (native/src/errors.hpp, landing on main) so this
// directory builds on its own; the addon maps one onto the other by `code` and `what()`.
#pragma once

#include <stdexcept>
#include <string>

namespace rankflow::cuda {

struct CudaError : std::runtime_error {
  std::string code;  // BACKEND_UNAVAILABLE, EINVAL, or the CUDA/NCCL error name
  std::string call;  // the driver/NCCL call that failed, empty for a precondition
  CudaError(std::string code, std::string call, const std::string& message)
      : std::runtime_error(message), code(std::move(code)), call(std::move(call)) {}
};

// Host precondition with a message that says what to do (DeepEP's EP_HOST_ASSERT).
#define RF_CUDA_REQUIRE(cond, msg)                                                   \
  do {                                                                               \
    if (!(cond)) throw ::rankflow::cuda::CudaError("EINVAL", "", std::string(msg));  \
  } while (0)

}  // namespace rankflow::cuda
