// What the main thread and a rank's worker tell each other besides comlink calls and replies: the
// worker's init data, and what the worker reports on the same port (so in order with its replies).
import type { FailureInfo } from '../machines/index.js';
import type { BufferConfig } from '../actors/core/validate.js';
import type { ThrownValue } from '../actors/core/thrown.js';

export interface RankInit {
  rank: number;
  worldSize: number;
  ranksPerNode: number;
  groupId: string;
  buffer: BufferConfig;
  cpuSeconds: number;
  gpuSeconds: number;
  inspect: boolean;
  backend: 'host' | 'cuda';
  /** cuda: the rank's GPU ordinal, the local ranks on it, and whether to make an NCCL communicator */
  device?: number;
  deviceShare?: number;
  nccl?: boolean;
  /** the abort words' SharedArrayBuffer (ABORT.bytes): the main thread raises a peer's failure there */
  abort: SharedArrayBuffer;
  /** the traffic counters' SharedArrayBuffer (TRAFFIC.bytes): the rank counts what it sends, group.traffic() reads it */
  traffic?: SharedArrayBuffer;
  /** the world spans nodes that share no memory: the rank's ops run in two levels */
  scaleOut?: boolean;
  /** one Int32 word: the id of the group.run the main thread aborted (workers/run-abort.ts) */
  runAbort: SharedArrayBuffer;
  /** tests only (RANKFLOW_TEST_FIRST_SEQ): the sequence number the rank's collectives start after */
  firstSeq?: number;
  /** createGroup({ elastic: true }): a peer's leaving masks it (machines/rank.ts masking) instead of failing the rank */
  elastic?: boolean;
  /** elastic, host, one process: a wait that timed out on a peer fails that peer, not this rank (workers/runner.ts blameTimeout) */
  blamesTimeouts?: boolean;
  /** elastic: a replacement rank starts in the group's membership (its live mask, count of changes, sessions) */
  membership?: Membership;
  /** native tuning from actors/core/config.ts (native code reads no environment variable) */
  tuning: { ceMinBytes: number; cooperative: boolean; graphLaunch: boolean; fusedDispatch: boolean; ncclHome?: string; ncclHostId?: string };
}

/** An elastic group's membership as a rank is told it: bit p of `mask` (rank p serves), `live` the same as ids. */
export interface Membership {
  mask: bigint;
  epoch: number;
  live: number[];
  /** the group's session count (a replacement takes it, as a recovered rank does) */
  sessions: number;
}

/** Where a rank stands between runs: what the group re-synchronises its ranks from. */
export interface RankPosition {
  /** the native sequence number (its last collective's) */
  seq: number;
  /** AGRS sessions opened so far */
  sessions: number;
  /** the machine's state ('ready' unless a program left a session or fetches behind, or was released) */
  state: string;
}

/** How one rank's program ended (group.run), and where the rank stands then. */
export type RunOutcome = RankPosition & ({ ok: true; value: unknown } | { ok: false; thrown: ThrownValue });

export interface TransitionEvent {
  rank: number;
  from: string;
  to: string;
  /** the xstate event that caused it */
  event: string;
  /** epoch milliseconds */
  at: number;
  /** the collective being served, if any */
  op?: string;
  /** collectives started so far on this rank: equal across ranks for the same collective */
  seq?: number;
  /** on the transition out of an op: the phases it went through (e.g. notify, cpuSync, data) */
  phases?: readonly string[];
  /** on failures: the phase that failed, and the error */
  phase?: string;
  error?: FailureInfo;
}

export type WorkerMessage =
  | { kind: 'started'; rank: number; abortOffset: number }
  | { kind: 'transition'; transition: TransitionEvent }
  /** transitions encoded by workers/transition-log.ts (names: additions to the rank's name table) */
  | { kind: 'transitions'; rank: number; names: string[]; data: Float64Array }
  | { kind: 'inspect'; record: Record<string, unknown> }
  /** several of the above, in order: the worker batches what it reports within a millisecond */
  | { kind: 'batch'; messages: WorkerMessage[] };

/** A worker waits at most this long before it reports what it queued (a reply never waits: it flushes first). */
export const REPORT_BATCH_MS = 1;
/** ...or until it holds this many transitions, whichever comes first (workers/runner.ts queued). */
export const MAX_BATCH_RECORDS = 4096;

export const isWorkerMessage = (m: unknown): m is WorkerMessage =>
  typeof m === 'object' && m !== null && typeof (m as { kind?: unknown }).kind === 'string' && !('id' in m);
