// The launch runtime of rankflow's kernels (DeepEP V2's LaunchRuntime): every kernel takes its Args
// struct (kernels/args.hpp) as its only parameter, and one generic launch runs them all. A kernel
// whose blocks wait on each other or on other ranks runs with a grid that can be resident at once:
// at most what the occupancy API allows on the whole GPU divided by the ranks of this process that
// share it (each gets its share), and cooperatively, so that no block spins while a sibling waits for
// an SM that other work holds (the compute-overlap case). Launches are asynchronous on `stream`.
// Outside a capture, where the rank has its GPU to itself (no other rank of this process shares it),
// each kernel on the rank's stream is launched as the one node of a graph the launcher made,
// instantiated and uploaded for it (per kernel and attribute) when the context was made (prepare):
// cuGraphExecKernelNodeSetParams with this launch's grid and Args, then cuGraphLaunch. On the one-H200
// machine that costs the CPU 2.5 µs against 3.6-4.4 µs for cuLaunchKernelEx of the same kernel, and
// a launch + wait for a flag the kernel writes 6.1-7.0 µs against 7.5-8.4
// (bench/results/launch-floor-2026-12-01.md). Where a graph cannot be made or updated the launch is
// a cuLaunchKernelEx, as it is while the stream is being captured and on other streams.
// Ranks sharing a GPU launch directly: with graph launches a peer's kernel sometimes did not start
// while a rank's kernel waited for it, until the GPU timeout (made at each kernel's first launch: the
// suite's engram and SM-holding cases, test/gpu/logs/*-graph-launch-all-ranks-FAILED.log; made up
// front: moe.test.mjs's captured-graph replays at 2 ranks, 7 of 21 runs, and with
// CUDA_DEVICE_MAX_CONNECTIONS=1 10 of 10 runs of bench/shared-gpu/stress.mjs, where the ranks' work
// shares one queue to the GPU). Launched directly, 0 of 140 stress runs and 0 of 11 moe.test.mjs runs
// hung (bench/results/shared-gpu-launch-2026-12-02.md). bench/launch-floor saw graph launches queue
// behind no other stream's kernel (queue-behind*.cc): which queue they take is the driver's.
#pragma once

#include <cuda.h>

#include <map>
#include <utility>

#include "args.hpp"
#include "modules.hpp"

namespace rankflow::cuda {

class Launcher {
 public:
  // sm_count: the GPU's SMs; share: ranks of this process on it; cooperative: launch the waiting
  // kernels cooperatively (CU_LAUNCH_ATTRIBUTE_COOPERATIVE); graphs: launch through the kept graphs
  // where share is 1.
  Launcher(const KernelSet& k, int sm_count, int share, bool cooperative, bool graphs);
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;
  // Makes the graph of every kernel launched on `s` (the rank's stream) now, before any kernel of the
  // rank runs; a launch on another stream launches directly.
  void prepare(CUstream s);
  // While the rank's stream is being captured, launches go straight into the capture.
  void capturing(bool on) { capturing_ = on; }
  // Launches so far through the kept graphs, and the others (info().device).
  uint64_t graph_launches() const { return graph_launches_; }
  uint64_t direct_launches() const { return direct_launches_; }

  // The blocks a grid of kernel f may have: `requested` (0 = the rank's share of the SMs), capped by
  // what can be resident at once while every rank sharing the GPU runs the same.
  int grid_for(CUfunction f, int threads, int smem, int requested) const;
  // rf_combine_local's and rf_dispatch_local's: every block of theirs that fits on num_sms SMs.
  int local_grid(CUfunction f, int num_sms) const;
  int sm_count() const { return sm_count_; }
  int share() const { return share_; }

