// Rendezvous of the processes of one world over TCP, and the connections they keep afterwards.
//
// The process with rankOffset 0 is the leader: it listens on the url's host:port; every other
// process connects to it (a star). Messages are newline-delimited JSON. The leader checks that all
// processes name the same world size and that their rank ranges partition [0, worldSize), then
// sends everyone the table of processes. The connections stay open: they carry `exchange` (an
// all-gather of small JSON values, e.g. NCCL's unique id or fd socket names), tell everyone
// when a process goes away without saying goodbye (`onPeerLost`), and relay the failures of ranks
// whose process lives on (`announceFailure` / `onRankFailed`: a timeout, a terminated worker).
//
// This file holds the entry point and the types; leader.ts and follower.ts form the world,
// session.ts keeps it, channel.ts frames the messages, protocol.ts names them.
import { RankflowError } from '../core/errors.js';
import { follow } from './follower.js';
import { hostId as localHostId } from './host-id.js';
import { lead } from './leader.js';
import { fmt, PROTOCOL, toWire, type Hello } from './protocol.js';

export interface RendezvousOptions {
  /** `tcp://host:port`; the process with rankOffset 0 listens there, the others connect. */
  url: string;
  worldSize: number;
  /** Global id of this process's first rank. */
  rankOffset: number;
  /** Ranks hosted by this process: global ids [rankOffset, rankOffset + localRanks). */
  localRanks: number;
  /** Any JSON value; every process sees every process's payload in the table. */
  payload?: unknown;
  /** Bound on the whole rendezvous, and the default bound of each `exchange`. */
  timeoutMs: number;
}

export interface RendezvousPeer {
  rankOffset: number;
  localRanks: number;
  payload: unknown;
  /** Equal for processes that can pass fds to each other (see hostId.ts). */
  hostId: string;
  pid: number;
}

export interface PeerLost {
  rankOffset: number;
  localRanks: number;
  hostId: string;
  /** What was seen: the socket error or "connection closed", and by whom. */
  reason: string;
}

/** A rank that failed (the origin of a failure), as its process tells the others. */
export interface RankFailure {
  /** global rank id */
  rank: number;
  message: string;
  phase?: string;
}

export interface Rendezvous {
  /** One entry per process, sorted by rankOffset; this process included. */
  readonly peers: readonly RendezvousPeer[];
  /** Index of this process in `peers`. */
  readonly self: number;
  /**
   * All-gather: every process calls it with its value, in the same order; resolves with the
   * values of all processes in `peers` order. Values cross as JSON (undefined becomes null).
   */
  exchange<T>(value: T, opts?: { timeoutMs?: number }): Promise<T[]>;
  /**
   * Called once per process that disappears without `close()` (crash, kill, network). Losses
   * that happened before registration are replayed. Returns an unsubscribe function.
   */
  onPeerLost(cb: (lost: PeerLost) => void): () => void;
  /** Tells every other process that a rank of this one failed (best effort: fire and forget). */
  announceFailure(f: RankFailure): void;
  /**
   * Called once per failure another process announces. Failures announced before registration are
   * replayed. Returns an unsubscribe function.
   */
  onRankFailed(cb: (f: RankFailure) => void): () => void;
  /** Says goodbye and closes the connections; pending exchanges reject with STATE. */
  close(): Promise<void>;
}
/** Meets the other processes of the world; see the file header. */
export async function rendezvous(opts: RendezvousOptions): Promise<Rendezvous> {
  const { host, port } = checkOptions(opts);
  const hello: Hello = {
    t: 'hello',
    proto: PROTOCOL,
    worldSize: opts.worldSize,
    rankOffset: opts.rankOffset,
    localRanks: opts.localRanks,
    payload: toWire(opts.payload, 'payload'),
    hostId: localHostId(),
    pid: process.pid,
  };
  const deadline = Date.now() + opts.timeoutMs;
  const where = `rendezvous at ${opts.url}`;
  return opts.rankOffset === 0
    ? lead(hello, host, port, deadline, opts.timeoutMs, where)
    : follow(hello, host, port, deadline, opts.timeoutMs, where);
}

function checkOptions(opts: RendezvousOptions): { host: string; port: number } {
  const bad = (what: string): never => {
    throw new RankflowError('EINVAL', `rendezvous: ${what}`);
  };
  if (!Number.isInteger(opts.worldSize) || opts.worldSize < 1) bad(`worldSize must be an integer >= 1, got ${opts.worldSize}`);
  if (!Number.isInteger(opts.rankOffset) || opts.rankOffset < 0) bad(`rankOffset must be an integer >= 0, got ${opts.rankOffset}`);
  if (!Number.isInteger(opts.localRanks) || opts.localRanks < 1) bad(`localRanks must be an integer >= 1, got ${opts.localRanks}`);
  if (opts.rankOffset + opts.localRanks > opts.worldSize)
    bad(`ranks ${fmt([opts.rankOffset, opts.rankOffset + opts.localRanks])} do not fit in worldSize ${opts.worldSize}`);
  if (!(opts.timeoutMs > 0) || !Number.isFinite(opts.timeoutMs)) bad(`timeoutMs must be a finite number > 0, got ${opts.timeoutMs}`);
  let url: URL | undefined;
  try {
    url = new URL(opts.url);
  } catch {
    url = undefined;
  }
  if (url === undefined || url.protocol !== 'tcp:' || url.hostname === '' || url.port === '' || url.port === '0')
    return bad(`url must look like tcp://host:port (port > 0), got ${JSON.stringify(opts.url)}`);
  return { host: url.hostname.replace(/^\[(.*)\]$/, '$1'), port: Number(url.port) };
}
