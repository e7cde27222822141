// A range taken back by a rejoining process, in an elastic world (API.md "Elastic groups"; the
// leader admits it: world/rejoin.ts). Every survivor process must take it in at the same point of its
// stream of group ops: each says how many it started (the rejoins' survivors' exchange), they hold
// new ops until the largest count is known, run up to it, and take the rejoiner in before the next
// (Membership.beforeOp). The join itself, at that point in every survivor: the numbers (the largest
// sequence number and session count, the next epoch) agreed through the exchange; the leader sends
// the rejoiner its table with them; the survivors and the rejoiner pass each other their windows' fds
// (SCM_RIGHTS, as at formation); every survivor rank maps the rejoiner's windows over the old ones
// and barriers with its ranks, which register at the same numbers (ops/membership.cc rejoin).
import { createHash } from 'node:crypto';

import { RankflowError } from './core/errors.js';
import { loadAddon, type ExportedSegments } from './core/addon.js';
import { isInt, isObject, who } from './world/protocol.js';
import { payloadOf } from './world/join.js';
import type { ElasticRendezvous, RejoinedAt, Rejoining, RendezvousPeer } from './world/rendezvous.js';
import type { Membership as Told } from '../workers/protocol.js';
import type { Ranks } from './ranks.js';

const MAX_NUMBER = 2 ** 53;
const hex = (m: bigint): string => m.toString(16);
type Segments = { deviceFd: number; hostFd: number };

/** A rejoin in progress, as each survivor process follows it. */
export interface Joining extends Rejoining {
  /** the count of group ops at which every survivor takes it in (undefined: not agreed yet) */
  at?: number;
  /** settles once `at` is known, or the rejoin ended */
  agreed: Promise<void>;
  settled: () => void;
  /** why it ended without the rejoiner, if it did */
  ended?: string;
  /** rejects once it ended: the join's waits (fds, exchanges) end with it */
  gone: Promise<never>;
}

/** What the join needs of the membership (actors/elastic.ts). */
export interface JoinSite {
  rv: ElasticRendezvous;
  ranks: Ranks;
  live: boolean[];
  epoch: number;
  started: number;
  locals(): number[];
  told(live: boolean[], epoch: number, sessions: number): Told;
  timeoutMs: number;
}

/** The largest count of group ops the survivors gave (each its own, for this rejoin). */
export async function agreeOnJoinPoint(rv: ElasticRendezvous, started: number): Promise<number> {
  const values = await rv.exchangeJoin({ at: started });
  let at = started;
  values.forEach((v, i) => {
    if (v === null) return;
    if (!isObject(v) || !isInt(v.at, 0, MAX_NUMBER)) throw new RankflowError('EINVAL', `elastic world: ${who(rv.peers[i]!)} sent a count that is not one for a rejoin`);
    at = Math.max(at, v.at);
  });
  return at;
}

/** The ranks of the rejoining process. */
export const rangeOf = (p: RendezvousPeer): number[] => Array.from({ length: p.localRanks }, (_, i) => p.rankOffset + i);

/** The join, in one survivor process (its ops all done up to the agreed point); resolves with the membership written. */
export async function join(s: JoinSite, j: Joining): Promise<Told> {
  const locals = s.locals();
  const at = await Promise.all(locals.map((r) => s.ranks.call(r, (api) => api.position())));
  const mask = s.live.reduce((m, l, g) => (l ? m | (1n << BigInt(g)) : m), 0n);
  const cut = <T>(p: Promise<T>): Promise<T> => Promise.race([p, j.gone]);
  // Ended while the positions came: its round may be over (a later rejoin's exchanges start there), so it opens none.
  if (j.ended) throw new RankflowError('RANK_FAILED', `the rejoin of ${who(j.peer)} ended: ${j.ended}`, { rank: j.peer.rankOffset });
  const values = await cut(s.rv.exchangeJoin({ seq: Math.max(0, ...at.map((p) => p.seq)), sessions: Math.max(0, ...at.map((p) => p.sessions)), epoch: s.epoch, mask: hex(mask) }));
  let seq = 0, sessions = 0, epoch = 0;
  values.forEach((v, i) => {
    if (v === null) return;
    if (!isObject(v) || !isInt(v.seq, 0, MAX_NUMBER) || !isInt(v.sessions, 0, 2 ** 32 - 1) || !isInt(v.epoch, 0, MAX_NUMBER) || v.mask !== hex(mask))
      throw new RankflowError('RANK_FAILED', `elastic world: ${who(s.rv.peers[i]!)} is not in the membership this process is in (a rank left meanwhile?): the rejoin is abandoned`);
    seq = Math.max(seq, v.seq);
    sessions = Math.max(sessions, v.sessions);
    epoch = Math.max(epoch, v.epoch);
  });
  if (j.ended) throw new RankflowError('RANK_FAILED', `the rejoin of ${who(j.peer)} ended: ${j.ended}`, { rank: j.peer.rankOffset });
  const range = rangeOf(j.peer);
  const told = s.told(s.live.map((l, g) => l || range.includes(g)), epoch + 1, sessions);
  s.rv.admitRejoin?.({ mask: hex(told.mask), epoch: told.epoch, sessions, seq, started: s.started });
  const mine = await Promise.all(locals.map((r) => s.ranks.call(r, (api) => api.exported())));
  const swapping = swapSegments(s.rv, j.peer, mine, s.timeoutMs, j.gone);
  swapping.then((r) => j.ended !== undefined && loadAddon().closeFds(r.fds), () => {});  // fds that come after the join ended
  const received = await cut(swapping);
  try {
    await Promise.all(locals.map((r) => s.ranks.call(r, (api) => api.rejoin(range, received.segments, told))));
  } finally {
    loadAddon().closeFds(received.fds);  // mapped by every local rank now (or never will be)
  }
  return told;
}

