// An elastic group's membership as a rank's op table reads it (the live ranks the main thread last
// told it: workers/protocol.ts Membership): the ops that need every rank refuse while ranks are
// missing, and an engram fetch refuses an entry whose rank left. Both refuse before the machine
// moves: nothing runs, the rank stays ready.
import { RankflowError } from '../../actors/core/errors.js';
import type { Membership } from '../protocol.js';

/** Whether every rank of the group serves (always, outside elastic groups). */
export const whole = (m: Membership | null, worldSize: number): boolean => m === null || m.live.length === worldSize;

/** The first rank that left (m is degraded). */
const firstGone = (m: Membership, worldSize: number): number => {
  for (let r = 0; r < worldSize; r++) if (!m.live.includes(r)) return r;
  return -1;
};

/** RANK_FAILED for `op`, which needs every rank (a ring, a reduction over all, a session's regions), while ranks are missing. */
export function refuseDegraded(m: Membership | null, worldSize: number, op: string): void {
  if (whole(m, worldSize)) return;
  const gone = firstGone(m!, worldSize);
  throw new RankflowError('RANK_FAILED', `${op}: rank ${gone} left the group and ${op} needs every rank; ` +
    `it runs again once the group is 'ready' (group.replaceRank(${gone}))`, { rank: gone, state: 'ready' });
}

/** RANK_FAILED naming the rank and the index of the first entry in `ids` whose rank left (entries per rank: `entries`). */
export function checkLiveOwners(m: Membership | null, worldSize: number, entries: number, ids: Int32Array): void {
  if (whole(m, worldSize) || entries <= 0) return;
  const live = new Uint8Array(worldSize);
  for (const r of m!.live) live[r] = 1;
  for (let i = 0; i < ids.length; i++) {
    const owner = Math.floor(ids[i]! / entries);
    if (owner >= 0 && owner < worldSize && live[owner] === 0)
      throw new RankflowError('RANK_FAILED', `engramFetch: indices[${i}] = ${ids[i]} is an entry of rank ${owner}, which left the group`, { rank: owner });
  }
}
