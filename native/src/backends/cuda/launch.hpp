// The launch runtime of rankflow's kernels (DeepEP V2's LaunchRuntime): every kernel takes its Args
// struct (kernels/args.hpp) as its only parameter, and one generic launch runs them all. A kernel
// whose blocks wait on each other or on other ranks runs with a grid that can be resident at once:
// at most what the occupancy API allows on the whole GPU divided by the ranks of this process that
// share it (each gets its share), and cooperatively, so that no block spins while a sibling waits for
// an SM that other work holds (the compute-overlap case). Launches are asynchronous on `stream`.
// Outside a capture, each kernel is launched as the one node of a graph the launcher keeps for it
// (per kernel, attribute and stream): cuGraphExecKernelNodeSetParams with this launch's grid and
// Args, then cuGraphLaunch. On the one-H200 machine that costs the CPU 2.5 µs against 3.6-4.4 µs for
// cuLaunchKernelEx of the same kernel, and a launch + wait for a flag the kernel writes 6.1-7.0 µs
// against 7.5-8.4 (bench/results/launch-floor-2026-12-01.md). Where a graph cannot be made or updated
// the launch is a cuLaunchKernelEx, as it is while the stream is being captured, and always for
// ranks that share their GPU with other ranks of the process: with graph launches there, the GPU
// suite had tests time out waiting for a peer whose kernel never started (engram of 2 and of 4 ranks
// on GPU 0; 4 ranks on GPU 0 beside a kernel holding all but 8 SMs). Why is not known: graph launches
// did not queue behind other streams' kernels (direct or graph-launched, 1-12 streams) nor mix up the
// parameters of pending launches in the launch-floor programs, which make their graphs before any
// kernel runs, where rankflow makes each one at its kernel's first launch, while peers' kernels may
// be spinning. Ranks on GPUs of their own have a context each, and their kernels wait only for kernels
// of other contexts; with them the suite passed (the simulated-node worlds of one rank per process).
#pragma once

#include <cuda.h>

#include <map>
#include <mutex>
#include <tuple>

#include "args.hpp"
#include "modules.hpp"

namespace rankflow::cuda {

class Launcher {
 public:
  // sm_count: the GPU's SMs; share: ranks of this process on it; cooperative: launch the waiting
  // kernels cooperatively (CU_LAUNCH_ATTRIBUTE_COOPERATIVE); graphs: launch through the kept graphs.
  Launcher(const KernelSet& k, int sm_count, int share, bool cooperative, bool graphs);
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;
  // While the rank's stream is being captured, launches go straight into the capture.
  void capturing(bool on) { capturing_ = on; }
  // Launches so far through the kept graphs, and the others (info().device).
  uint64_t graph_launches() const { return graph_launches_; }
  uint64_t direct_launches() const { return direct_launches_; }

  // The blocks a grid of kernel f may have: `requested` (0 = the rank's share of the SMs), capped by
  // what can be resident at once while every rank sharing the GPU runs the same.
  int grid_for(CUfunction f, int threads, int smem, int requested) const;
  int sm_count() const { return sm_count_; }
  int share() const { return share_; }

  void barrier(CUstream s, const kargs::BarrierArgs& a) const;
  void all_gather(CUstream s, const kargs::AllGatherArgs& a) const;
  // The most blocks rf_dispatch_notify's grid takes for `tokens` tokens (the rows of scratch a
  // layout's routing needs: kargs::NotifyScratch); the launch may take fewer.
  int notify_blocks(int64_t tokens) const;
  void dispatch_notify(CUstream s, const kargs::NotifyArgs& a) const;
  void dispatch_data(CUstream s, const kargs::DispatchArgs& a, int num_sms) const;
  // send_blocks < 0: a third of the grid sends, the rest reduces (split mode; 0 = not split).
  void combine(CUstream s, kargs::CombineArgs a, int num_sms, int send_blocks = -1) const;
  void signal(CUstream s, const kargs::SignalArgs& a) const;
  void put(CUstream s, const kargs::PutArgs& a) const;
  void reduce(CUstream s, const kargs::ReduceArgs& a) const;
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
  // The kept graph of one kernel, launch attribute and stream.
  struct Kept {
    CUgraph graph = nullptr;
    CUgraphNode node = nullptr;
    CUgraphExec exec = nullptr;
  };
  // Launches through the kept graph; false where there is none to use (the caller launches directly).
  bool launch_graph(const CUDA_KERNEL_NODE_PARAMS& p, bool cooperative, CUstream s, const char* what) const;

  KernelSet k_;
  int sm_count_, share_;
  bool cooperative_, graphs_;
  bool capturing_ = false;
  mutable uint64_t graph_launches_ = 0, direct_launches_ = 0;
  mutable std::mutex kept_lock_;  // a rank's launches come from its own thread; the lock is uncontended
  mutable std::map<std::tuple<CUfunction, bool, CUstream>, Kept> kept_;  // exec null: none can be made
  mutable std::map<std::pair<CUfunction, int>, int> occupancy_;  // (kernel, smem) -> blocks per SM
};

}  // namespace rankflow::cuda
