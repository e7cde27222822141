// Rank program of test/gpu/moe.test.mjs: rank 0's device topkIdx holds expert 999 (of 256), or the
// ids of `bad` ([slot, id] pairs). The program handle does not read device values; the notify kernel
// reports the first such slot, and the dispatch is EINVAL on the ranks that see it (the others'
// dispatch completes without those rows). noSync: the dispatch has no CPU sync and its outputs stay
// in the buffer (one kernel, rf_dispatch_fused); the report comes with the rank's next wait
// (rank.sync()). `fused`: the rank's fused dispatches during the op.
import { moeInput, deviceMoeInput } from '../moe-inputs.mjs';

export default async function (rank, { tokens, bad = [[3, 999]], noSync = false }) {
  const T = Math.max(tokens[rank.rank], 1);
  const i = moeInput(21, rank.rank, T);
  if (rank.rank === 0) for (const [slot, id] of bad) i.topkIdx[slot] = id;
  const { x, topkIdx, topkWeights } = deviceMoeInput(rank, i, T);
  const fusedBefore = (await rank.info()).device.fusedDispatches;
  let result;
  try {
    const d = await rank.dispatch({ x, topkIdx, topkWeights }, noSync ? { outputsInBuffer: true } : {});
    await rank.sync();
    result = { code: 'none', numRecv: d.numRecv };
    d.free();
  } catch (e) {
    result = { code: e.code, message: e.message };
  }
  result.fused = (await rank.info()).device.fusedDispatches - fusedBefore;
  for (const t of [x, topkIdx, topkWeights]) t.free();
  return result;
}
