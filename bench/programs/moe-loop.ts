// Rank program of the host benchmark: each rank makes its own routing, then times `iters` rounds of
// dispatch, combine (returning the received rows) and a plain memcpy (TypedArray.set) of the same
// bytes, each round started by a barrier so that ranks measure the same collective.
import type { RankProgramHandle } from '../../actors/index.js';

export interface MoeLoopArgs {
  tokens: number;
  hidden: number;
  topk: number;
  experts: number;
  iters: number;
  warmup: number;
  seed: number;
}

export interface MoeLoopResult {
  rank: number;
  recvTokens: number;
  /** bytes this rank receives per dispatch (rows, local ones included): DeepEP's dispatch bytes */
  bytes: number;
  dispatchMs: number[];
  combineMs: number[];
  memcpyMs: number[];
}

function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296);
}

export default async function moeLoop(rank: RankProgramHandle<'host'>, a: MoeLoopArgs): Promise<MoeLoopResult> {
  const rng = lcg(a.seed + rank.rank * 7919);
  const x = rank.tensor('bf16', [a.tokens, a.hidden]);
  for (let i = 0; i < x.data.length; i++) x.data[i] = 0x3f80 + (i % 64);
  const topkIdx = new Int32Array(a.tokens * a.topk);
  const topkWeights = new Float32Array(a.tokens * a.topk).fill(1 / a.topk);
  for (let t = 0; t < a.tokens; t++) {
    const picked = new Set<number>();
    while (picked.size < a.topk) picked.add(Math.floor(rng() * a.experts));
    [...picked].forEach((e, k) => (topkIdx[t * a.topk + k] = e));
  }
  const out: MoeLoopResult = { rank: rank.rank, recvTokens: 0, bytes: 0, dispatchMs: [], combineMs: [], memcpyMs: [] };
  let src = new Uint8Array(0);
  let dst = new Uint8Array(0);
  for (let i = 0; i < a.warmup + a.iters; i++) {
    await rank.barrier();
    const t0 = performance.now();
    const d = await rank.dispatch({ x, topkIdx, topkWeights });
    const t1 = performance.now();
    await rank.combine({ x: d.x, handle: d.handle });
    const t2 = performance.now();
    if (src.length !== d.x.data.byteLength) {
      src = new Uint8Array(d.x.data.byteLength).fill(1);
      dst = new Uint8Array(d.x.data.byteLength);
    }
    await rank.barrier();
    const t3 = performance.now();
    dst.set(src);
    const t4 = performance.now();
    if (i < a.warmup) continue;
    out.recvTokens = d.x.shape[0]!;
    out.bytes = d.x.data.byteLength;
    out.dispatchMs.push(t1 - t0);
    out.combineMs.push(t2 - t1);
    out.memcpyMs.push(t4 - t3);
  }
  return out;
}
