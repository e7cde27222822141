// Rank program of the GPU AGRS benchmark (bench/gpu-agrs.ts): every rank runs the same list of
// native benchmarks together (rank.benchAgrs: device-resident data, CUDA events around `iters` calls).
import type { RankProgramHandle } from '../../actors/index.js';

export interface AgrsCase { op: string; engine: 'kernel' | 'ce' | 'auto'; bytes: number; iters: number }
export interface AgrsLoopArgs { cases: AgrsCase[]; engram?: { entriesPerRank: number; hidden: number } }
export interface AgrsLoopResult { rank: number; us: number[] }

export default async function agrsLoop(rank: RankProgramHandle, a: AgrsLoopArgs): Promise<AgrsLoopResult> {
  if (a.engram) {
    // engramWrite takes a host tensor (the table goes to the host segments) on every backend.
    const t = rank.hostTensor('bf16', [a.engram.entriesPerRank, a.engram.hidden]);
    for (let i = 0; i < t.data.length; i++) t.data[i] = (i * 7 + rank.rank) & 0x3fff;
    await rank.engramWrite(t);
  }
  const us: number[] = [];
  for (const c of a.cases) us.push(await rank.benchAgrs(c.op, c.engine, c.bytes, c.iters));
  return { rank: rank.rank, us };
}
