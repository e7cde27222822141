// Rank program of test/gpu/moe.test.mjs: a dispatch without CPU sync (outputsInBuffer), then a cached
// dispatch of its handle that wants outputs of numRecv rows, which the CPU cannot size (the counts never
// reached it): EINVAL naming inputs.handle, on every rank, before anything moved. The rank stays usable:
// a cached dispatch of the same handle with outputsInBuffer and a barrier still run after it.
import { moeInput, deviceMoeInput } from '../moe-inputs.mjs';

export default async function (rank, { seed, tokens }) {
  const T = tokens[rank.rank];
  const a = deviceMoeInput(rank, moeInput(seed, rank.rank, T), T);
  const d = await rank.dispatch(a, { outputsInBuffer: true });
  let error = null;
  try {
    (await rank.dispatch({ x: a.x, handle: d.handle })).free();
  } catch (e) {
    error = { code: e.code, message: e.message };
  }
  const again = await rank.dispatch({ x: a.x, handle: d.handle }, { outputsInBuffer: true });
  await rank.barrier({ withCpuSync: true });
  for (const t of Object.values(a)) t.free();
  return { error, numRecv: d.numRecv, againNumRecv: again.numRecv };
}
