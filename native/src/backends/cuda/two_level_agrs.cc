// AGRS sessions, engram and ppExchange of the cuda backend in a world whose nodes share no memory,
// in the two levels of the host backend (backends/host/two_level.cc: the same order, the same bytes
// across the rails) and with the flat results bit for bit: every byte lands in the slot of the flat
// region it lands in on one node, and the sums are the flat kernel's (rf_reduce over the W slots in
// global rank order, fp32, one rounding). collectives.cc and async.cc run the flat steps around
// these (staging, my part into my slot, the reduce, the copies out, the waits); here only what
// crosses: NCCL on the rank's rail (NcclRails, its 16-byte header {seq, bytes} first) and, inside
// the node, copy-engine copies into the node peers' windows followed by the node's done round (the
// signal kernel over kws_ at the op's seq), the flat put's copy-engine path in the node's view.
//   session open/close : the flat signal kernels over the node (enter, session slots), then the rail
//                        round (rail_round: a header to and from every rail peer), as the host's.
//   session allGather  : my part from my slot to every rail peer, theirs straight into their slots
//                        of my region (NCCL); then the N parts of my rail into every node peer's
//                        region at the same slots. Scale-out (N-1) x bytes, scale-up (R-1) x N x bytes.
//   reduceScatter      : my chunks for node k's ranks (contiguous in my input: ranks kR .. kR+R-1) to
//                        my rail peer there, its chunks for my node's ranks back (NCCL, into
//                        scratch); into local rank j's region at slot s the chunk for j from rank s
//                        of my rail (mine from my input); the done round; rf_reduce as flat.
//                        Scale-out (N-1) x R x chunk, scale-up x N x chunk.
//   engram write       : the flat enter / copy / done over the node, then the rail round; a fetch
//                        reads this node's host segments only (the runtime refuses other nodes').
//   ppExchange         : the ring hop (n, R-1) -> (n+1, 0) runs on rail R-1: the node's last rank
//                        sends its part to its rail peer on the next node and receives the previous
//                        node's, which it sends on, instead of its own, to the node's first rank
//                        in the flat hop over the node (the node's ring, put with an enter round).
//                        Scale-out: bytes on the last rail; scale-up: bytes per rank (R > 1).
// Headers are checked once the CPU waited for the op (host outputs); an op into a device tensor,
// or an asynchronous one, is not waited for and its headers go unchecked (as the allGather's).
#include "two_level.hpp"
#include "driver.hpp"
#include "faults.hpp"

namespace rankflow::cuda {

void CudaTwoLevel::node_copies(uint64_t seq, const std::vector<NodeCopy>& copies, Phase phase) {
  for (const NodeCopy& c : copies) {
    if (c.bytes <= 0) continue;
    RF_CU(cuMemcpyAsync, kernel_peer_base(c.local) + CUdeviceptr(c.offset), c.src, size_t(c.bytes), stream_);
    if (c.local != kernel_rank()) c_.traffic.up(c.bytes);
  }
  if (kernel_world() == 1) return;
  // The signal kernel fences what the stream wrote before it, then signals; its waits end once every
  // node peer's copies into my window ran.
  kargs::SignalArgs s;
  s.r = rank_args(seq);
  s.array = kws_.done;
  s.value = seq;
  s.ring = all_ring();
  s.phase = phase;
  launch_->signal(stream_, s);
}

void CudaTwoLevel::session_gather_parts(uint64_t seq, int64_t region, int64_t bytes) {
  const Nodes& nd = c_.nodes;
  const int N = nd.num_nodes, R = nd.ranks_per_node;
  const CUdeviceptr base = mem_.window() + CUdeviceptr(region);
  auto slot = [&](int g) { return int64_t(g) * bytes; };
  std::vector<RailTransfer> sends, recvs;
  rail_headers(seq, bytes, sends, recvs);
  // From node k into my region at slot rail_peer(k) = k * R + local.
  rails_->to_every_peer(base + CUdeviceptr(slot(rank())), 0, base + CUdeviceptr(slot(nd.local)), R * bytes, size_t(bytes), sends, recvs);
  rails_->exchange(sends, recvs);
  c_.traffic.out(bytes * (N - 1));
  std::vector<NodeCopy> copies;
  for (int j = 0; j < R; ++j)
    for (int k = 0; j != nd.local && k < N; ++k) {
      const int s = nd.rail_peer(k);
      copies.push_back({j, base + CUdeviceptr(slot(s)), region + slot(s), bytes});
    }
  node_copies(seq, copies, kPhaseSessionGather);
}

void CudaTwoLevel::session_scatter(uint64_t seq, CUdeviceptr src, CUdeviceptr recv, int64_t chunk, int64_t region) {
  const Nodes& nd = c_.nodes;
  const int N = nd.num_nodes, R = nd.ranks_per_node;
  const int64_t block = R * chunk;  // the chunks of one node's ranks
  std::vector<RailTransfer> sends, recvs;
  rail_headers(seq, block, sends, recvs);
  // To node k: my chunks for its ranks, src + k * block; from node k: its rank of my rail's chunks for
  // my node's ranks, into recv + k * block (my own node's block of recv stays unused).
  rails_->to_every_peer(src, block, recv, block, size_t(block), sends, recvs);
  rails_->exchange(sends, recvs);
  c_.traffic.out(block * (N - 1));
  std::vector<NodeCopy> copies;
  for (int j = 0; j < R; ++j)
    for (int k = 0; k < N; ++k) {
      // The chunk for local rank j from rank (k, my local): at (k * R + j) * chunk of my input (k =
      // my node) or of what came from node k.
      const CUdeviceptr from = (k == nd.node ? src : recv) + CUdeviceptr((k * R + j) * chunk);
      copies.push_back({j, from, region + int64_t(nd.rail_peer(k)) * chunk, chunk});
    }
  node_copies(seq, copies, kPhaseSessionReduce);
}

void CudaTwoLevel::pp_hop(uint64_t seq, CUdeviceptr src, CUdeviceptr recv, int64_t bytes, int64_t at) {
  const Nodes& nd = c_.nodes;
  const int N = nd.num_nodes, R = nd.ranks_per_node;
  CUdeviceptr hop = src;  // what I send my next rank inside the node
  if (nd.local == R - 1) {
    // With one rank per node every hop crosses: what comes is my previous rank's, straight into my buffer.
    const CUdeviceptr into = R == 1 ? mem_.window() + CUdeviceptr(at) : recv;
    std::vector<RailTransfer> sends, recvs;
    rail_headers(seq, bytes, sends, recvs);
    sends.push_back({(nd.node + 1) % N, src, size_t(bytes)});
    recvs.push_back({(nd.node + N - 1) % N, into, size_t(bytes)});
    rails_->exchange(sends, recvs);
    c_.traffic.out(bytes);
    hop = into;
  }
  if (R == 1) return;
  // The node's ring in the kernels' view: local j -> j + 1, the last rank -> the first.
  put(rank_args(seq), hop, 0, bytes, at, kargs::Ring{1, 1, 1, 1}, true, kPhasePipeline);
  c_.traffic.up(bytes);
}

}  // namespace rankflow::cuda
