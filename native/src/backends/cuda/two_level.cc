// The two-level layer of the CUDA backend (CudaTwoLevel, two_level.hpp): the collectives of a world
// whose nodes share no memory (scaleout.hpp), in the two levels of the host backend
// (backends/host/two_level.cc), with the same results bit for bit: inside the node the flat kernels
// over the node's ranks only (rank_args() gives them the node's peer table, local rank and workspace
// layout), across nodes NCCL on the rank's rail communicator. Every step is enqueued on the rank's
// stream; the CPU waits for it once, at the end of the op.
//   barrier   : the node's barrier kernel, then a header frame to and from every rail peer: each was
//               sent after its node's barrier, so once my stream ran, every rank of the world arrived
//               (that is the CPU round too: the CPU waits for the stream, as the flat CPU-sync barrier
//               waits for its kernel's completion flag).
//   allGather : my part to my rail peers and theirs to me, into my staging slots in node order; then
//               one all_gather kernel writes all N parts into every node peer's buffer (and mine), part
//               k at rail peer k's flat slot (global rank * bytes), with the flat enter / done rounds.
// Every exchange carries a 16-byte header {op seq, bytes} each way, checked once the CPU has waited
// for the op (a barrier, an allGather into host memory; an allGather into a device tensor is not
// waited for, so its headers go unchecked): nodes out of step fail the rank (RANK_FAILED), parts of
// other sizes are refused (EINVAL). NCCL itself matches a send only with a receive of the same size,
// so parts of other sizes can hang the exchange first: then the GPU timeout ends it (TIMEOUT_GPU).
// dispatch and combine: two_level_moe.cc, two_level_data.cc, two_level_combine.cc; AGRS sessions,
// engram and ppExchange: two_level_agrs.cc (with collectives.cc and async.cc, which call it).
// Graphs and the NCCL baselines refuse here (check_runs) before the runtime moves: BACKEND_UNAVAILABLE.
#include <cstring>

#include "two_level.hpp"
#include "driver.hpp"
#include "faults.hpp"

