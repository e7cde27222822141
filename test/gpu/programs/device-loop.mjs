// Rank program of test/gpu/release.test.mjs: `iters` steps of a cached dispatch with outputs in the
// buffer and a combine of device tensors, none with a CPU sync (kernels queue on the rank's stream
// and wait there for their peers); at step `at` rank `who` throws a TypeError, so its peers' queued
// kernels wait for signals that never come until the run's release reaches them.
import { MOE_BUFFER, combineInput, deviceMoeInput, moeInput } from '../moe-inputs.mjs';

export default async function deviceLoop(rank, { iters, at, who, seed = 5 }) {
  const T = 64;
  const { x, topkIdx, topkWeights } = deviceMoeInput(rank, moeInput(seed, rank.rank, T), T);
  const first = await rank.dispatch({ x, topkIdx, topkWeights });
  const R = first.numRecv;
  const cx = rank.tensor('bf16', [R, MOE_BUFFER.hidden], combineInput(seed, rank.rank, R).x);
  for (let i = 0; i < iters; i++) {
    if (i === at && rank.rank === who) throw new TypeError(`boom at ${performance.timeOrigin + performance.now()}`);
    await rank.dispatch({ x, handle: first.handle }, { outputsInBuffer: true });
    const c = await rank.combine({ x: cx, handle: first.handle });
    c.x.free();
    c.topkWeights.free();
  }
  await rank.sync();
  return 'done';
}
