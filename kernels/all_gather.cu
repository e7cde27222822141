// allGather outside a session: every rank's `bytes` land in every rank's buffer at rank * bytes.
// Same phases as ops::all_gather of the host executor:
//   1. enter: announce "I entered op seq" in every peer's enter[my_rank]; before writing into peer p,
//      wait for its enter[p] (p is done reading its buffer for the previous op).
//   2. data: a warp copies one 512 B..2 KiB chunk at a time with 16-byte loads/stores, straight into
//      the peer's buffer over NVLink; (peer, chunk) items are interleaved so that all links are busy.
//   3. done: once every block's stores are out (a fence each, then a grid-wide arrival count),
//      the last block signals done[my_rank] to every peer with a release, and waits for every
//      peer's done[p] with an acquire: after it, my buffer holds everyone's data.
#include "common.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

// src: my `bytes` (device memory, 16-byte aligned). dst_offset: window offset of the gather region
// (16-byte aligned); rank r's part at dst_offset + r * bytes. arrivals: one zeroed device word this
// kernel uses as its grid-wide counter and leaves zeroed again. bytes % 16 == 0 (the launcher checks).
extern "C" __global__ void __launch_bounds__(256) rf_all_gather(
    const uint64_t* __restrict__ peer_base, int64_t workspace_offset, WorkspaceLayout ws,
    const void* __restrict__ src, int64_t bytes, int64_t dst_offset, unsigned int* arrivals,
    int rank, uint32_t seq, uint64_t timeout_ns, Diagnostic* diag) {
  const int world = ws.world_size;
  const uint64_t my_ws = peer_base[rank] + uint64_t(workspace_offset);

  // 1. enter. Block 0 announces; every block waits before its first store into a peer.
  if (blockIdx.x == 0) {
    for (int p = int(threadIdx.x); p < world; p += int(blockDim.x))
      st_release_sys(slot_ptr(peer_base[p] + uint64_t(workspace_offset), ws, ws.enter, rank),
                     encode_signal(seq, 0));
  }
  for (int p = int(threadIdx.x); p < world; p += int(blockDim.x))
    wait_signal(slot_ptr(my_ws, ws, ws.enter, p), seq, timeout_ns, diag, kPhaseEnter, p);
  __syncthreads();

  // 2. data.
  const int64_t chunks = (bytes + kCopyChunkBytes - 1) / kCopyChunkBytes;
  const int64_t items = chunks * world;
  const int lane = int(threadIdx.x) % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  const int64_t vecs = bytes / 16;
  const int4* in = static_cast<const int4*>(src);
  for (int64_t item = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
       item < items; item += warps) {
    // Peers interleaved, starting after me, so that no receiver is hit by everyone at once.
    const int p = int((rank + 1 + item % world) % world);
    const int64_t chunk = item / world;
    int4* out = reinterpret_cast<int4*>(peer_base[p] + uint64_t(dst_offset) + uint64_t(rank * bytes));
    warp_copy_chunk(out, in, chunk, vecs, lane);
  }

  // 3. done. Each thread's stores are pushed out to system scope before the block counts itself in.
  if (!last_block_arrived(arrivals)) return;
  for (int p = int(threadIdx.x); p < world; p += int(blockDim.x))
    st_release_sys(slot_ptr(peer_base[p] + uint64_t(workspace_offset), ws, ws.done, rank),
                   encode_signal(seq, 0));
  for (int p = int(threadIdx.x); p < world; p += int(blockDim.x))
    wait_signal(slot_ptr(my_ws, ws, ws.done, p), seq, timeout_ns, diag, kPhaseAllGather, p);
}
