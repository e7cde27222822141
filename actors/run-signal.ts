// group.run with an AbortSignal: aborted before the run's turn (runs queue like collectives), the run
// is skipped; aborted while the programs run, every rank's program is told (its run-abort word and
// an abortRun message: rank.aborted, rank.signal, rank.anyAborted()), and the run rejects with ABORTED
// once every program has ended. A failure of the ranks themselves is not hidden behind the abort.
import { abortError } from './core/abort.js';
import type { Ranks } from './ranks.js';

export interface SignalledRun {
  /** queues the run as a collective of the group */
  queue: <R>(body: () => Promise<R>) => Promise<R>;
  workers: Ranks;
  /** a fresh id for the run (the programs compare it with their run-abort word) */
  nextId: () => number;
  /** some rank of the group has failed */
  failed: () => boolean;
  url: string;
  args: unknown;
  signal: AbortSignal;
}

export function runUntilAborted<T>({ queue, workers, nextId, failed, url, args, signal }: SignalledRun): Promise<T[]> {
  return new Promise<T[]>((resolve, reject) => {
    let running = 0;  // the run's id while its programs run
    let early = false;
    const onAbort = (): void => {
      if (running === 0) {
        early = true;  // skipped when its turn comes
        return reject(abortError('group.run', signal));
      }
      const reason = abortError('group.run', signal).message;
      for (const m of workers.members) {
        Atomics.store(m.runAbort, 0, running);
        void m.api.abortRun(running, reason).catch(() => {});
      }
    };
    signal.addEventListener('abort', onAbort, { once: true });
    let aborted = false;
    queue(async () => {
      if (early) throw abortError('group.run', signal);
      running = nextId();
      try {
        return await workers.all((api) => api.run(url, args, running) as Promise<T>);
      } finally {
        aborted = signal.aborted;
        running = 0;
      }
    }).then(
      (out) => (aborted ? reject(abortError('group.run', signal)) : resolve(out)),
      (e: unknown) => reject(aborted && !failed() ? abortError('group.run', signal) : e),
    ).finally(() => signal.removeEventListener('abort', onAbort));
  });
}
