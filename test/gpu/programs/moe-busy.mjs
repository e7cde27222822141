// Rank program of test/gpu/moe.test.mjs: rank 0 fills all but `freeSms` SMs of the GPU with a kernel
// that spins for `busyMs` on a stream of its own (on distinct GPUs every rank fills its own). Then,
// while it runs: (1) a dispatch and a combine with grids that fit the free SMs (numSms: the ranks
// sharing the GPU split them), which must finish long before the busy kernel; (2) the same with the
// default grids, which are launched cooperatively: they may wait for SMs, but never deadlock or time
// out (the group runs with gpuSeconds shorter than busyMs). Both are read back for the test to check.
import { MOE_BUFFER, combineInput, moeInput, deviceMoeInput } from '../moe-inputs.mjs';

const host = (t) => t.toHost().data;

export default async function (rank, { seed, tokens, busyMs, freeSms = 8 }) {
  const T = tokens[rank.rank];
  const { hidden } = MOE_BUFFER;
  const { sms, smShare } = rank.info().device;
  const shared = smShare < sms;
  const busySms = Math.max(0, sms - freeSms);
  const numSms = Math.max(1, Math.floor(freeSms / (shared ? rank.worldSize : 1)));
  const inp = moeInput(seed, rank.rank, T);
  const { x, topkIdx, topkWeights } = deviceMoeInput(rank, inp, T);
  await rank.barrier();
  if (!shared || rank.rank === 0) rank.occupySms(busySms, busyMs);
  await new Promise((r) => setTimeout(r, 100));  // the busy kernel is resident
  await rank.barrier();
  const round = async (opts) => {
    const t0 = performance.now();
    const d = await rank.dispatch({ x, topkIdx, topkWeights }, opts);
    const R = d.numRecv;
    const cx = rank.tensor('bf16', [R, hidden], combineInput(seed, rank.rank, R).x);
    const c = await rank.combine({ x: cx, handle: d.handle }, opts);
    await rank.sync();
    const ms = performance.now() - t0;
    const out = { ms, x: host(d.x), combineX: host(c.x) };
    for (const t of [cx, c.x, c.topkWeights]) t.free();
    d.free();
    return out;
  };
  const fitted = await round({ numSms });
  const plain = await round({});
  for (const t of [x, topkIdx, topkWeights]) t.free();
  return { sms, busySms, numSms, fitted, plain };
}
