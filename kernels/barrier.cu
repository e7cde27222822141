// barrier: one block. Thread p stores my epoch (the op's sequence number) into peer p's slot
// barrier[my_rank] with a system-scope release, then waits until my own slot barrier[p] holds
// peer p's epoch. Everything this GPU wrote before the barrier (earlier kernels included) is visible
// to every peer after it, and vice versa. Same phases and slots as ops::barrier of the host executor.
#include "common.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

// peer_base[p]: rank p's window in this rank's address space; the workspace starts at
// workspace_offset inside every window.
extern "C" __global__ void __launch_bounds__(kMaxRanks) rf_barrier(
    const uint64_t* __restrict__ peer_base, int64_t workspace_offset, WorkspaceLayout ws, int rank,
    uint32_t seq, uint64_t timeout_ns, Diagnostic* diag) {
  const int p = int(threadIdx.x);
  const int world = ws.world_size;
  if (p < world) {
    // Orders this GPU's earlier writes (other threads, earlier kernels) before the epoch, for peers.
    __threadfence_system();
    st_release_sys(slot_ptr(peer_base[p] + uint64_t(workspace_offset), ws, ws.barrier, rank),
                   encode_signal(seq, 0));
    const uint64_t mine = peer_base[rank] + uint64_t(workspace_offset);
    wait_signal(slot_ptr(mine, ws, ws.barrier, p), seq, timeout_ns, diag, kPhaseBarrier, p);
  }
  __syncthreads();
}
