// Phases of one native job that runs them back to back (the fast path: the GPU never waits on the
// rank machine). The job reports each finished stage without waiting for JS; the rank machine still
// passes through every phase state, whose actors resolve, in order, as observations of the job.
//
//   const [notify, cpuSync, data] = stagedPhases(3, (progress) => native.dispatchRun(..., progress));
//
// Phase 0 starts the job and resolves when the job reports stage 0; phase i resolves at stage i; the
// last phase resolves with the job's result. A failure fails the phase in progress (the first phase
// not yet resolved), as if the phases had run one by one, so the machine attributes it the same way.

type Deferred = { promise: Promise<unknown>; resolve: (v: unknown) => void; reject: (e: unknown) => void };

function deferred(): Deferred {
  let resolve!: (v: unknown) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<unknown>((res, rej) => ((resolve = res), (reject = rej)));
  // Phases after a failed one are never invoked: their rejection is nobody's to handle.
  promise.catch(() => {});
  return { promise, resolve, reject };
}

export function stagedPhases<T>(count: number, start: (progress: (stage: number) => void) => Promise<T>): Array<() => Promise<unknown>> {
  const stages = Array.from({ length: count }, deferred);
  let next = 0;
  // Stage k reported: phases 0..k are done (the last phase waits for the job's result).
  const progress = (stage: number): void => {
    while (next <= stage && next < count - 1) stages[next++]!.resolve(undefined);
  };
  const run = (): Promise<unknown> => {
    let job: Promise<T>;
    try {
      job = start(progress);
    } catch (e) {
      job = Promise.reject(e);
    }
    job.then(
      (v) => {
        progress(count - 2);
        stages[count - 1]!.resolve(v);
      },
      (e: unknown) => {
        while (next < count) stages[next++]!.reject(e);
      },
    );
    return stages[0]!.promise;
  };
  return stages.map((s, i) => (i === 0 ? run : () => s.promise));
}
