// Rank program: allGather of a device tensor (test/gpu/helpers.mjs pattern, round 7) into a device
// tensor; returns the gathered bytes.
import { pattern } from '../helpers.mjs';

export default async function (rank, { shape }) {
  const mine = pattern('bf16', shape, rank.rank, 7);
  const x = rank.tensor('bf16', shape, mine.data);
  const g = await rank.allGather(x);
  if (!g.device || g.shape[0] !== shape[0] * rank.worldSize) throw new Error(`allGather of a device tensor gave ${JSON.stringify(g.shape)}`);
  const bytes = g.toHost().data;
  x.free();
  g.free();
  return new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}
