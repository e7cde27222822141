// The rendezvous wire protocol: the messages, the limits on what a peer may send, the checks that
// every message coming over a socket passes before anything acts on it, and the helpers that name
// processes and rank ranges in messages. A socket is never trusted, not even an authenticated one:
// a member with a bug must be dropped with a reason, not crash or stall the others.
import { RankflowError, type RankflowErrorCode } from '../core/errors.js';
import type { RejoinedAt, RunRelease, RankFailure, RendezvousPeer } from './rendezvous.js';

export const PROTOCOL = 'rankflow-rendezvous/2';

export const LIMITS = {
  /** Bytes a connection may send before it has authenticated: the auth line is ~200 bytes. */
  unauthenticatedBytes: 8 << 10,
  /** One line after authentication: a table of 64 processes with full payloads is ~1.1 MiB. */
  lineBytes: 4 << 20,
  /** A process's payload, as JSON. */
  payloadBytes: 16 << 10,
  /** Connections accepted but not yet joined; one more evicts the oldest (see leader.ts). */
  pendingConnections: 32,
  /** From accept to a valid join; a legitimate follower needs one round trip, and retries anyway. */
  joinDeadlineMs: 5000,
  /** nodeId and hostId, in characters. */
  idChars: 256,
  hostIdChars: 1024,
  /** Error messages and reasons, in characters. */
  textChars: 64 << 10,
} as const;

export type Range = [start: number, end: number];

/** A process's join: who it is and what it brings. */
export interface Join {
  t: 'join';
  worldSize: number;
  rankOffset: number;
  localRanks: number;
  payload: Record<string, unknown>;
  hostId: string;
  nodeId: string;
  pid: number;
  /** an elastic world's process taking a range that left back (world.rejoin; actors/world/rejoin.ts) */
  rejoin?: true;
}

export type Message =
  | { t: 'challenge'; proto: string; nonce: string }
  | { t: 'auth'; proto: string; nonce: string; mac: string }
  | { t: 'proof'; mac: string }
  | { t: 'denied' }
  | Join
  | { t: 'status'; missing: Range[]; refused: string[] }
  | { t: 'wait'; reason: string }
  | { t: 'table'; peers: RendezvousPeer[]; rejoined?: RejoinedAt }
  | { t: 'error'; code: RankflowErrorCode; message: string; rank?: number }
  | { t: 'x'; seq: number; value: unknown }
  | { t: 'xall'; seq: number; values: unknown[] }
  | { t: 'xerr'; seq: number; code: RankflowErrorCode; message: string; rank?: number }
  | { t: 'lost'; index: number; reason: string }
  | { t: 'failed'; from: number; failure: RankFailure }
  | { t: 'released'; from: number; release: RunRelease }
  | { t: 'lx'; seq: number; value: unknown }
  | { t: 'lxall'; seq: number; values: unknown[] }
  | { t: 'jx'; seq: number; value: unknown }
  | { t: 'jxall'; seq: number; values: unknown[] }
  | { t: 'rx'; seq: number; value: unknown }
  | { t: 'rxhit'; seq: number }
  | { t: 'rxall'; seq: number; values: unknown[] }
  | { t: 'rxcut'; seq: number }
  | { t: 'rejoining'; index: number; peer: RendezvousPeer; joinSeq: number }
  | { t: 'revived'; index: number }
  | { t: 'rejoinEnded'; index: number; reason: string }
  | { t: 'resume'; worldSize: number; rankOffset: number; localRanks: number; pid: number; hostId: string; nodeId: string; lost: number[]; live: unknown; joins: unknown; runs: unknown }
  | { t: 'resumed'; leader: number; pid: number; lost: number[] }
  | { t: 'bye' };

/** What a Channel delivers: a JSON object with a string `t`, and nothing else known yet. */
export type Incoming = { t: string; [field: string]: unknown };

// ---------------------------------------------------------------------------------------------
// Checks. Each returns what is wrong (for the log and the peer), or undefined.

const CODES: ReadonlySet<string> = new Set(['EINVAL', 'TIMEOUT_CPU', 'TIMEOUT_GPU', 'RANK_FAILED', 'BACKEND_UNAVAILABLE', 'STATE']);