namespace rankflow::cuda {

namespace {
constexpr int64_t kHeaderBytes = 16;  // {uint64 seq, int64 bytes}
}  // namespace

void CudaTwoLevel::check_runs(const char* op) const {
  // What two_level*.cc run; anything else would run the flat kernels over windows that are not
  // mapped. dispatch: with a CPU sync (two_level_notify refuses one without). engramFetch: of this
  // node's entries (the runtime refuses the others').
  static const char* const kRuns[] = {"registerWindow", "barrier", "barrier (CPU sync)", "allGather", "dispatch", "combine",
                                      "session open", "session close", "session allGather", "session reduceScatter",
                                      "engramWrite", "engramFetch", "ppExchange"};
  for (const char* r : kRuns)
    if (std::strcmp(op, r) == 0) return;
  throw Error("BACKEND_UNAVAILABLE",
              std::string(op) + " does not run across nodes on backend 'cuda' yet: this world spans " +
                  std::to_string(c_.nodes.num_nodes) +
                  " nodes (world.nodeId), where cuda runs barrier, allGather, dispatch with a CPU sync, combine, AGRS "
                  "sessions, engram and ppExchange, but not graphs or the NCCL baselines; the rank stays usable. "
                  "Use backend 'host' across nodes, or keep the world on one node",
              rank());
}

void CudaTwoLevel::check_rails(const char* op) const {
  RF_CHECK(rails_ != nullptr, "STATE", std::string(op) + ": rank " + std::to_string(rank()) + " has no rail communicator");
  RF_CHECK(!capturing_, "STATE",
           std::string(op) + ": a world that spans nodes cannot capture its " + op + " in a graph on cuda yet");
}

// Across nodes the rail communicator's exchanges may have been cut halfway (or it was aborted): the
// rank cannot go on after a release, on every rank alike (as the host backend's rails).
void CudaTwoLevel::recover() {
  check_alive("recover");
  if (c_.abort.released_above() != 0) {
    mark_dead("a released run in a world whose nodes share no memory");
    abort_rails();
    throw Error("RANK_FAILED",
                "rank " + std::to_string(rank()) + " cannot be put back in step after a released run: its world's nodes share no "
                "memory, and its rail communicator's exchanges may have been cut halfway; make the group again",
                rank());
  }
  CudaBackend::recover();
}

void CudaTwoLevel::released_mid_op() {
  mark_dead("released while its scale-out exchange waited: the rail communicator was aborted");
  abort_rails();
}

void CudaTwoLevel::reduce_peers(uint64_t, Mem, Mem, int64_t, bool) {
  throw Error("STATE", "peer reduce runs within one node (the runtime composes it across nodes)");
}

// Across nodes NCCL is the scale-out leg: without it the world cannot run (the caller tells every process).
std::vector<uint8_t> CudaTwoLevel::nccl_unique_id() {
  std::string why;
  RF_CHECK(nccl_available(&why), "BACKEND_UNAVAILABLE",
           "backend 'cuda' carries the bytes between nodes over NCCL, and rank " + std::to_string(rank()) + " has none: " + why);
  return make_unique_id();
}

// The rail's communicator (one rank per node, none of them sharing a GPU with another rank of it),
// whatever the ranks of this process share.
void CudaTwoLevel::nccl_init(const std::vector<uint8_t>& id) {
  init_comm(id, c_.nodes.num_nodes, c_.nodes.node, "its rail's rank on node 0");
  translating(rank(), [&] {
    try {
      rails_ = std::make_unique<NcclRails>(c_.nodes, comm_, stream_);
    } catch (...) {
      abort_rails();  // nothing half made: the communicator goes with the refusal
      throw;
    }
  });
}

// Only the node's windows; across nodes the rail communicator carries the bytes (made first: the
// barrier crosses it), and no NCCL window (nothing of NCCL's reads the node's memory).
void CudaTwoLevel::import_peers(const std::vector<ExportedSegments>& peers, uint64_t seq) {
  RF_CHECK(rails_ != nullptr, "STATE", "registerWindow: the rail communicator must be made first (ncclInit)");
  map_peers(peers, seq, false);
}

void CudaTwoLevel::abort_rails() noexcept {
  rails_.reset();
  if (comm_ == nullptr) return;
  try {
    nccl().ncclCommAbort(comm_);  // local: stops this communicator's kernels, answers nobody
  } catch (...) {
  }
  comm_ = nullptr;
  window_ = nullptr;
}

void CudaTwoLevel::rail_headers(uint64_t seq, int64_t bytes, std::vector<RailTransfer>& sends, std::vector<RailTransfer>& recvs) {
  const Nodes& nd = c_.nodes;
  const CUdeviceptr mine = rail_frames_ + CUdeviceptr(kHeaderBytes * nd.num_nodes);
  const uint64_t words[2] = {seq, uint64_t(bytes)};
  for (int w = 0; w < 4; ++w) {  // four 32-bit stores in stream order: no CPU wait, no host staging
    const uint32_t v = uint32_t(words[w / 2] >> (32 * (w % 2)));
    RF_CU(cuMemsetD32Async, mine + CUdeviceptr(4 * w), v, 1, stream_);
  }
  rails_->to_every_peer(mine, 0, rail_frames_, kHeaderBytes, size_t(kHeaderBytes), sends, recvs);
}

void CudaTwoLevel::check_rail_headers(uint64_t seq, int64_t bytes, const char* op, Phase phase) {
  const Nodes& nd = c_.nodes;
  std::vector<uint64_t> got(size_t(2 * nd.num_nodes));
  translating(rank(), [&] { RF_CU(cuMemcpyDtoH, got.data(), rail_frames_, got.size() * 8); });
  for (int k = 0; k < nd.num_nodes; ++k) {
    if (k == nd.node) continue;
    const uint64_t their_seq = got[size_t(2 * k)];
    const int64_t their_bytes = int64_t(got[size_t(2 * k + 1)]);
    const int peer = nd.rail_peer(k);
    if (their_seq != seq) {
      mark_dead("its rail peer on node " + std::to_string(k) + " ran another collective");
      abort_rails();
      throw Error("RANK_FAILED",
                  std::string(op) + ": rank " + std::to_string(peer) + " (node " + std::to_string(k) + ", rank " +
                      std::to_string(rank()) + "'s rail peer) sent the frame of collective #" + std::to_string(their_seq) +
                      ", rank " + std::to_string(rank()) + " is in #" + std::to_string(seq) +
                      ": the nodes ran different collectives; destroy the group",
                  peer, phase_name(phase));
    }
    RF_CHECK(their_bytes == bytes, "EINVAL",
             std::string(op) + ": rank " + std::to_string(peer) + " gave " + std::to_string(their_bytes) + " bytes, rank " +
                 std::to_string(rank()) + " " + std::to_string(bytes) + ": every rank must give the same size");
  }
}

void CudaTwoLevel::rail_round(uint64_t seq) {
  std::vector<RailTransfer> sends, recvs;
  rail_headers(seq, 0, sends, recvs);
  rails_->exchange(sends, recvs);
}

void CudaTwoLevel::barrier(uint64_t seq, bool, bool) {
  check_rails("barrier");
  translating(rank(), [&] {
    kargs::BarrierArgs a;
    a.r = rank_args(seq);
    a.array = kws_.barrier;
    a.phase = kPhaseBarrier;
    a.complete = 0;  // the CPU waits for the stream: the rail frames come after the kernel
    launch_->barrier(stream_, a);
    rail_round(seq);
  });
  wait_stream(WaitSite{kPhaseBarrier, -1, "rail"});
  check_rail_headers(seq, 0, "barrier", kPhaseBarrier);
}

void CudaTwoLevel::all_gather(uint64_t seq, Mem in, int64_t bytes, Mem out) {
  const Nodes& nd = c_.nodes;
  const int W = world(), N = nd.num_nodes, R = nd.ranks_per_node;
  // As flat: parts padded to 16 bytes in the buffer; the N parts of my rail staged behind the W
  // gathered ones, in node order (slot k: rail peer k's part; mine at my node's).
  const int64_t padded = align_up(bytes > 0 ? bytes : 16, 16);
  const int64_t gather = c_.ws.bytes;
  const int64_t staging_at = gather + align_up(padded * W, kRegionAlignment);
  RF_CHECK(staging_at + padded * N <= c_.sym_bytes, "EINVAL",
           "allGather of " + std::to_string(bytes) + " bytes per rank on cuda across " + std::to_string(N) + " nodes needs " +
               std::to_string(staging_at + padded * N - gather) + " buffer bytes (" + std::to_string(W) +
               " parts padded to 16 bytes and " + std::to_string(N) + " staging slots); the buffer has " +
               std::to_string(c_.buffer_bytes()) + " (raise buffer.bytes)");
  check_rails("allGather");
  const CUdeviceptr stage = mem_.window() + CUdeviceptr(staging_at);
  const CUdeviceptr mine = stage + CUdeviceptr(padded * nd.node);
  translating(rank(), [&] {
    if (bytes > 0) {
      if (in.device) RF_CU(cuMemcpyAsync, mine, CUdeviceptr(reinterpret_cast<uintptr_t>(in.ptr)), size_t(bytes), stream_);
      else from_host(mine, in.ptr, bytes);
    }
    if (padded > bytes) RF_CU(cuMemsetD8Async, mine + CUdeviceptr(bytes), 0, size_t(padded - bytes), stream_);
    std::vector<RailTransfer> sends, recvs;
    rail_headers(seq, bytes, sends, recvs);
    rails_->to_every_peer(mine, 0, stage, padded, size_t(bytes), sends, recvs);
    rails_->exchange(sends, recvs);
    // Part k goes to every node peer p (me included) at gather + (k * R + local) * padded: the kernel
    // adds local * bytes itself.
    kargs::AllGatherArgs a;
    a.r = rank_args(seq);
    a.src = reinterpret_cast<const void*>(stage);
    a.bytes = padded;
    a.dst_offset = gather;
    a.parts = N;
    a.src_stride = padded;
    a.part_stride = padded * R;
    launch_->all_gather(stream_, a);
    c_.traffic.out(bytes * (N - 1));
    c_.traffic.up(bytes * N * (R - 1));
  });
  if (!out.device) {
    wait_stream(WaitSite{kPhaseAllGather, -1, "done"});
    check_rail_headers(seq, bytes, "allGather", kPhaseAllGather);
  }
  copy_gathered(out, gather, bytes, padded);
}

}  // namespace rankflow::cuda
