// The survivor processes of an elastic world agreeing on how they go on (actors/elastic.ts settle):
// one round is one survivors' exchange (world/live-exchange.ts) of what each process knows, its live
// mask and its ranks' numbers. Every process reads the same values, so every one decides alike: when
// all the masks are equal (and leave out the processes that gave nothing: lost), the round is agreed
// and each writes that mask at the largest numbers; otherwise each takes in the ranks the others saw
// leave (the intersection) and they go round again. Nothing that came over the socket is trusted:
// a value that is not a membership's ends the re-forming with EINVAL naming its process.
import { RankflowError } from './core/errors.js';
import type { Rendezvous } from './world/rendezvous.js';
import { isInt, isObject, who } from './world/protocol.js';

/** What one process gives in a round. The mask as hex: JSON has no 64-bit integers. */
interface Known { mask: string; seq: number; sessions: number; epoch: number; started: number }

const MAX_NUMBER = 2 ** 53;
const HEX_MASK = /^[0-9a-f]{1,16}$/;

/**
 * `started`: the group ops this process started. A process that learnt of the loss while its op k was
 * in flight had that op ended by the left word; one that learnt before starting op k holds it in
 * beforeOp: every process rejects op k (the largest count), so that all go on with op k + 1.
 */
export interface Position { live: boolean[]; seq: number; sessions: number; epoch: number; started: number }

/**
 * One round. `leave(g, cause)`: rank g, which this process thought alive, left (another process saw it
 * go). Resolves with the numbers to re-form at once every process knew the same mask, null when they
 * must go round again.
 */
export async function agreeOnMembership(
  rv: Rendezvous, mine: Position, leave: (g: number, cause: RankflowError) => void,
): Promise<{ seq: number; sessions: number; epoch: number; started: number } | null> {
  const mask = (live: boolean[]) => live.reduce((m, l, g) => (l ? m | (1n << BigInt(g)) : m), 0n);
  const values = await rv.exchangeAmongLive<Known>({ mask: mask(mine.live).toString(16), seq: mine.seq, sessions: mine.sessions, epoch: mine.epoch, started: mine.started });
  const world = mine.live.length;
  let common = mask(mine.live), agreed = true, seq = mine.seq, sessions = mine.sessions, epoch = mine.epoch, started = mine.started;
  const masks: Array<bigint | null> = values.map((v, i) => {
    const p = rv.peers[i]!;
    if (v === null) {
      for (let g = p.rankOffset; g < p.rankOffset + p.localRanks; g++) common &= ~(1n << BigInt(g));
      return null;
    }
    if (!isObject(v) || typeof v.mask !== 'string' || !HEX_MASK.test(v.mask) || !isInt(v.seq, 0, MAX_NUMBER) ||
        !isInt(v.sessions, 0, 2 ** 32 - 1) || !isInt(v.epoch, 0, MAX_NUMBER) || !isInt(v.started, 0, MAX_NUMBER) || BigInt(`0x${v.mask}`) >> BigInt(world) !== 0n)
      throw new RankflowError('EINVAL', `elastic world: ${who(p)} sent a value that is not a membership's in the survivors' exchange`, { rank: p.rankOffset });
    seq = Math.max(seq, v.seq);
    sessions = Math.max(sessions, v.sessions);
    epoch = Math.max(epoch, v.epoch);
    started = Math.max(started, v.started);
    const m = BigInt(`0x${v.mask}`);
    common &= m;
    return m;
  });
  for (const m of masks) if (m !== null && m !== common) agreed = false;
  for (let g = 0; g < world; g++) {
    if (!mine.live[g] || (common >> BigInt(g)) & 1n) continue;
    const from = rv.peers.find((p, i) => masks[i] === null && g >= p.rankOffset && g < p.rankOffset + p.localRanks);
    leave(g, new RankflowError('RANK_FAILED', from ? `rank ${g} is gone: its process left the world (${who(from)})` : `rank ${g} left: another process of the world saw it fail`, { rank: g }));
    agreed = false;
  }
  return agreed ? { seq, sessions, epoch, started } : null;
}