/**
 * A survivor's fd socket for the join after `joins` rejoins' exchanges: its world's name with another
 * suffix, which the rejoiner derives alike. Not the formation's, and one per join: a join that ended
 * cancels its server (swapSegments), but a name of its own never meets a server still closing.
 */
export function joinSocket(fdSocket: string, joins: number): string {
  return `${fdSocket.slice(0, fdSocket.lastIndexOf('-'))}-${createHash('sha256').update(`${fdSocket}:${joins}`).digest('hex').slice(0, 8)}`;
}

/**
 * This survivor process's windows to the rejoiner, its windows from it (fds over a Unix socket, served
 * to its pid only). A join that ends (`gone`) ends the server and the fetch too, rather than leaving them to their timeout.
 */
async function swapSegments(rv: ElasticRendezvous, joiner: RendezvousPeer, mine: ExportedSegments[], timeoutMs: number, gone: Promise<never>) {
  const addon = loadAddon();
  const me = payloadOf(rv.peers[rv.self]!), theirs = payloadOf(joiner);
  const withHost = me.withHost;
  const socket = joinSocket(me.fdSocket, rv.joinsAt);
  const serving = addon.fdServe(socket, [...mine.map((e) => e.deviceFd), ...(withHost ? mine.map((e) => e.hostFd) : [])], [joiner.pid], timeoutMs);
  serving.catch(() => {});
  gone.catch(() => (addon.fdCancel(socket), addon.fdCancel(theirs.fdSocket)));
  const fds = await addon.fdFetch(theirs.fdSocket, timeoutMs, joiner.pid);
  try {
    const n = joiner.localRanks;
    if (fds.length !== n * (withHost ? 2 : 1)) throw new RankflowError('EINVAL', `elastic world: the rejoining ${who(joiner)} passed ${fds.length} fds, not ${n * (withHost ? 2 : 1)}`);
    await serving;
    return { fds, segments: Array.from({ length: n }, (_, i) => ({ deviceFd: fds[i]!, hostFd: withHost ? fds[n + i]! : -1 })) };
  } catch (e) {
    addon.closeFds(fds);
    throw e;
  }
}

/**
 * The rejoiner's side (actors/startup.ts): its ranks' windows to every survivor process of its node
 * and theirs from each (the windows of the ranks that serve, in rank order); -1 for the others. A
 * rejoin that ends first (`gone`: the survivors end the join) cancels its server and fetches, and
 * starts no other: nobody serves or fetches for it any more.
 */
export async function rejoinSegments(rv: ElasticRendezvous, at: RejoinedAt, local: ExportedSegments[], timeoutMs: number,
  gone: Promise<never>): Promise<{ peers: Segments[]; received: number[] }> {
  const addon = loadAddon();
  const me = payloadOf(rv.peers[rv.self]!), mask = BigInt(`0x${at.mask}`), withHost = me.withHost;
  const serves = (g: number) => ((mask >> BigInt(g)) & 1n) === 1n;
  const W = rv.peers.reduce((n, p) => n + p.localRanks, 0);
  const peers: Segments[] = Array.from({ length: W }, () => ({ deviceFd: -1, hostFd: -1 }));
  local.forEach((e, i) => { peers[rv.peers[rv.self]!.rankOffset + i] = { deviceFd: e.deviceFd, hostFd: e.hostFd }; });
  const others = rv.peers.filter((p, i) => i !== rv.self && rangeOf(p).some(serves));
  const serving = addon.fdServe(me.fdSocket, [...local.map((e) => e.deviceFd), ...(withHost ? local.map((e) => e.hostFd) : [])], others.map((p) => p.pid), timeoutMs);
  serving.catch(() => {});
  let ended: unknown;
  gone.catch((e: unknown) => {
    ended = e;
    addon.fdCancel(me.fdSocket);
    for (const p of others) addon.fdCancel(joinSocket(payloadOf(p).fdSocket, at.joinSeq));
  });
  const received: number[] = [];
  try {
    for (const p of others) {
      if (ended !== undefined) throw ended;
      const live = rangeOf(p).filter(serves);
      const fds = await addon.fdFetch(joinSocket(payloadOf(p).fdSocket, at.joinSeq), timeoutMs, p.pid);
      received.push(...fds);
      if (fds.length !== live.length * (withHost ? 2 : 1)) throw new RankflowError('EINVAL', `elastic world: ${who(p)} passed ${fds.length} fds, not ${live.length * (withHost ? 2 : 1)}`);
      live.forEach((g, i) => { peers[g] = { deviceFd: fds[i]!, hostFd: withHost ? fds[live.length + i]! : -1 }; });
    }
    await serving;
    return { peers, received };
  } catch (e) {
    addon.closeFds(received);
    throw e;
  }
}
