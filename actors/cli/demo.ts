// `rankflow demo`: a group of ranks on the backend found (host without GPUs) lives, synchronises,
// moves tokens and dies, printing every transition as it happens and what it measured.
import { createGroup } from '../group.js';
import { RankflowError } from '../core/errors.js';
import { tensor, toBf16, type Tensor } from '../core/tensor.js';
import type { GroupObserver } from '../observe/timeline.js';

export interface DemoOptions {
  argv: string[];
  observers?: GroupObserver[];
  out?: (line: string) => void;
}

const DEMO_USAGE = `usage: rankflow demo [--ranks N] [--backend auto|host|cuda] [--tokens N] [--hidden N] [--rounds N] [--quiet] [--timeline out.svg]`;

function parse(argv: string[]): { ranks: number; backend: 'auto' | 'host' | 'cuda'; tokens: number; hidden: number; rounds: number; quiet: boolean } {
  const o = { ranks: 4, backend: 'auto' as 'auto' | 'host' | 'cuda', tokens: 256, hidden: 1024, rounds: 100, quiet: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const value = (): string => {
      const v = argv[++i];
      if (v === undefined) throw new RankflowError('EINVAL', `${a} needs a value\n${DEMO_USAGE}`);
      return v;
    };
    if (a === '--ranks') o.ranks = Number(value());
    else if (a === '--backend') o.backend = value() as typeof o.backend;
    else if (a === '--tokens') o.tokens = Number(value());
    else if (a === '--hidden') o.hidden = Number(value());
    else if (a === '--rounds') o.rounds = Number(value());
    else if (a === '--quiet') o.quiet = true;
    else throw new RankflowError('EINVAL', `unknown option ${a}\n${DEMO_USAGE}`);
  }
  return o;
}

const us = (ms: number): string => `${(ms * 1000).toFixed(1)} µs`;

export async function runDemo(opts: DemoOptions): Promise<void> {
  const out = opts.out ?? ((line: string) => process.stdout.write(`${line}\n`));
  const o = parse(opts.argv);
  if (!Number.isInteger(o.rounds) || o.rounds < 1) throw new RankflowError('EINVAL', `--rounds must be a positive integer (got ${o.rounds})`);
  const topk = 8, numExperts = 8 * o.ranks;
  const t0 = performance.now();
  const group = await createGroup({
    ranks: o.ranks, backend: o.backend,
    buffer: { maxTokensPerRank: o.tokens, hidden: o.hidden, topk, numExperts },
    observers: [
      ...(opts.observers ?? []),
      { attach: (g) => { const f = (t: { rank: number; from: string; to: string; event: string }) => { if (!o.quiet) out(`  rank ${t.rank}: ${t.from} -> ${t.to}  (${t.event})`); }; g.on('transition', f); return () => g.off('transition', f); } },
    ],
  });
  const created = performance.now() - t0;
  out(`group of ${group.size} ranks on '${group.backend}' ready in ${created.toFixed(1)} ms`);
  try {
    const b0 = performance.now();
    const rounds = o.rounds;
    const quiet = o.quiet;
    o.quiet = true;  // a line per rank per barrier would drown the rest
    for (let i = 0; i < rounds; i++) await group.barrier();
    const barrier = (performance.now() - b0) / rounds;
    o.quiet = quiet;
    await group.barrier({ withCpuSync: true });

    const rows = 64;
    const inputs = group.ranks.map((r) => tensor('fp32', [rows, o.hidden], Float32Array.from({ length: rows * o.hidden }, (_, i) => r.rank * 1e6 + i)));
    const g0 = performance.now();
    const gathered = await group.allGather(inputs);
    const gatherMs = performance.now() - g0;
    const ok = gathered.every((g) => g.data[rows * o.hidden] === 1e6 && g.data.length === group.size * rows * o.hidden);
    const gatherBytes = group.size * rows * o.hidden * 4;

    // Route every token to top-8 experts with a fixed pattern, dispatch, and combine back.
    const T = o.tokens;
    const inputsMoe = group.ranks.map(({ rank }) => {
      const x = toBf16(Float32Array.from({ length: T * o.hidden }, (_, i) => ((i * 7 + rank) % 97) / 97));
      const topkIdx = Int32Array.from({ length: T * topk }, (_, i) => (Math.floor(i / topk) * 5 + (i % topk) * 3 + rank) % numExperts);
      for (let t = 0; t < T; t++) {
        const seen = new Set<number>();
        for (let k = 0; k < topk; k++) { let e = topkIdx[t * topk + k]!; while (seen.has(e)) e = (e + 1) % numExperts; seen.add(e); topkIdx[t * topk + k] = e; }
      }
      return { x: tensor('bf16', [T, o.hidden], x) as Tensor, topkIdx, topkWeights: new Float32Array(T * topk).fill(1 / topk) };
    });
    const d0 = performance.now();
    const dispatched = await group.dispatch(inputsMoe);
    const dispatchMs = performance.now() - d0;
    const received = dispatched.reduce((a, d) => a + d.x.data.byteLength, 0);
    const c0 = performance.now();
    await group.combine(dispatched.map((d) => ({ x: d.x, handle: d.handle })));
    const combineMs = performance.now() - c0;

    out('');
    out(`measured on ${group.size} '${group.backend}' ranks:`);
    out(`  create -> ready          ${created.toFixed(1)} ms`);
    out(`  barrier                  ${us(barrier)} per call (mean of ${rounds}, driver mode)`);
    out(`  allGather ${(gatherBytes / 2 ** 20).toFixed(1)} MiB       ${gatherMs.toFixed(2)} ms, ${ok ? 'checked' : 'WRONG'}`);
    out(`  dispatch ${T} tokens/rank  ${dispatchMs.toFixed(2)} ms, ${(received / 2 ** 20).toFixed(1)} MiB received, ${(received / dispatchMs / 1e6).toFixed(2)} GB/s (driver mode, incl. thread hops)`);
    out(`  combine                  ${combineMs.toFixed(2)} ms`);
    if (!ok) throw new RankflowError('EINVAL', 'allGather returned wrong data');
  } finally {
    const x0 = performance.now();
    await group.destroy();
    out(`  destroy                  ${(performance.now() - x0).toFixed(1)} ms; states: ${group.snapshot().map((s) => s.state).join(', ')}`);
  }
}
