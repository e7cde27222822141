// NCCL, loaded at run time with dlopen: the engine for the baseline collectives (ncclAlltoAll,
// ncclAllGather) and for window registration. No NCCL header exists on the build machines, so the
// few types used are declared here by hand, copied in shape from NCCL 2.28's nccl.h (src/nccl.h.in):
// ncclUniqueId is 128 bytes passed by value, communicators and windows are opaque pointers, results
// and data types are int enums. The ABI of these has been stable since 2.19 (windows: since 2.27).
#pragma once

#include <cuda.h>

#include <string>
#include <vector>

#include "error.hpp"

namespace rankflow::cuda {

// ---- Declared after NCCL 2.28 nccl.h ------------------------------------------------------------
extern "C" {
typedef struct ncclComm* ncclComm_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define RF_NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[RF_NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
typedef enum {
  ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2, ncclInternalError = 3,
  ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6, ncclInProgress = 7,
} ncclResult_t;
typedef enum {
  ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
  ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9, ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
} ncclDataType_t;
}
// Window registration flags (nccl.h: NCCL_WIN_DEFAULT, NCCL_WIN_COLL_SYMMETRIC) and alignment.
constexpr int kNcclWinDefault = 0x00;
constexpr int kNcclWinCollSymmetric = 0x01;
constexpr size_t kNcclWinRequiredAlignment = 4096;
// NCCL_VERSION(2, 28, 0): windows, ncclAlltoAll and the device API this runtime relies on.
constexpr int kNcclMinVersion = 22800;
// cudaStream_t and CUstream are the same type (struct CUstream_st*).
using ncclStream_t = CUstream;

// ---- The function table ----------------------------------------------------------------------------
struct Nccl {
  ncclResult_t (*ncclGetVersion)(int* version) = nullptr;
  ncclResult_t (*ncclGetUniqueId)(ncclUniqueId* id) = nullptr;
  ncclResult_t (*ncclCommInitRank)(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) = nullptr;
  ncclResult_t (*ncclCommDestroy)(ncclComm_t comm) = nullptr;
  ncclResult_t (*ncclCommAbort)(ncclComm_t comm) = nullptr;
  ncclResult_t (*ncclCommGetAsyncError)(ncclComm_t comm, ncclResult_t* async_error) = nullptr;
  ncclResult_t (*ncclCommWindowRegister)(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                         int win_flags) = nullptr;
  ncclResult_t (*ncclCommWindowDeregister)(ncclComm_t comm, ncclWindow_t win) = nullptr;
  ncclResult_t (*ncclAllGather)(const void* sendbuff, void* recvbuff, size_t sendcount,
                                ncclDataType_t datatype, ncclComm_t comm, ncclStream_t stream) = nullptr;
  ncclResult_t (*ncclAlltoAll)(const void* sendbuff, void* recvbuff, size_t count,
                               ncclDataType_t datatype, ncclComm_t comm, ncclStream_t stream) = nullptr;
  ncclResult_t (*ncclGroupStart)() = nullptr;
  ncclResult_t (*ncclGroupEnd)() = nullptr;
  const char* (*ncclGetErrorString)(ncclResult_t result) = nullptr;
  const char* (*ncclGetLastError)(ncclComm_t comm) = nullptr;

  std::string library;  // the file that was loaded
  std::string origin;   // why there: "NCCL_HOME", "system", "python package"
  int version = 0;      // ncclGetVersion: 22809 for 2.28.9
  // Elastic communicators (issue 35), looked up but never needed: whether this NCCL exports
  // ncclCommShrink / ncclCommGrow (dlsym). Ranks of one process sharing a GPU have no communicator.
  bool comm_shrink = false, comm_grow = false;
};

// NCCL, loaded once per process (thread-safe). Candidates in order: $NCCL_HOME/lib/libnccl.so.2, the
// loader's libnccl.so.2, the python package nvidia-nccl-cu* (nvidia/nccl/lib). A candidate older than
// 2.28 is skipped; when none fits, throws BACKEND_UNAVAILABLE naming what was found and what to do.
// Where to look before the system's loader path: NCCL_HOME and the prefixes of python environments
// (~/.local, $VIRTUAL_ENV), as actors/core/config.ts read them. The first call wins (NCCL loads once).
struct NcclSearch {
  std::string home;
  std::vector<std::string> python_prefixes;
};
void set_nccl_search(const NcclSearch& s);
const Nccl& nccl();
bool nccl_available(std::string* why = nullptr);

// NCCL_HOSTID for this process, unless it is set already (an application's value, or an earlier
// group's): NCCL hashes it into the process's host identity once, at its first use, and ranks of one
// communicator that share that identity must not share a GPU. Call before every first NCCL call of
// a rank (ncclGetUniqueId, ncclCommInitRank); "" does nothing. The value comes from the TypeScript
// layer (actors/world/nccl.ts: one per rankflow node), which reads the environment.
void set_nccl_host_id(const std::string& id);

// "2.28.9" from 22809.
std::string nccl_version_string(int code);

// Throws CudaError(<result name>, call, "<call> failed: <result name>: <NCCL's text>") unless success.
void nccl_check(ncclResult_t r, const char* call, ncclComm_t comm = nullptr);

}  // namespace rankflow::cuda

// Calls an NCCL entry point and checks it: RF_NCCL(ncclCommInitRank, &comm, n, id, rank).
#define RF_NCCL(fn, ...) ::rankflow::cuda::nccl_check(::rankflow::cuda::nccl().fn(__VA_ARGS__), #fn)
