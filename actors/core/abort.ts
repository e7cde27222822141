// AbortSignal options (createGroup's `signal`, group.run's `signal`): the check of the option and the
// error an abort rejects with: RankflowError code 'ABORTED', its cause the signal's reason (a
// DOMException AbortError for controller.abort(), a TimeoutError for AbortSignal.timeout(), or
// whatever the caller passed to abort(reason)).
import { RankflowError, invalid } from './errors.js';

/** `signal` is undefined or an AbortSignal. */
export function checkSignal(name: string, signal: unknown): AbortSignal | undefined {
  if (signal === undefined) return undefined;
  if (!(signal instanceof AbortSignal)) throw invalid(name, 'must be an AbortSignal (e.g. new AbortController().signal or AbortSignal.timeout(ms))');
  return signal;
}

/** The error of `what` cut short by `signal`. */
export function abortError(what: string, signal: AbortSignal): RankflowError {
  const reason: unknown = signal.reason;
  const text = reason instanceof Error ? `${reason.name}: ${reason.message}` : reason === undefined ? '' : String(reason);
  return new RankflowError('ABORTED', `${what}: aborted${text ? ` (${text.slice(0, 200)})` : ''}`, { cause: reason });
}

/** A promise of `ms` milliseconds that ends early (resolves) when `signal` aborts. */
export function sleepUnless(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener('abort', done, { once: true });
  });
}