  void barrier(CUstream s, const kargs::BarrierArgs& a) const;
  void all_gather(CUstream s, const kargs::AllGatherArgs& a) const;
  // The most blocks rf_dispatch_notify's grid takes for `tokens` tokens (the rows of scratch a
  // layout's routing needs: kargs::NotifyScratch); the launch may take fewer.
  int notify_blocks(int64_t tokens) const;
  void dispatch_notify(CUstream s, const kargs::NotifyArgs& a) const;
  void dispatch_data(CUstream s, const kargs::DispatchArgs& a, int num_sms) const;
  // A dispatch without a CPU sync as one kernel (rf_dispatch_fused): the notify's checks and the data
  // kernel's, a grid of num_sms blocks (0 = the rank's share of the SMs) that fits a.notify's fused
  // scratch. fused_blocks(): the most blocks that grid takes (the scratch's rows).
  void dispatch_fused(CUstream s, kargs::FusedDispatchArgs a, int num_sms) const;
  // The bytes of x the fused dispatch's routing blocks ask L2 for, together, before their copies
  // (kargs::FusedDispatchArgs::prefetch_rows).
  void set_fused_prefetch(int64_t bytes) { prefetch_bytes_ = bytes; }
  int fused_blocks() const;
  // send_blocks < 0: a third of the grid sends, the rest reduces (split mode; 0 = not split).
  void combine(CUstream s, kargs::CombineArgs a, int num_sms, int send_blocks = -1) const;
  void signal(CUstream s, const kargs::SignalArgs& a) const;
  void put(CUstream s, const kargs::PutArgs& a) const;
  void reduce(CUstream s, const kargs::ReduceArgs& a) const;
  // rf_peer_reduce: a grid of what can be resident of the rank's share (its blocks wait for the peers').
  void peer_reduce(CUstream s, const kargs::PeerReduceArgs& a) const;
  void engram_fetch(CUstream s, const kargs::FetchArgs& a) const;
  void epoch_advance(CUstream s, const kargs::EpochArgs& a) const;
  // Two levels (two_level.cu): a list of copies, the combine's folds, its last step. Empty lists launch nothing.
  void tl_copy(CUstream s, const kargs::CopyArgs& a) const;
  void tl_fold(CUstream s, const kargs::FoldArgs& a) const;
  void tl_finish(CUstream s, const kargs::FinishArgs& a) const;
  // Tests: `blocks` blocks that each hold a whole SM (all of its shared memory) for a.ns nanoseconds.
  void busy(CUstream s, const kargs::BusyArgs& a, int blocks) const;

 private:
  template <typename Args>
  void launch(CUfunction f, const char* what, int grid, int block, int smem, CUstream s, const Args& args,
              bool cooperative) const;
  int occupancy(CUfunction f, int threads, int smem) const;
  void check_notify(const kargs::NotifyArgs& a) const;
  void check_data(const kargs::DispatchArgs& a) const;
  // The grid of kernel f (rf_dispatch_notify, or fused rf_dispatch_fused) that runs a's notify steps:
  // *blocks cut to what can be resident with its dynamic shared memory, which is checked against a
  // block's limit (the message names the tokens and experts) and allowed above 48 KiB. Returns its bytes.
  int64_t fit_notify(CUfunction f, int threads, const kargs::NotifyArgs& a, bool fused, int* blocks) const;
  // The kept graph of one kernel and launch attribute, on kept_stream_.
  struct Kept {
    CUgraph graph = nullptr;
    CUgraphNode node = nullptr;
    CUgraphExec exec = nullptr;
  };
  // Launches through the kept graph; false where there is none to use (the caller launches directly).
  bool launch_graph(const CUDA_KERNEL_NODE_PARAMS& p, bool cooperative, CUstream s, const char* what) const;
  // The graph of kernel f with a zeroed Args, `block` threads (prepare()).
  template <typename Args>
  void keep(CUfunction f, int block, bool cooperative);
  CUstream kept_stream_ = nullptr;

  KernelSet k_;
  int sm_count_, share_;
  int64_t prefetch_bytes_ = 0;
  bool cooperative_, graphs_;
  bool capturing_ = false;
  mutable uint64_t graph_launches_ = 0, direct_launches_ = 0;
  // Made by prepare(), read only after it (a rank launches from its own thread). exec null: launch directly.
  std::map<std::pair<CUfunction, bool>, Kept> kept_;
  mutable std::map<std::pair<CUfunction, int>, int> occupancy_;  // (kernel, smem) -> blocks per SM
};

}  // namespace rankflow::cuda
