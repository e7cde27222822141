// Rank program of the host benchmark: the per-call time of `iters` barriers called inside the worker.
import type { RankProgramHandle } from '../../actors/index.js';

export default async function barrierLoop(rank: RankProgramHandle, a: { iters: number; warmup: number }): Promise<number[]> {
  const times: number[] = [];
  for (let i = 0; i < a.warmup + a.iters; i++) {
    const t0 = performance.now();
    await rank.barrier();
    if (i >= a.warmup) times.push((performance.now() - t0) * 1000);
  }
  return times;
}
