// The checks of a rejoin of an elastic world (API.md "Elastic groups": a process started with
// world.rejoin takes a range that left back). The leader keeps its rendezvous listening after the
// table (leader.ts); a connection authenticates as any join does, then its join must name exactly
// the range of a process that was lost, in the same world, on the leader's node and host, with the
// leader's buffer configuration, while no other rejoin is in progress. Nothing that came over the
// socket is trusted. The table the rejoiner gets carries where it starts (RejoinedAt), checked on
// its side as strictly.
import { entryProblem, isInt, isObject, quote, who, type Incoming, type Join } from './protocol.js';
import type { RejoinedAt, RendezvousPeer } from './rendezvous.js';

const MAX_NUMBER = 2 ** 53;

/** Why the leader refuses this rejoin, or undefined. `lost`: the indices of the processes lost. */
export function rejoinProblem(m: Incoming, peers: readonly RendezvousPeer[], lost: ReadonlySet<number>, busy: boolean, worldSize: number, leaderIndex = 0): string | undefined {
  if (m.t === 'resume') return 'it resumes after a leader was lost, but this leader serves (it lost its connection, not the world its leader)';
  if (m.t !== 'join') return `it sent ${quote(m.t)} instead of a join`;
  if (m.rejoin !== true) return 'the world formed already: only a process started with world.rejoin may join it now, to take back a range that left';
  if (!isInt(m.worldSize, 1, 64)) return `worldSize ${quote(m.worldSize)} is not an integer in [1, 64]`;
  if (m.worldSize !== worldSize) return `world sizes disagree: the world has ${worldSize} ranks, the rejoiner says ${String(m.worldSize)}`;
  const problem = entryProblem(m, worldSize);
  if (problem) return problem;
  const j = m as unknown as Join;
  const index = peers.findIndex((p) => p.rankOffset === j.rankOffset);
  const was = peers[index];
  if (was === undefined || was.localRanks !== j.localRanks)
    return `ranks [${j.rankOffset}, ${j.rankOffset + j.localRanks}) are not the range of one process of the world (its processes: ${peers.map(who).join(', ')})`;
  if (!lost.has(index)) return `${who(was)} serves: a rejoin takes back a range whose process was lost`;
  if (busy) return 'another rejoin is in progress: one at a time';
  const leader = peers[leaderIndex]!;
  if (j.hostId !== leader.hostId || j.nodeId !== leader.nodeId)
    return `it runs on ${j.hostId} (node ${j.nodeId}), the world on ${leader.hostId} (node ${leader.nodeId}): an elastic world's processes share memory, on one host`;
  if (!isObject(j.payload) || j.payload.config !== leader.payload.config || j.payload.withHost !== leader.payload.withHost)
    return "its buffer (or backend, or ranksPerNode) differs from the world's";
  return undefined;
}

/** What is wrong with the `rejoined` of a table, or undefined. */
export function rejoinedProblem(r: unknown, worldSize: number): string | undefined {
  if (!isObject(r)) return 'rejoined is not an object';
  if (typeof r.mask !== 'string' || !/^[0-9a-f]{1,16}$/.test(r.mask) || BigInt(`0x${r.mask}`) >> BigInt(worldSize) !== 0n) return `rejoined.mask ${quote(r.mask)} is not a mask of the world`;
  for (const k of ['epoch', 'seq', 'started', 'liveSeq', 'joinSeq'] as const) if (!isInt(r[k], 0, MAX_NUMBER)) return `rejoined.${k} ${quote(r[k])} is not a count`;
  if (!isInt(r.sessions, 0, 2 ** 32 - 1)) return `rejoined.sessions ${quote(r.sessions)} is not a count`;
  if (r.leader !== undefined && !isInt(r.leader, 0, worldSize - 1)) return `rejoined.leader ${quote(r.leader)} is not a process index`;
  return undefined;
}

/** Only the fields of a checked RejoinedAt. */
export function toRejoined(r: Record<string, unknown>): RejoinedAt {
  const { mask, epoch, sessions, seq, started, liveSeq, joinSeq, leader } = r as unknown as RejoinedAt;
  return { mask, epoch, sessions, seq, started, liveSeq, joinSeq, ...(leader !== undefined ? { leader } : {}) };
}
