// Host-side launchers, one per kernel (kernels/<name>.cu), in the names of the operations they run.
// Arguments are plain: the peer base table (device memory, peer_base[p] = rank p's window), where
// the workspace sits in each window, the shared WorkspaceLayout, and the wait's timeout and
// Diagnostic (mapped host memory). Launches are asynchronous on `stream`.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "../layout.hpp"

namespace rankflow::cuda {

class Kernels;

struct SignalArgs {
  CUdeviceptr peer_table = 0;    // uint64_t[world] on the device
  int64_t workspace_offset = 0;  // of the workspace inside every window
  WorkspaceLayout ws;            // world_size == the number of ranks
  int rank = 0;
  uint32_t seq = 0;              // this op's sequence number (the epoch written and waited for)
  uint64_t timeout_ns = 0;       // a wait longer than this writes *diag and traps
  CUdeviceptr diag = 0;          // Diagnostic* in mapped host memory (device address), may be 0
};

// barrier: every rank's epoch into every peer, then wait for all of them (one block of 64 threads).
void launch_barrier(const Kernels& k, CUstream stream, const SignalArgs& a);

// allGather: src (bytes, 16-byte aligned, bytes % 16 == 0) into every rank's window at
// dst_offset + rank * bytes; returns when every peer's data is in mine. `arrivals` is a zeroed
// device word owned by the caller (the kernel leaves it zeroed). num_blocks: at most the GPU's SM
// count (the blocks must all be resident: they wait on each other's signals); 0 picks from size.
void launch_all_gather(const Kernels& k, CUstream stream, const SignalArgs& a, CUdeviceptr src,
                       int64_t bytes, int64_t dst_offset, CUdeviceptr arrivals, int num_blocks,
                       int sm_count);

}  // namespace rankflow::cuda
