// rankflow's one error type. Placeholder with the API that main's actors/errors.ts has; main's
// version wins in the merge.
export type RankflowErrorCode =
  | 'EINVAL'
  | 'TIMEOUT_CPU'
  | 'TIMEOUT_GPU'
  | 'RANK_FAILED'
  | 'BACKEND_UNAVAILABLE'
  | 'STATE';

export class RankflowError extends Error {
  code: RankflowErrorCode;
  rank?: number;
  state?: string;

  constructor(code: RankflowErrorCode, message: string, opts?: { rank?: number; state?: string; cause?: unknown }) {
    super(message, opts?.cause === undefined ? undefined : { cause: opts.cause });
    this.name = 'RankflowError';
    this.code = code;
    if (opts?.rank !== undefined) this.rank = opts.rank;
    if (opts?.state !== undefined) this.state = opts.state;
  }
}
