// The two-level layer of the CUDA backend: a world whose nodes share no memory (scaleout.hpp). It is
// the node's protocol (CudaBackend, its kernels over the node's ranks only) plus the rank's rail
// communicator (NCCL, one rank per node: the ranks of its local index), and it runs every op of the
// world in two levels with the host backend's results bit for bit (backends/host/two_level.hpp):
// inside the node the node's kernels, across nodes NCCL on the rail, all enqueued on the rank's
// stream. It overrides the ops that differ across nodes, fills the node's hooks (the rail rounds and
// their checks, the staging across nodes) and refuses what it does not run (check_runs).
// two_level.cc: lifecycle, barrier, allGather, the rail headers; two_level_agrs.cc: sessions and
// pipeline; two_level_moe.cc, two_level_data.cc, two_level_combine.cc: dispatch and combine.
#pragma once

#include <vector>

#include "backend.hpp"

namespace rankflow::cuda {

class CudaTwoLevel final : public CudaBackend {
 public:
  explicit CudaTwoLevel(Context& c) : CudaBackend(c) {}
  ~CudaTwoLevel() override { destroy(); }  // here: the layer's abort_rails still answers

  std::vector<uint8_t> nccl_unique_id() override;
  void nccl_init(const std::vector<uint8_t>& id) override;
  void import_peers(const std::vector<ExportedSegments>& peers, uint64_t seq) override;
  void recover() override;
  void check_runs(const char* op) const override;

  void barrier(uint64_t seq, bool cpu_round, bool wait) override;
  void all_gather(uint64_t seq, Mem in, int64_t bytes, Mem out) override;
  // Refused: across nodes the runtime composes the peer reduce from allGather (runtime/ops/).
  void reduce_peers(uint64_t seq, Mem in, Mem out, int64_t n, bool bf16) override;
  void dispatch_notify(uint64_t seq, DispatchLayout& l, const DispatchInput& in) override;
  void adopt_routing(DispatchLayout& l, const DispatchLayout& from, bool new_weights) override;
  bool dispatch_counts(DispatchLayout& l, bool block) override;
  void dispatch_data(uint64_t seq, DispatchLayout& l, const DispatchInput& in, DispatchOutput& out) override;
  void combine(uint64_t seq, DispatchLayout& l, const CombineInput& in, const CombineOutput& out) override;

 private:
  // The node's hooks (backend.hpp).
  void check_rails(const char* op) const override;
  void rail_round(uint64_t seq) override;
  void check_rail_headers(uint64_t seq, int64_t bytes, const char* op, Phase phase) override;
  int64_t scatter_recv_bytes(int64_t chunk) const override { return chunk * world(); }
  int64_t pp_recv_bytes(int64_t padded) const override { return c_.nodes.local == c_.nodes.ranks_per_node - 1 ? padded : 0; }
  // Session allGather: my part (already in my slot of the region at window offset `region`) to my
  // rail peers, theirs into their slots; then every part of my rail into every node peer's region.
  void session_gather_parts(uint64_t seq, int64_t region, int64_t bytes) override;
  // reduceScatter: my W chunks at `src` (device), my rail peers' chunks for my node into `recv` (W
  // chunks of scratch), then into every node peer's region the chunk for it from each rank of my rail.
  void session_scatter(uint64_t seq, CUdeviceptr src, CUdeviceptr recv, int64_t chunk, int64_t region) override;
  // ppExchange: the node's last rank sends `src` to its rail peer on the next node and receives the
  // previous node's into `recv` (scratch); inside the node the flat hop, the last rank sending what came.
  void pp_hop(uint64_t seq, CUdeviceptr src, CUdeviceptr recv, int64_t bytes, int64_t at) override;
  void abort_rails() noexcept override;
  void released_mid_op() override;

  // Enqueues the op's header {seq, bytes} as my frame; the transfers that send it to every rail peer
  // and receive theirs (into rail_frames_ + 16 * node).
  void rail_headers(uint64_t seq, int64_t bytes, std::vector<RailTransfer>& sends, std::vector<RailTransfer>& recvs);
  // Copy-engine copies into node peers' windows (and mine), in stream order, then the done round over
  // the node at `seq`: once it ran, every node peer's copies into my window are there.
  struct NodeCopy {
    int local;           // the destination's kernel rank
    CUdeviceptr src;
    int64_t offset, bytes;  // window offset of the destination
  };
  void node_copies(uint64_t seq, const std::vector<NodeCopy>& copies, Phase phase);
  // The layout of a handle whose dispatch ran in two levels, the rails checked for `op` (STATE otherwise).
  CudaLayout& two_level_layout(DispatchLayout& l, const char* op);
  // The node's barrier kernel on slot array `array` (each array used at most once per op).
  void node_barrier(uint64_t seq, int64_t array, Phase phase);
  // Device memory for the op's transfers, kept in the layout (tl_upload: filled from host memory).
  CUdeviceptr tl_block(CudaLayout& st, int64_t bytes, const char* what);
  CUdeviceptr tl_upload(CudaLayout& st, const void* src, int64_t bytes, const char* what);
};

}  // namespace rankflow::cuda
