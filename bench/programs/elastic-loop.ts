// Rank program of bench/elastic.ts: `iters` rounds of dispatch + combine (returning the received rows),
// each started by a barrier so that the ranks time the same collective; the routing is the same on
// every group of a comparison (seeded by the rank), and the ranks of `masked` are treated as gone the
// way an elastic group treats a rank that left: their experts' slots are -1 and they send no token.
import type { RankProgramHandle } from '../../actors/index.js';

export interface ElasticLoopArgs { tokens: number; hidden: number; topk: number; experts: number; iters: number; warmup: number; seed: number; masked: number[] }
/** ms per round (dispatch + combine), this rank's */
export interface ElasticLoopResult { rank: number; ms: number[]; maskedSlots: number }

function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296);
}

export default async function elasticLoop(rank: RankProgramHandle<'host'>, a: ElasticLoopArgs): Promise<ElasticLoopResult> {
  const rng = lcg(a.seed + rank.rank * 7919);
  const perRank = a.experts / rank.worldSize;
  const tokens = a.masked.includes(rank.rank) ? 0 : a.tokens;
  const x = rank.tensor('bf16', [tokens, a.hidden]);
  for (let i = 0; i < x.data.length; i++) x.data[i] = 0x3f80 + (i % 64);
  const topkIdx = new Int32Array(tokens * a.topk);
  const topkWeights = new Float32Array(tokens * a.topk).fill(1 / a.topk);
  for (let t = 0; t < tokens; t++) {
    const picked = new Set<number>();
    while (picked.size < a.topk) picked.add(Math.floor(rng() * a.experts));
    [...picked].forEach((e, k) => (topkIdx[t * a.topk + k] = a.masked.includes(Math.floor(e / perRank)) ? -1 : e));
  }
  const out: ElasticLoopResult = { rank: rank.rank, ms: [], maskedSlots: 0 };
  for (let i = 0; i < a.warmup + a.iters; i++) {
    await rank.barrier();
    const t0 = performance.now();
    const d = await rank.dispatch({ x, topkIdx, topkWeights });
    await rank.combine({ x: d.x, handle: d.handle });
    if (i >= a.warmup) out.ms.push(performance.now() - t0);
    out.maskedSlots = d.maskedSlots ?? 0;
  }
  return out;
}
