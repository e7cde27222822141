// barrier: one block. Thread p stores my epoch (the op's sequence number) into peer p's slot
// array[my_rank] with a system-scope release, then waits until my own slot array[p] holds peer p's
// epoch. Everything this GPU wrote before the barrier (earlier kernels included) is visible to every
// peer after it, and vice versa: a release is cumulative over every write that happens before it,
// the earlier kernels' too (their stream ordered them before this one), so no fence precedes it.
// Same phases and slots as the host executor's barrier; a rank outside the live mask (elastic) is
// neither signalled nor waited for.
// With `complete`, thread 0 finally writes the op's sequence number into Control.completed_seq, the
// mapped host word the CPU spins on (no driver call on the wait path), with a release as well.
// (The two sequentially consistent system fences these releases replace cost a 1-rank barrier
// 1-2 µs of its ~11: 10.8 / 11.9 -> 10.1 / 9.9 µs per awaited call, two runs, one H200.)
#include "common.cuh"

using namespace rankflow;
using namespace rankflow::kernels;

extern "C" __global__ void __launch_bounds__(kMaxRanks) rf_barrier(const BarrierArgs args) {
  const RankArgs& a = args.r;
  const int p = int(threadIdx.x);
  const uint64_t seq = op_seq(a);
  if (p < a.world && rank_live(live_ranks(a), p)) {
    signal(slot_at(a.peers[p], a.ws, args.array, a.rank), seq);
    wait_signal(slot_at(a.peers[a.rank], a.ws, args.array, p), seq, a, Phase(args.phase), p);
  }
  __syncthreads();
  if (args.complete != 0 && p == 0 && a.ctl != nullptr) {
    st_release_sys(reinterpret_cast<uint64_t*>(&a.ctl->completed_seq), seq);
  }
}
