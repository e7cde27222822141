// What a rank is told when it is made (ContextConfig, from createGroup through the worker), and the
// domains it derives from it (DeepEP's physical NVLink x RDMA ranks and logical scale-up x scale-out
// ranks; `hybrid` switches between them).
#pragma once

#include <cstdint>
#include <string>

#include "protocol.hpp"

namespace rankflow {

enum class BackendKind { Host, Cuda };

struct ContextConfig {
  BackendKind backend = BackendKind::Host;
  int device = -1;          // cuda: the rank's GPU ordinal; -1 = rank % GPU count
  int device_share = 1;     // cuda: ranks of this process on the rank's GPU (grids are split between them)
  bool nccl = true;         // cuda: make an NCCL communicator (off where ranks share a GPU: NCCL refuses it)
  bool cooperative = true;  // cuda: launch the kernels whose blocks wait on each other cooperatively
  bool graph_launch = true; // cuda: launch each kernel as the one node of a graph kept per kernel (launch.hpp)
  bool fused_dispatch = true; // cuda: a dispatch without a CPU sync is one kernel, notify and data (rf_dispatch_fused)
  int rank = 0;
  int world_size = 1;
  int ranks_per_node = 0;   // physical NVLink (scale-up) domain size; 0 = the whole world
  bool scale_out = false;   // the nodes (blocks of ranks_per_node) share no memory: two-level ops (scaleout.hpp)
  EpConfig ep;
  int64_t num_bytes = 0;    // symmetric bytes (workspace + buffer); 0 = size_hint(ep)
  int64_t cpu_bytes = 0;    // host segment per rank
  bool hybrid = true;
  double cpu_timeout_s = 300;
  double gpu_timeout_s = 100;
  // Tuning that actors/core/config.ts reads from the environment and hands down (native code reads
  // no environment variable itself).
  int64_t ce_min_bytes = int64_t(48) << 20;  // cuda AGRS puts of this many bytes per peer use copy engines
  std::string nccl_home;                     // where the cuda backend looks for libnccl.so.2 first
  // cuda in a world: NCCL_HOSTID for this process, set before its first NCCL call unless already set
  // (actors/world/nccl.ts chose it: one per node, so that NCCL's hosts are rankflow's nodes); "" = none.
  std::string nccl_host_id;
  uint64_t first_seq = 0;                    // tests: start the sequence there (near a wrap)
};

struct Domains {
  int num_nvl_ranks, num_rdma_ranks, nvl_rank_idx, rdma_rank_idx;              // physical
  int num_scaleup_ranks, num_scaleout_ranks, scaleup_rank_idx, scaleout_rank_idx;  // logical
  bool is_scaleup_nvlink;
  static Domains make(int rank, int world, int nvl_ranks, bool hybrid);
};

}  // namespace rankflow
