// Per-op overhead of rank programs (node dist/bench/overhead.js [--backend host|cuda] [--ranks 2]):
// wall µs per awaited barrier, p50/p99 (bench/programs/op-overhead.ts). On cuda the barrier kernel
// takes ~5 µs, so the figure is what the runtime (rank machine, executor, completion) adds.
import { parseArgs } from 'node:util';

import { createGroup } from '../actors/index.js';
import type { OverheadFigure } from './programs/op-overhead.js';

export async function measureOverhead(backend: 'host' | 'cuda', ranks: number, iters: number, warmup: number, devices?: number[]): Promise<OverheadFigure[]> {
  const buffer = { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 2 * ranks };
  const g = await createGroup({ backend, ranks, buffer, ...(devices ? { devices } : {}) });
  try {
    const per = await g.run<OverheadFigure[]>(new URL('./programs/op-overhead.js', import.meta.url), { iters, warmup });
    // the slower rank of each figure (every rank waits for the slowest anyway)
    return per[0]!.map((f, i) => ({ op: f.op, p50: Math.max(...per.map((p) => p[i]!.p50)), p99: Math.max(...per.map((p) => p[i]!.p99)), mean: Math.max(...per.map((p) => p[i]!.mean)) }));
  } finally {
    await g.destroy();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values: flags } = parseArgs({
    options: {
      backend: { type: 'string', default: 'host' },
      ranks: { type: 'string', default: '2' },
      iters: { type: 'string', default: '2000' },
      warmup: { type: 'string', default: '200' },
      /** cuda: every rank on GPU 0 */
      share: { type: 'boolean', default: false },
    },
  });
  const devices = flags.share ? Array<number>(Number(flags.ranks)).fill(0) : undefined;
  const figs = await measureOverhead(flags.backend as 'host' | 'cuda', Number(flags.ranks), Number(flags.iters), Number(flags.warmup), devices);
  console.log(`per-op wall µs in a rank program (${flags.backend}, ${flags.ranks} ranks, ${flags.iters} iters)`);
  for (const f of figs) console.log(`${f.op.padEnd(22)} p50 ${f.p50.toFixed(1).padStart(8)}  p99 ${f.p99.toFixed(1).padStart(8)}  mean ${f.mean.toFixed(1).padStart(8)}`);
}
