// Rank program of test/gpu/moe.test.mjs: rank 0's device topkIdx holds expert 999 (of 256), or the
// ids of `bad` ([slot, id] pairs). The program handle does not read device values; the notify kernel
// reports the first such slot, and the dispatch is EINVAL on the ranks that see it (the others'
// dispatch completes without those rows).
import { moeInput, deviceMoeInput } from '../moe-inputs.mjs';

export default async function (rank, { tokens, bad = [[3, 999]] }) {
  const T = Math.max(tokens[rank.rank], 1);
  const i = moeInput(21, rank.rank, T);
  if (rank.rank === 0) for (const [slot, id] of bad) i.topkIdx[slot] = id;
  const { x, topkIdx, topkWeights } = deviceMoeInput(rank, i, T);
  let result;
  try {
    const d = await rank.dispatch({ x, topkIdx, topkWeights });
    await rank.sync();
    result = { code: 'none', numRecv: d.numRecv };
    d.free();
  } catch (e) {
    result = { code: e.code, message: e.message };
  }
  for (const t of [x, topkIdx, topkWeights]) t.free();
  return result;
}
