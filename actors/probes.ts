// The layout probes of tests (group.writePeer, readWindow, info): a rank's window bytes, written
// through its translated pointer into a peer's or read from its own, and what it says of itself.
import { RankflowError, invalid } from './core/errors.js';
import { checkIntIn, describe } from './core/validate.js';
import type { Ranks } from './ranks.js';

/** What a probe needs of the group. */
export interface ProbeSite {
  size: number;
  worldSize: number;
  rankOffset: number;
  symmetricBytes: number;
  destroyed: boolean;
  workers: Ranks;
}

/** A probe names a local rank of a group that is not destroyed. */
function checkProbe(g: ProbeSite, name: string, rank: unknown): void {
  checkIntIn(name, rank, 0, g.size - 1);
  if (g.destroyed) throw new RankflowError('STATE', 'the group is destroyed', { rank: g.rankOffset + (rank as number), state: 'destroyed' });
}

/** `bytes` through local rank `from`'s translated pointer into global rank `to`'s window at `offset` (within [0, symmetricBytes - bytes.length]). */
export async function writePeer(g: ProbeSite, from: number, to: number, offset: number, bytes: Uint8Array): Promise<bigint> {
  checkProbe(g, 'from', from);
  checkIntIn('to', to, 0, g.worldSize - 1);
  if (!(bytes instanceof Uint8Array)) throw invalid('bytes', `must be a Uint8Array (got ${describe(bytes)})`);
  checkIntIn('offset', offset, 0, Math.max(0, g.symmetricBytes - bytes.length));
  if (bytes.length > g.symmetricBytes) throw invalid('bytes', `has ${bytes.length} bytes; the symmetric segment has ${g.symmetricBytes}`);
  return g.workers.call(from, (api) => api.writePeer(to, offset, bytes));
}

/** `length` bytes of local rank `rank`'s own window from `offset`. */
export async function readWindow(g: ProbeSite, rank: number, offset: number, length: number): Promise<Uint8Array> {
  checkProbe(g, 'rank', rank);
  checkIntIn('offset', offset, 0, g.symmetricBytes);
  checkIntIn('length', length, 0, g.symmetricBytes - offset);
  return g.workers.call(rank, (api) => api.readWindow(offset, length));
}

/** What local rank `rank` says of itself: memory kind, windows, domains, seq, state. */
export async function rankInfo(g: ProbeSite, rank: number) {
  checkProbe(g, 'rank', rank);
  return g.workers.call(rank, (api) => api.info());
}
