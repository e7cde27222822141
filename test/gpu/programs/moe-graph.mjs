// Rank program of test/gpu/moe.test.mjs: CUDA graphs of no-CPU-sync ops. g1 records a cached dispatch
// with its outputs in the buffer; g2 a cached dispatch, a combine of it and a barrier (the combine's
// region of the buffer overlaps the dispatch's, so the dispatch outputs are read after g1). Each is
// replayed `replays` times, read back after each replay; then a plain cached dispatch runs after them.
import { MOE_BUFFER, combineInput, moeInput, deviceMoeInput } from '../moe-inputs.mjs';

const host = (t) => t.toHost().data;

export default async function (rank, { seed, tokens, replays }) {
  const T = tokens[rank.rank];
  const { hidden } = MOE_BUFFER;
  const inp = moeInput(seed, rank.rank, T);
  const { x, topkIdx, topkWeights } = deviceMoeInput(rank, inp, T);
  const d = await rank.dispatch({ x, topkIdx, topkWeights });
  const R = d.numRecv;
  const x2 = rank.tensor('bf16', [T, hidden], moeInput(seed + 1, rank.rank, T).x);
  const cx = rank.tensor('bf16', [R, hidden], combineInput(seed, rank.rank, R).x);

  let view;
  const g1 = await rank.capture(async () => {
    view = await rank.dispatch({ x: x2, handle: d.handle }, { outputsInBuffer: true });
  });
  let combined;
  const g2 = await rank.capture(async () => {
    const k = await rank.dispatch({ x: x2, handle: d.handle }, { outputsInBuffer: true });
    combined = await rank.combine({ x: cx, handle: k.handle });
    await rank.barrier();
  });
  const seqBefore = rank.seq;
  const replayed = [];
  for (let i = 0; i < replays; i++) {
    await g1.replay();
    await rank.sync();
    const xr = host(view.x).slice(0, R * hidden);
    await g2.replay();
    await rank.sync();
    replayed.push({ x: xr, combineX: host(combined.x) });
  }
  const seqAfter = rank.seq;
  g1.free();
  g2.free();
  const a = await rank.dispatch({ x: x2, handle: d.handle });
  const after = { x: host(a.x) };
  for (const t of [x, topkIdx, topkWeights, x2, cx]) t.free();
  d.free();
  a.free();
  return { ops: [g1.ops, g2.ops], seqBefore, seqAfter, replayed, after };
}
