// Rank program of test/gpu/moe.test.mjs: two dispatches A and B; then rank 0 replays A's handle while
// the others replay B's. The kernels see the layouts' fingerprints differ and refuse the rows: each
// rank reports what it got (EINVAL naming inputs.handle), on the dispatch or at the next sync.
import { moeInput, deviceMoeInput } from '../moe-inputs.mjs';

export default async function (rank, { seed, tokens }) {
  const T = tokens[rank.rank];
  const make = (s) => {
    return deviceMoeInput(rank, moeInput(s, rank.rank, T), T);
  };
  const a = make(seed), b = make(seed + 100);
  const da = await rank.dispatch(a);
  const db = await rank.dispatch(b);
  let error = null;
  try {
    const k = await rank.dispatch({ x: a.x, handle: rank.rank === 0 ? da.handle : db.handle }, { outputsInBuffer: true });
    await rank.sync();
    k.free();
  } catch (e) {
    error = { code: e.code, message: e.message };
  }
  for (const t of [...Object.values(a), ...Object.values(b)]) t.free();
  da.free();
  db.free();
  return error ?? { code: 'none', message: 'the mismatched handles were not noticed' };
}
