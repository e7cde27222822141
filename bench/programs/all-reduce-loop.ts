// Rank program of the all-reduce benchmark (bench/all-reduce.ts): for each size, an in-place
// rank.allReduce of a device tensor (zeroes: the sums stay zero, no inf or NaN) called back to back,
// timed with CUDA events on the rank's stream after a warm-up; or, with `copy`, the device-to-device
// copy of the same bytes into the rank's own window (rank.benchPeerCopy in a group of one rank).
import type { RankProgramHandle } from '../../actors/index.js';

export interface AllReduceCase { dtype: 'fp32' | 'bf16'; bytes: number; iters: number }
export interface AllReduceLoopArgs { cases: AllReduceCase[]; copy?: boolean; warmup: number }

/** ms per call, one entry per case */
export default async function allReduceLoop(rank: RankProgramHandle, a: AllReduceLoopArgs): Promise<number[]> {
  const ms: number[] = [];
  for (const c of a.cases) {
    if (a.copy) {
      ms.push(await rank.benchPeerCopy(c.bytes, c.iters, a.warmup));
      continue;
    }
    const n = c.bytes / (c.dtype === 'bf16' ? 2 : 4);
    const t = rank.tensor(c.dtype, [n], c.dtype === 'bf16' ? new Uint16Array(n) : new Float32Array(n));
    const x = t as Exclude<typeof t, { data: unknown }>;
    for (let i = 0; i < a.warmup; i++) await rank.allReduce(x, { inPlace: true });
    await rank.barrier();
    ms.push(await rank.timeIt(() => rank.allReduce(x, { inPlace: true }), c.iters));
    x.free();
  }
  return ms;
}
