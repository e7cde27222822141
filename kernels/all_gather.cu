// allGather outside a session: every rank's `bytes` land in every rank's buffer at rank * bytes (in
// two levels: each of the `parts` of the rank's rail at its own rank's slot, AllGatherArgs).
// Same phases as the host executor's allGather:
//   1. enter: announce "I entered op seq" in every peer's enter[my_rank]; before writing into peer p,
//      wait for its enter[p] (p is done reading its buffer for the previous op).
//   2. data: a warp copies one 2 KiB chunk at a time with 16-byte loads/stores, straight into the
//      peer's buffer over NVLink; (peer, chunk) items are interleaved so that all links are busy.
//   3. done: once every block's stores are out (a fence each, then a grid-wide arrival count), the
//      last block signals done[my_rank] to every peer and waits for every peer's done[p]: after it,
//      my buffer holds everyone's data.
// A wait that gives up (common.cuh) skips the work after it; the last block then signals nothing.
// Elastic: a rank outside the live mask is neither signalled nor waited for, and its part of my
// buffer is zero-filled by me (in place of its copy: the items are the same), as the host's is.
#include "common.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

extern "C" __global__ void __launch_bounds__(256) rf_all_gather(const AllGatherArgs args) {
  const RankArgs& a = args.r;
  const int world = a.world, rank = a.rank;
  const uint64_t seq = op_seq(a), live = live_ranks(a);
  __shared__ uint64_t peers[kMaxRanks];
  load_peers(peers, a);

  // 1. enter. Block 0 announces; every block waits before its first store into a peer.
  if (blockIdx.x == 0)
    for (int p = int(threadIdx.x); p < world; p += int(blockDim.x))
      if (rank_live(live, p)) signal(slot_at(peers[p], a.ws, a.ws.enter, rank), seq);
  bool ok = true;
  for (int p = int(threadIdx.x); p < world; p += int(blockDim.x))
    if (rank_live(live, p)) ok = wait_signal(slot_at(peers[rank], a.ws, a.ws.enter, p), seq, a, kPhaseEnter, p) && ok;
  ok = __syncthreads_and(ok);

  // 2. data.
  if (ok) {
    const int64_t bytes = args.bytes;
    const int64_t chunks = (bytes + kCopyChunkBytes - 1) / kCopyChunkBytes;
    const int64_t per_part = chunks * world;
    const int64_t items = per_part * args.parts;
    const int lane = int(threadIdx.x) % kWarpSize;
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
    const int64_t vecs = bytes / 16;
    for (int64_t item = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize; item < items;
         item += warps) {
      // Peers interleaved, starting after me, so that no receiver is hit by everyone at once.
      const int64_t part = item / per_part, rest = item % per_part;
      const int p = int((rank + 1 + rest % world) % world);
      const int64_t chunk = rest / world;
      const int4* in = reinterpret_cast<const int4*>(static_cast<const uint8_t*>(args.src) + part * args.src_stride);
      if (!rank_live(live, p)) {  // p sends me nothing: its part of my buffer reads as zeros
        int4* gone = reinterpret_cast<int4*>(peers[rank] + uint64_t(args.dst_offset + part * args.part_stride) + uint64_t(p * bytes));
        for (int64_t i = chunk * (kCopyChunkBytes / 16) + lane; i < min(vecs, (chunk + 1) * (kCopyChunkBytes / 16)); i += kWarpSize)
          gone[i] = make_int4(0, 0, 0, 0);
        continue;
      }
      int4* out = reinterpret_cast<int4*>(peers[p] + uint64_t(args.dst_offset + part * args.part_stride) + uint64_t(rank * bytes));
      warp_copy_chunk(out, in, chunk, vecs, lane);
    }
  }

  // 3. done. Each thread's stores are pushed out to system scope before the block counts itself in.
  if (!last_block_arrived(a.arrivals) || gave_up(a.arrivals)) return;
  for (int p = int(threadIdx.x); p < world; p += int(blockDim.x))
    if (rank_live(live, p)) signal(slot_at(peers[p], a.ws, a.ws.done, rank), seq);
  for (int p = int(threadIdx.x); p < world; p += int(blockDim.x))
    if (rank_live(live, p)) wait_signal(slot_at(peers[rank], a.ws, a.ws.done, p), seq, a, kPhaseAllGather, p);
}
