// Rendezvous of the processes of one world over TCP, and the connections they keep afterwards.
//
// The process with rankOffset 0 is the leader: it listens on the url's host:port; every other
// process connects to it (a star). Every connection first passes a challenge-response over the
// world's token (auth.ts); only then does the leader read the process's join. The leader checks
// that all processes name the same world size and that their rank ranges partition
// [0, worldSize), then sends everyone the table of processes. The connections stay open: they
// carry `exchange` (an all-gather of small JSON values, e.g. NCCL's unique id), tell everyone when
// a process goes away without saying goodbye (`onPeerLost`), and relay the failures of ranks whose
// process lives on (`announceFailure` / `onRankFailed`: a timeout, a terminated worker).
//
// In an elastic world the leader is replaceable: when it is lost, the lowest survivor takes its
// address and relay over and the others resume with it (takeover.ts, resume.ts).
//
// This file holds the entry point and the types; auth.ts admits connections, leader.ts and
// follower.ts form the world, session.ts and follower-session.ts keep it, channel.ts frames the
// messages and bounds them, protocol.ts names and checks them.
import { RankflowError } from '../core/errors.js';
import { isLoopbackHost, tokenProblem } from './auth.js';
import { follow } from './follower.js';
import { hostId as localHostId } from './host-id.js';
import { lead } from './leader.js';
import { ElasticSession } from './takeover.js';
import { LIMITS, fmt, isObject, jsonBytes, toWire, type Join } from './protocol.js';

export interface RendezvousOptions {
  /** `tcp://host:port`; the process with rankOffset 0 listens there, the others connect. */
  url: string;
  worldSize: number;
  /** Global id of this process's first rank. */
  rankOffset: number;
  /** Ranks hosted by this process: global ids [rankOffset, rankOffset + localRanks). */
  localRanks: number;
  /** A JSON object (default {}); every process sees every process's payload in the table. */
  payload?: Record<string, unknown>;
  /** Bound on the whole rendezvous, and the default bound of each `exchange`. */
  timeoutMs: number;
  /** The world's shared secret, the same in every process; required unless the url's host is loopback. */
  token?: string;
  /** Which node this process is on (default: hostId()); carried in the table. */
  nodeId?: string;
  /** Called for each connection the leader drops (besides the NODE_DEBUG=rankflow log). */
  onDropped?: (d: DroppedConnection) => void;
  /**
   * Ends the wait for the world early: rejects with ABORTED. A leader tells the processes that
   * joined it that it gave up (they fail with RANK_FAILED naming rank 0); a follower says bye.
   */
  signal?: AbortSignal;
  /** An elastic world: the leader admits rejoins after the table (world/rejoin.ts). */
  elastic?: boolean;
  /** This process takes back a range that left an elastic world (world.rejoin). */
  rejoin?: boolean;
}

/** A connection the leader let go without admitting it to the world: a stranger, or a join it refused. */
export interface DroppedConnection {
  /** "host:port" of the peer */
  remote: string;
  reason: string;
  /** bytes it had sent */
  bytes: number;
}

export interface RendezvousPeer {
  rankOffset: number;
  localRanks: number;
  /** The process's payload: a JSON object. */
  payload: Record<string, unknown>;
  /** Equal for processes that can pass fds to each other (see host-id.ts). */
  hostId: string;
  /** The node the process says it is on (world.nodeId; default its hostId). */
  nodeId: string;
  pid: number;
}

