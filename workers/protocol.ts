// What a rank worker tells the main thread besides comlink replies (same port, so in order).
import type { FailureInfo } from '../machines/index.js';

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
  /** on failures: the phase that failed, and the error */
  phase?: string;
  error?: FailureInfo;
}

export type WorkerMessage =
  | { kind: 'started'; rank: number }
  | { kind: 'transition'; transition: TransitionEvent }
  | { kind: 'inspect'; record: Record<string, unknown> }
  /** several of the above, in order: the worker batches what it reports within a millisecond */
  | { kind: 'batch'; messages: WorkerMessage[] };

/** A worker waits at most this long before it reports what it queued (a reply never waits: it flushes first). */
export const REPORT_BATCH_MS = 1;

export const isWorkerMessage = (m: unknown): m is WorkerMessage =>
  typeof m === 'object' && m !== null && typeof (m as { kind?: unknown }).kind === 'string' && !('id' in m);
