// The launch runtime of rankflow's kernels (DeepEP V2's LaunchRuntime): every kernel takes its Args
// struct (kernels/args.hpp) as its only parameter, and one generic launch runs them all. A kernel
// whose blocks wait on each other or on other ranks runs with a grid that can be resident at once:
// at most what the occupancy API allows on the whole GPU divided by the ranks of this process that
// share it (each gets its share), and cooperatively, so that no block spins while a sibling waits for
// an SM that other work holds (the compute-overlap case). Launches are asynchronous on `stream`.
#pragma once

#include <cuda.h>

#include <map>

#include "args.hpp"
#include "modules.hpp"

namespace rankflow::cuda {

class Launcher {
 public:
  // sm_count: the GPU's SMs; share: ranks of this process on it; cooperative: launch the waiting
  // kernels cooperatively (CU_LAUNCH_ATTRIBUTE_COOPERATIVE).
  Launcher(const KernelSet& k, int sm_count, int share, bool cooperative);

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

  KernelSet k_;
  int sm_count_, share_;
  bool cooperative_;
  mutable std::map<std::pair<CUfunction, int>, int> occupancy_;  // (kernel, smem) -> blocks per SM
};

}  // namespace rankflow::cuda