export const isInt = (v: unknown, min: number, max: number): v is number => Number.isInteger(v) && (v as number) >= min && (v as number) <= max;
export const isText = (v: unknown, maxChars: number): v is string => typeof v === 'string' && v.length <= maxChars;
export const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
export const isCode = (v: unknown): v is RankflowErrorCode => typeof v === 'string' && CODES.has(v);

/** A short, safe rendering of a value that came over a socket, for messages. */
export function quote(v: unknown): string {
  let s: string;
  try {
    s = JSON.stringify(v) ?? String(v);
  } catch {
    s = String(v);
  }
  return s.length > 40 ? `${s.slice(0, 37)}...` : s;
}

/** A process's entry (its join, or its row of the table) within a world of `worldSize`. */
export function entryProblem(e: Record<string, unknown>, worldSize: number): string | undefined {
  if (!isInt(e.rankOffset, 0, worldSize - 1)) return `rankOffset ${quote(e.rankOffset)} is not an integer in [0, ${worldSize})`;
  if (!isInt(e.localRanks, 1, worldSize - e.rankOffset)) return `localRanks ${quote(e.localRanks)} is not an integer in [1, ${worldSize - e.rankOffset}]`;
  if (!isInt(e.pid, 1, 2 ** 31 - 1)) return `pid ${quote(e.pid)} is not a pid`;
  if (!isText(e.hostId, LIMITS.hostIdChars) || e.hostId === '') return `hostId ${quote(e.hostId)} is not a string of 1 to ${LIMITS.hostIdChars} characters`;
  if (!isText(e.nodeId, LIMITS.idChars) || e.nodeId === '') return `nodeId ${quote(e.nodeId)} is not a string of 1 to ${LIMITS.idChars} characters`;
  if (!isObject(e.payload)) return `payload ${quote(e.payload)} is not an object`;
  const bytes = jsonBytes(e.payload);
  if (bytes > LIMITS.payloadBytes) return `payload is ${bytes} bytes of JSON, more than ${LIMITS.payloadBytes}`;
  return undefined;
}

/** The table the leader sends: entries sorted by rankOffset that partition [0, worldSize), this process among them. */
export function tableProblem(peers: unknown, self: Join): string | undefined {
  if (!Array.isArray(peers) || peers.length < 1 || peers.length > self.worldSize) return `peers is not an array of 1 to ${self.worldSize} entries`;
  let at = 0;
  for (const [i, p] of peers.entries()) {
    if (!isObject(p)) return `peers[${i}] is not an object`;
    const problem = entryProblem(p, self.worldSize);
    if (problem) return `peers[${i}]: ${problem}`;
    if (p.rankOffset !== at) return `peers[${i}] starts at rank ${String(p.rankOffset)}, not ${at}`;
    at += p.localRanks as number;
  }
  if (at !== self.worldSize) return `the ranges end at rank ${at}, not ${self.worldSize}`;
  const mine = (peers as Record<string, unknown>[]).find((p) => p.rankOffset === self.rankOffset);
  if (mine === undefined || mine.localRanks !== self.localRanks || mine.pid !== self.pid || mine.nodeId !== self.nodeId || mine.hostId !== self.hostId)
    return `this process (${fmt(rangeOf(self))}, pid ${self.pid}) is not in it as it joined`;
  return undefined;
}

/** Ranges as a status message lists them: sorted, disjoint, within [0, worldSize). */
export function rangesProblem(ranges: unknown, worldSize: number): string | undefined {
  if (!Array.isArray(ranges) || ranges.length > worldSize) return `not an array of at most ${worldSize} ranges`;
  let at = 0;
  for (const r of ranges) {
    if (!Array.isArray(r) || r.length !== 2 || !isInt(r[0], at, worldSize - 1) || !isInt(r[1], r[0] + 1, worldSize)) return `bad range ${quote(r)}`;
    at = r[1];
  }
  return undefined;
}

/** The joins a status names as refused: a few short strings. */
export function refusedProblem(refused: unknown): string | undefined {
  if (!Array.isArray(refused) || refused.length > 16 || !refused.every((r) => isText(r, 4096))) return 'refused is not a short list of strings';
  return undefined;
}

/** An error as the leader reports it (`error`, `xerr`). */
export function errorProblem(m: Incoming): string | undefined {
  if (!isCode(m.code)) return `code ${quote(m.code)} is not an error code`;
  if (!isText(m.message, LIMITS.textChars)) return 'message is not a string of bounded length';
  if (m.rank !== undefined && !isInt(m.rank, 0, 2 ** 31 - 1)) return `rank ${quote(m.rank)} is not a rank`;
  return undefined;
}