export interface PeerLost {
  rankOffset: number;
  localRanks: number;
  hostId: string;
  nodeId: string;
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

/**
 * A rank program of this process ended its run for the others (actors/run.ts): the other processes
 * release their ranks' ops numbered `above` and later, in run `run` (each process counts its runs;
 * every process runs the same ones; in an elastic world a run's number is its op's, actors/elastic.ts).
 */
export interface RunRelease {
  run: number;
  /** global rank id of the program that ended */
  rank: number;
  above: number;
  message: string;
}

export interface Rendezvous {
  /** One entry per process, sorted by rankOffset; this process included. */
  readonly peers: readonly RendezvousPeer[];
  /** Index of this process in `peers`. */
  readonly self: number;
  /**
   * The address this process reaches the world at: a follower's end of its rendezvous connection,
   * the leader's listening address (possibly a wildcard, '0.0.0.0' or '::'). The scale-out leg listens there.
   */
  readonly localAddress: string;
  /** The leader's address as this process reached it (the leader: its listening address). */
  readonly leaderAddress: string;
  /**
   * All-gather: every process calls it with its value, in the same order; resolves with the
   * values of all processes in `peers` order. Values cross as JSON (undefined becomes null), at
   * most exchangeLimit(peers.length) bytes each (session-base.ts; ~64 KiB in a world of 64).
   */
  exchange<T>(value: T, opts?: { timeoutMs?: number }): Promise<T[]>;
  /**
   * The survivors' all-gather of an elastic world (live-exchange.ts): among the processes not lost,
   * whose entries are null; fails only when the leader is lost, on close, or on its timeout.
   */
  exchangeAmongLive<T>(value: T, opts?: { timeoutMs?: number }): Promise<Array<T | null>>;
  /**
   * Called once per process that disappears without `close()` (crash, kill, network, or a
   * message that breaks the protocol). Losses that happened before registration are replayed.
   * Returns an unsubscribe function.
   */
  onPeerLost(cb: (lost: PeerLost) => void): () => void;
  /** Tells every other process that a rank of this one failed (best effort: fire and forget). */
  announceFailure(f: RankFailure): void;
  /**
   * Called once per failure another process announces. Failures announced before registration are
   * replayed. Returns an unsubscribe function.
   */
  onRankFailed(cb: (f: RankFailure) => void): () => void;
  /** Tells every other process that a program of this one released a run (best effort). */
  announceRelease(r: RunRelease): void;
  /** Called once per release another process announces (not replayed: a release is for the run in progress). */
  onRelease(cb: (r: RunRelease) => void): () => void;
  /** Says goodbye and closes the connections; pending exchanges reject with STATE. */
  close(): Promise<void>;
}

/** Where a rejoining process starts (the leader's table for it, world/rejoin.ts): the survivors' membership and counts. */
export interface RejoinedAt {
  /** the live mask with its range, hex */
  mask: string;
  epoch: number;
  sessions: number;
  /** the sequence number its ranks start at */
  seq: number;
  /** the group ops the survivors had started (actors/elastic-join.ts) */
  started: number;
  /** the survivors' exchanges so far, of each kind (live-exchange.ts) */
  liveSeq: number;
  joinSeq: number;
  /** the index of the leader that admitted it (not 0 once another process took over: takeover.ts) */
  leader?: number;
}

/** A range that left an elastic world is being taken back by a new process (world/rejoin.ts). */
export interface Rejoining {
  /** its index in `peers` (the lost process's) */
  index: number;
  peer: RendezvousPeer;
}

/** What an elastic world's session adds (actors/elastic-join.ts): the rejoins. */
export interface ElasticRendezvous extends Rendezvous {
  /** A second survivors' exchange, numbered apart: the rejoins' agreements. */
  exchangeJoin<T>(value: T, opts?: { timeoutMs?: number }): Promise<Array<T | null>>;
  /**
   * Every process: a rejoin began (`rejoining`), or ended before the rejoiner served (`ended`);
   * `joining(index)`: whether this process's join of process `index` is still in progress (takeover.ts).
   */
  onRejoin(l: { rejoining(r: Rejoining): void; ended(index: number, reason: string): void; joining?(index: number): boolean }): void;
  /** The leader: sends the rejoiner its table at `at` and takes it back into the world (its index is no longer lost). */
  admitRejoin?(at: Omit<RejoinedAt, 'liveSeq' | 'joinSeq'>): void;
  /** The leader: the rejoin in progress (of the process `pid`, if given) ends without the rejoiner (told `reason`). */
  endRejoin?(reason: string, pid?: number): void;
  /**
   * The run ends' exchange (run-exchange.ts), keyed by the run's number: the values of the processes
   * not lost, or undefined when the leader cut it (a rank left while it was open).
   */
  exchangeRunEnd(run: number, value: unknown, opts?: { timeoutMs?: number }): Promise<unknown[] | undefined>;
  /** This process heard of a rank leaving: the run ends' exchanges open now are cut. */
  hitRunEnds(): void;
  /** The rejoins' exchanges made so far (a join's fd sockets are named for it: elastic-join.ts). */
  readonly joinsAt: number;
  /** A rejoining process's: where it starts. */
  readonly rejoined?: RejoinedAt;
  /** The leader was lost and no process took over within the timeout (takeover.ts): the world is gone for this process. */
  onBroken?(cb: (e: RankflowError) => void): void;
  /** A rejoining process's (actors/startup.ts): it serves now; until then the leader's loss ends its rejoin (takeover.ts). */
  served?(): void;
}

/** What leader.ts and follower.ts need to form a world. */
export interface Forming {
  host: string;
  port: number;
  /** The HMAC key: the token, or '' in a world without one (loopback only). */
  key: string;
  deadline: number;
  timeoutMs: number;
  /** "rendezvous at tcp://...": how messages begin. */
  where: string;
  onDropped?: (d: DroppedConnection) => void;
  signal?: AbortSignal;
  /** an elastic world: the leader keeps listening after the table, for rejoins (world/rejoin.ts) */
  elastic?: boolean;
}

/** Meets the other processes of the world; see the file header. */
export async function rendezvous(opts: RendezvousOptions): Promise<Rendezvous> {
  const { host, port } = checkOptions(opts);
  const hostId = localHostId();
  const self: Join = {
    t: 'join',
    worldSize: opts.worldSize,
    rankOffset: opts.rankOffset,
    localRanks: opts.localRanks,
    payload: toWire(opts.payload ?? {}, 'payload') as Record<string, unknown>,
    hostId,
    nodeId: opts.nodeId ?? hostId,
    pid: process.pid,
    ...(opts.rejoin === true ? { rejoin: true as const } : {}),
  };
  const forming: Forming = {
    host,
    port,
    key: opts.token ?? '',
    deadline: Date.now() + opts.timeoutMs,
    timeoutMs: opts.timeoutMs,
    where: `rendezvous at ${opts.url}`,
    onDropped: opts.onDropped,
    ...(opts.signal !== undefined ? { signal: opts.signal } : {}),
    ...(opts.elastic === true ? { elastic: true } : {}),
  };
  // A rejoiner follows whoever leads now: rankOffset 0's range too, once its process was lost (takeover.ts).
  const session = opts.rankOffset === 0 && opts.rejoin !== true ? await lead(self, forming) : await follow(self, forming);
  return opts.elastic === true ? new ElasticSession(session, forming, self) : session;
}

/** Host and port of a `tcp://host:port` url (IPv6 in brackets), or undefined. */
export function parseRendezvousUrl(url: unknown): { host: string; port: number } | undefined {
  if (typeof url !== 'string') return undefined;
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return undefined;
  }
  if (u.protocol !== 'tcp:' || u.hostname === '' || u.port === '' || u.port === '0' || u.pathname !== '' || u.search !== '' || u.username !== '')
    return undefined;
  return { host: u.hostname.replace(/^\[(.*)\]$/, '$1'), port: Number(u.port) };
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
  if (opts.payload !== undefined && !isObject(opts.payload)) bad('payload must be a JSON object');
  if (opts.payload !== undefined && jsonBytes(toWire(opts.payload, 'payload')) > LIMITS.payloadBytes)
    bad(`payload is more than ${LIMITS.payloadBytes} bytes of JSON`);
  const nodeId = opts.nodeId === undefined ? undefined : nodeIdProblem(opts.nodeId);
  if (nodeId) bad(`nodeId ${nodeId}`);
  const at = parseRendezvousUrl(opts.url);
  if (at === undefined) return bad(`url must look like tcp://host:port (port > 0), got ${JSON.stringify(opts.url)}`);
  const token = opts.token === undefined ? undefined : tokenProblem(opts.token);
  if (token) bad(`token ${token}`);
  if (opts.token === undefined && !isLoopbackHost(at.host))
    bad(`token is required: ${at.host} is not a loopback address, so other machines can reach the rendezvous`);
  return at;
}

/** What is wrong with a nodeId, or undefined. */
export function nodeIdProblem(nodeId: unknown): string | undefined {
  if (typeof nodeId !== 'string' || nodeId === '' || nodeId.length > LIMITS.idChars)
    return `must be a non-empty string of at most ${LIMITS.idChars} characters (got ${typeof nodeId === 'string' ? `${nodeId.length} characters` : typeof nodeId})`;
  return undefined;
}
