// The cuda backend's scale-out leg for worlds whose nodes share no memory (runtime/scaleout.hpp):
// NCCL between nodes, NVLink symmetric memory inside the node, in the same two levels as the host
// backend (backends/host/two_level*.cc), whose outputs it must match bit for bit.
//
// One NCCL communicator per rail: the N ranks of local index j, one per node, NCCL rank = node index
// (made by CudaBackend::nccl_init from a unique id that the rail's rank on node 0 makes; the
// TypeScript layer carries it through the rendezvous, actors/world/nccl.ts). No communicator holds
// two ranks of one node, so ranks of a node may share a GPU, and simulated nodes (processes on one
// host with their own world.nodeId, hence their own NCCL_HOSTID) may share one GPU across processes:
// NCCL then connects them over its network transport, as it would real nodes.
//
// STATUS: run on the one-H200 machine (test/gpu/scaleout.test.mjs: 2 simulated nodes x 1 and x 2
// ranks, all on GPU 0, passed 2026-12-01 at 9c17a2b). What exists (two_level.cc):
//   barrier   : the node's barrier kernel over the node's ranks, then a 16-byte frame (the op's seq)
//               to and from every rail peer (NcclRails::exchange) on the rank's stream; the CPU waits
//               for the stream, so every rank of the world has arrived when it returns.
//   allGather : my part to my rail peers and theirs to me (NCCL, into my staging slots), then one
//               all_gather kernel that writes every part this rank holds into every node peer's buffer
//               at the flat offset (global rank * bytes): the flat result, bit for bit.
//   dispatch  : with a CPU sync (and cached from such a handle), two_level_moe.cc / two_level_data.cc;
//   combine   : two_level_combine.cc. Host-planned (routing, counts, offsets, fold order), carried out by
//               the copy / fold / finish kernels of kernels/two_level.cu between node barriers, NCCL on
//               the rails (first run 2026-12-01 at 1de3179; docs/scale-out.md has its design and limits).
//   sessions, engram, ppExchange : two_level_agrs.cc (and the flat entry points of collectives.cc and
//               async.cc around it), the host backend's two levels (first run 2026-12-01 at 4add552:
//               docs/scale-out.md).
//   every other collective (dispatch without a CPU sync, graphs, the NCCL baselines) refuses with
//               BACKEND_UNAVAILABLE naming the op, the rank usable.
// What remains: a device-planned dispatch and combine (no CPU sync, capturable), on this leg, step by step (each kernel on the
// rank's stream; "NCCL" = NcclRails::exchange; R ranks per node, N nodes):
//   dispatch notify : kernel: routing, counts into the node's ranks (as the flat notify kernel, for
//                     node peers only), per-node record counts + offsets (a prefix sum over tokens);
//                     NCCL: the N int64 counts to / from the rail peers (to_every_peer).
//   CPU sync        : the host reads the counts (the flat CPU-sync wait), sizes the receives.
//   pack            : kernel: every token's record (x row, scales, k ids, k weights, token id: the
//                     host's layout) into the send buffer of each remote node it has experts on.
//   NCCL            : records to / from the rail peers (one send and one receive per remote node).
//   forward         : kernel: the flat data kernel with a second source: my rows and every received
//                     record into the node peers' windows (NVLink stores, peer pointers), counts of
//                     the forwarded sources into their slots, `done` per source.
//   compaction      : the flat one (the receive region is the flat one).
//   combine         : kernel: each receiver's rows into the forwarder of their source's rail (NVLink);
//                     then per rail N rounds: NCCL receives of the partial sums from lower nodes,
//                     fold kernel (fp32, rank order, continuing the partial), NCCL sends of one frame
//                     to every other node and receives from higher ones; final kernel: biases, bf16.
// One thing the node-local view of today's kernels does not give dispatch and combine: their slots
// are per SOURCE rank of the world (rank_count[s], expert_count[s][e], and the receive offsets of
// every s), since a forwarder signals and writes for the remote sources of its rail as if they had
// (backends/host/two_level_moe.cc). Their kernels need a workspace layout of W sources beside the
// node's R peer windows (and enter slots per represented source and receiver), not the node's layout
// that rank_args() gives barrier and allGather. And combine's sums stay the flat ones only if each
// token's fp32 partial crosses the nodes in node order, continued, not summed per node and added.
// On one host, NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 keep NCCL on its network transport, so that
// simulated nodes (world.nodeId) exercise the scale-out leg as real nodes would.
#pragma once

#include <cuda.h>

#include <utility>
#include <vector>

#include "nccl.hpp"
#include "runtime/errors.hpp"
#include "runtime/scaleout.hpp"

namespace rankflow::cuda {

// ncclSend / ncclRecv (NCCL >= 2.7), looked up in the library nccl() loaded.
struct NcclP2p {
  ncclResult_t (*send)(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, ncclStream_t stream) = nullptr;
  ncclResult_t (*recv)(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, ncclStream_t stream) = nullptr;
};
// Throws BACKEND_UNAVAILABLE when the loaded NCCL has no point-to-point calls.
const NcclP2p& nccl_p2p();

// One transfer of an exchange: `bytes` of device memory at `ptr`, to or from the rail peer on node
// `node` (its rank in the rail communicator).
struct RailTransfer {
  int node;
  CUdeviceptr ptr;
  size_t bytes;
};

// The scale-out leg of one rank: its rail communicator (the ranks of its local index, one per node,
// NCCL rank = node index). It does not own the communicator: CudaBackend destroys or aborts it.
class NcclRails {
 public:
  // Resolves ncclSend/ncclRecv here, so that a missing call refuses the rank when it is made, never
  // in the middle of an op.
  NcclRails(const Nodes& nodes, ncclComm_t comm, CUstream stream);

  // The transfers to and from the rail peers for one op, as one NCCL group on the rank's stream: NCCL
  // matches a send with the peer's receive of the same size, and the group lets them progress together
  // (no order of peers can deadlock). Only enqueues; the stream orders what follows. Zero-byte
  // transfers are left out (both sides leave them out: the sizes are the op's, equal on every rank).
  void exchange(const std::vector<RailTransfer>& sends, const std::vector<RailTransfer>& recvs) const;
  // One transfer of `bytes` to and from every rail peer, appended to `sends` / `recvs` (one exchange
  // with whatever else the op sends): to node k from send + k * send_stride (stride 0: the same bytes
  // to every peer), from node k into recv + k * recv_stride.
  void to_every_peer(CUdeviceptr send, int64_t send_stride, CUdeviceptr recv, int64_t recv_stride, size_t bytes,
                     std::vector<RailTransfer>& sends, std::vector<RailTransfer>& recvs) const;
  // The transfers of a record exchange, from per-node counts (the host's copy after the CPU sync) and
  // the send / receive buffers laid out as counts * record_bytes per node in node order.
  std::pair<std::vector<RailTransfer>, std::vector<RailTransfer>> record_transfers(
      const std::vector<int64_t>& send_counts, const std::vector<int64_t>& recv_counts, int64_t record_bytes, CUdeviceptr send_buf,
      CUdeviceptr recv_buf) const;
  const Nodes& nodes() const { return nodes_; }

 private:
  Nodes nodes_;
  ncclComm_t comm_;
  CUstream stream_;
  const NcclP2p& p2p_;
};

}  // namespace rankflow::cuda