/** A rank failure as its process announces it: the rank must be one of that process's. */
export function failureProblem(f: unknown, of: { rankOffset: number; localRanks: number }): string | undefined {
  if (!isObject(f)) return 'failure is not an object';
  if (!isInt(f.rank, of.rankOffset, of.rankOffset + of.localRanks - 1)) return `failure.rank ${quote(f.rank)} is not one of ${fmt(rangeOf(of))}`;
  if (!isText(f.message, LIMITS.textChars)) return 'failure.message is not a string of bounded length';
  if (f.phase !== undefined && !isText(f.phase, LIMITS.idChars)) return 'failure.phase is not a short string';
  return undefined;
}

/** A run's release as its process announces it: the rank must be one of that process's. */
export function releaseProblem(r: unknown, of: { rankOffset: number; localRanks: number }): string | undefined {
  if (!isObject(r)) return 'release is not an object';
  if (!isInt(r.run, 1, Number.MAX_SAFE_INTEGER)) return `release.run ${quote(r.run)} is not a run number`;
  if (!isInt(r.rank, of.rankOffset, of.rankOffset + of.localRanks - 1)) return `release.rank ${quote(r.rank)} is not one of ${fmt(rangeOf(of))}`;
  if (!isInt(r.above, 1, Number.MAX_SAFE_INTEGER)) return `release.above ${quote(r.above)} is not a sequence number`;
  if (!isText(r.message, LIMITS.textChars)) return 'release.message is not a string of bounded length';
  return undefined;
}

/** Only the fields a RunRelease has, from a checked one. */
export function toRelease(r: Record<string, unknown>): RunRelease {
  return { run: r.run as number, rank: r.rank as number, above: r.above as number, message: r.message as string };
}

/** Only the fields a RankFailure has, from a checked one. */
export function toFailure(f: Record<string, unknown>): RankFailure {
  return { rank: f.rank as number, message: f.message as string, ...(f.phase !== undefined ? { phase: f.phase as string } : {}) };
}

// ---------------------------------------------------------------------------------------------
// Small helpers

export function jsonBytes(value: unknown): number {
  return Buffer.byteLength(JSON.stringify(value ?? null));
}

export function toWire(value: unknown, what: string): unknown {
  if (value === undefined) return null;
  try {
    return JSON.parse(JSON.stringify(value)) as unknown;
  } catch (e) {
    throw new RankflowError('EINVAL', `rendezvous: ${what} is not JSON-serializable: ${(e as Error).message}`, { cause: e });
  }
}

export function toPeer(j: Join): RendezvousPeer {
  return { rankOffset: j.rankOffset, localRanks: j.localRanks, payload: j.payload, hostId: j.hostId, nodeId: j.nodeId, pid: j.pid };
}

export function rangeOf(p: { rankOffset: number; localRanks: number }): Range {
  return [p.rankOffset, p.rankOffset + p.localRanks];
}

export function overlaps(a: Range, b: Range): boolean {
  return a[0] < b[1] && b[0] < a[1];
}

/** The parts of [0, worldSize) that no process covers. */
export function gaps(processes: Iterable<{ rankOffset: number; localRanks: number }>, worldSize: number): Range[] {
  const ranges = [...processes].map(rangeOf).sort((a, b) => a[0] - b[0]);
  const out: Range[] = [];
  let at = 0;
  for (const [s, e] of ranges) {
    if (s > at) out.push([at, s]);
    at = Math.max(at, e);
  }
  if (at < worldSize) out.push([at, worldSize]);
  return out;
}

export function fmt([s, e]: Range): string {
  return e - s === 1 ? `rank ${s}` : `ranks [${s}, ${e})`;
}

export function describeMissing(missing: Range[]): string {
  return missing.length === 0 ? 'no ranks' : missing.map(fmt).join(', ');
}

/** "ranks [2, 4) (pid 123 on host)": how messages name a process. */
export function who(p: { rankOffset: number; localRanks: number; pid: number; hostId: string }): string {
  return `${fmt(rangeOf(p))} (pid ${p.pid} on ${p.hostId.split('/')[0]})`;
}
