// Rank program of bench/call-profile.ts: `iters` calls of one op back to back (no sync between), for
// a CPU profile of what a call costs on the rank's thread. Returns µs per call. Ops: a cached dispatch
// with outputs in the buffer, one without a handle and without CPU sync, a combine, a barrier.
import type { RankProgramHandle } from '../../actors/index.js';

export interface CallLoopArgs { hidden: number; topk: number; experts: number; tokens: number; iters: number; op: 'dispatch' | 'dispatch-nosync' | 'combine' | 'barrier' }

export default async function callLoop(rank: RankProgramHandle<'cuda'>, a: CallLoopArgs): Promise<number> {
  const T = a.tokens;
  const idx = new Int32Array(T * a.topk);
  for (let t = 0; t < T; t++) for (let k = 0; k < a.topk; k++) idx[t * a.topk + k] = (t * 37 + k * 11) % a.experts;
  const x = rank.tensor('bf16', [T, a.hidden], new Uint16Array(T * a.hidden).fill(0x3f80));
  const topkIdx = rank.tensor('int32', [T, a.topk], idx);
  const topkWeights = rank.tensor('fp32', [T, a.topk], new Float32Array(T * a.topk).fill(1 / a.topk));
  const d0 = await rank.dispatch({ x, topkIdx, topkWeights });
  const cx = rank.tensor('bf16', [d0.numRecv!, a.hidden]);
  const once = a.op === 'dispatch' ? () => rank.dispatch({ x, handle: d0.handle }, { outputsInBuffer: true })
    : a.op === 'dispatch-nosync' ? () => rank.dispatch({ x, topkIdx, topkWeights }, { outputsInBuffer: true })
    : a.op === 'combine' ? async () => {
      const c = await rank.combine({ x: cx, handle: d0.handle });
      c.x.free();
      c.topkWeights.free();
    } : () => rank.barrier();
  for (let i = 0; i < 200; i++) await once();
  await rank.sync();
  const t0 = performance.now();
  for (let i = 0; i < a.iters; i++) {
    await once();
    if (i % 64 === 63) await rank.sync();  // keep the stream's queue short
  }
  await rank.sync();
  const us = ((performance.now() - t0) * 1e3) / a.iters;
  d0.free();
  for (const t of [x, topkIdx, topkWeights, cx]) t.free();
  return us;
}
