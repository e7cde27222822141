// The rendezvous wire protocol: the messages both sides send, and the small helpers that name
// processes and rank ranges in messages.
import { RankflowError, type RankflowErrorCode } from '../core/errors.js';
import type { RankFailure, RendezvousPeer } from './rendezvous.js';

export const PROTOCOL = 'rankflow-rendezvous/1';

export type Range = [start: number, end: number];

export interface Hello {
  t: 'hello';
  proto: string;
  worldSize: number;
  rankOffset: number;
  localRanks: number;
  payload: unknown;
  hostId: string;
  pid: number;
}

export type Message =
  | Hello
  | { t: 'status'; missing: Range[] }
  | { t: 'table'; peers: RendezvousPeer[] }
  | { t: 'error'; code: RankflowErrorCode; message: string; rank?: number }
  | { t: 'x'; seq: number; value: unknown }
  | { t: 'xall'; seq: number; values: unknown[] }
  | { t: 'xerr'; seq: number; code: RankflowErrorCode; message: string; rank?: number }
  | { t: 'lost'; index: number; reason: string }
  | { t: 'failed'; from: number; failure: RankFailure }
  | { t: 'bye' };


export function toWire(value: unknown, what: string): unknown {
  if (value === undefined) return null;
  try {
    return JSON.parse(JSON.stringify(value)) as unknown;
  } catch (e) {
    throw new RankflowError('EINVAL', `rendezvous: ${what} is not JSON-serializable: ${(e as Error).message}`, { cause: e });
  }
}

export function toPeer(h: Hello): RendezvousPeer {
  return { rankOffset: h.rankOffset, localRanks: h.localRanks, payload: h.payload, hostId: h.hostId, pid: h.pid };
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


export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
