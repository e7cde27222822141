// The CUDA driver API, loaded at run time: libcuda.so.1 is opened with dlopen (never linked), so the
// addon loads and runs its host backend on machines without a GPU or driver. cuda.h is used for types
// only. Each entry point is looked up under the symbol name cuda.h's own macros pick (cuMemAlloc ->
// cuMemAlloc_v2, cuEventElapsedTime -> cuEventElapsedTime_v2, ...), so a pointer's type and the ABI
// of the symbol behind it always agree.
#pragma once

#include <cuda.h>

#include <string>

#include "error.hpp"

namespace rankflow::cuda {

// Every driver call the backend makes. A call listed here is looked up at load; a missing one
// refuses the backend naming the symbol (the driver is older than the one these headers describe).
#define RF_CUDA_DRIVER_CALLS(X)                                                                 \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                        \
  X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute) X(cuDeviceGetName)                \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent)                  \
  X(cuCtxGetCurrent) X(cuCtxSynchronize) X(cuCtxGetDevice)                                                       \
  X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease)                              \
  X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)       \
  X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)                            \
  X(cuMemAlloc) X(cuMemFree)                                                                   \
  X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemPoolSetAttribute) X(cuMemAllocFromPoolAsync) X(cuMemFreeAsync) \
  X(cuMemHostAlloc) X(cuMemHostGetDevicePointer) X(cuMemFreeHost) X(cuMemHostRegister) X(cuMemHostUnregister)                              \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncSetAttribute)           \
  X(cuFuncGetAttribute) X(cuLaunchKernel) X(cuLaunchKernelEx)                                  \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor) X(cuDeviceGetUuid)                            \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamWaitEvent) X(cuStreamWriteValue64) \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuStreamIsCapturing)                        \
  X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy)      \
  X(cuGraphCreate) X(cuGraphUpload) X(cuGraphAddKernelNode) X(cuGraphKernelNodeSetAttribute) X(cuGraphExecKernelNodeSetParams) \
  X(cuEventCreate) X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime)                \
  X(cuEventDestroy) X(cuEventQuery) X(cuPointerGetAttribute)                                   \
  X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuMemcpyAsync)   \
  X(cuMemsetD8Async) X(cuMemsetD32Async)

// The function table. Members are named after the macro-expanded symbol (cuMemAlloc_v2), and since
// `driver().cuMemAlloc(...)` goes through the same macro, callers write the plain names.
struct Driver {
#define RF_CUDA_DRIVER_MEMBER(fn) decltype(&::fn) fn = nullptr;
  RF_CUDA_DRIVER_CALLS(RF_CUDA_DRIVER_MEMBER)
#undef RF_CUDA_DRIVER_MEMBER
  std::string library;  // the path dlopen resolved libcuda.so.1 to
  int version = 0;      // cuDriverGetVersion: 13000 for CUDA 13.0
  int device_count = 0;
};

// The loaded driver, after cuInit(0) succeeded and at least one GPU was seen. Loads once per process,
// thread-safe; a failure is remembered and thrown again (code BACKEND_UNAVAILABLE) on every call.
const Driver& driver();

// Whether driver() would succeed, without throwing: for `doctor` and backend 'auto'. `why` gets the
// message of the failure.
bool driver_available(std::string* why = nullptr);

// Throws CudaError(<CUDA error name>, call, "<call> failed: <name> (<description>). <what to do>")
// unless r is CUDA_SUCCESS.
void check(CUresult r, const char* call);
// The same, saying what the call was for: "cuMemMap (peer device segment of rank 1) failed: ...".
void check(CUresult r, const char* call, const std::string& purpose);

// The CUDA error name of r ("CUDA_ERROR_ILLEGAL_INSTRUCTION"), also when the driver is not loaded.
std::string error_name(CUresult r);

}  // namespace rankflow::cuda

// Calls a driver entry point and checks it, naming the call in the error: RF_CU(cuMemMap, ptr, ...).
#define RF_CU(fn, ...) ::rankflow::cuda::check(::rankflow::cuda::driver().fn(__VA_ARGS__), #fn)
// The same with a purpose: RF_CU_FOR("peer device segment of rank 1", cuMemMap, ptr, ...).
#define RF_CU_FOR(purpose, fn, ...) \
  ::rankflow::cuda::check(::rankflow::cuda::driver().fn(__VA_ARGS__), #fn, (purpose))
