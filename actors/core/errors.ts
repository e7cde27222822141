// RankflowError: the one error type of the public API, with a code callers can switch on.
/**
 * ABORTED: an AbortSignal given to createGroup or group.run ended it (the error's cause is the signal's
 * reason), destroy() ended a run, or (inside rank programs) a peer's program ending released the op.
 * PROGRAM_ERROR: a rank program threw something that is not a RankflowError (its cause is what it threw).
 */
export type RankflowErrorCode =
  | 'EINVAL' | 'TIMEOUT_CPU' | 'TIMEOUT_GPU' | 'RANK_FAILED' | 'BACKEND_UNAVAILABLE' | 'STATE' | 'ABORTED' | 'PROGRAM_ERROR';

const CODES: ReadonlySet<string> = new Set(['EINVAL', 'TIMEOUT_CPU', 'TIMEOUT_GPU', 'RANK_FAILED', 'BACKEND_UNAVAILABLE', 'STATE', 'ABORTED', 'PROGRAM_ERROR']);

/** Whether `code` is one of rankflow's error codes. */
export const isErrorCode = (code: unknown): code is RankflowErrorCode => typeof code === 'string' && CODES.has(code);

export class RankflowError extends Error {
  readonly code: RankflowErrorCode;
  /** The rank the error is about: the failed peer, or the rank that saw the failure. */
  readonly rank?: number;
  /** The state the rank was in. */
  readonly state?: string;
  /** The protocol phase, for timeouts and failures inside an operation. */
  readonly phase?: string;

  constructor(code: RankflowErrorCode, message: string, opts: { rank?: number; state?: string; phase?: string; cause?: unknown } = {}) {
    super(message, opts.cause !== undefined ? { cause: opts.cause } : undefined);
    this.name = 'RankflowError';
    this.code = code;
    if (opts.rank !== undefined) this.rank = opts.rank;
    if (opts.state !== undefined) this.state = opts.state;
    if (opts.phase !== undefined) this.phase = opts.phase;
  }

  /** Plain data, for crossing threads and for events. */
  toJSON(): { code: RankflowErrorCode; message: string; rank?: number; state?: string; phase?: string } {
    return { code: this.code, message: this.message, rank: this.rank, state: this.state, phase: this.phase };
  }

  /** Rebuilds an error from plain data (a worker's reply, a native error with a `code`). */
  static from(e: unknown, fallback: RankflowErrorCode = 'EINVAL'): RankflowError {
    if (e instanceof RankflowError) return e;
    const o = (e ?? {}) as { code?: string; message?: string; rank?: number; state?: string; phase?: string };
    const code = (o.code && CODES.has(o.code) ? o.code : fallback) as RankflowErrorCode;
    return new RankflowError(code, o.message ?? String(e), { rank: o.rank, state: o.state, phase: o.phase });
  }
}

/** EINVAL naming the argument: every input check goes through here. */
export function invalid(argument: string, problem: string): RankflowError {
  return new RankflowError('EINVAL', `${argument}: ${problem}`);
}

/** A value as an error message shows it. */
export function describe(v: unknown): string {
  if (Array.isArray(v)) return `an array of ${v.length}`;
  if (typeof v === 'string') return JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}...` : v);
  if (typeof v === 'object' && v !== null) return v.constructor?.name ?? 'an object';
  return String(v);
}
