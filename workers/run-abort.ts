// group.run(url, args, { signal }) as a rank program sees it. The main thread writes the id of the
// aborted run into a shared word (runAbort in RankInit) and also posts abortRun(); a program reads:
//   rank.aborted       the word, at once (no event-loop turn needed: a loop of rank ops never yields one)
//   rank.signal        an AbortSignal for async APIs (timers, fetch); aborted by abortRun(), or as soon
//                      as rank.aborted is read true
//   rank.anyAborted()  a collective (every rank calls it at the same point): true on every rank when
//                      any rank had seen the abort, so that the ranks stop after the same collective
// Nothing else changes: the rank's operations work as before; a program that ignores the abort runs
// to its end.
import { RankflowError } from '../actors/core/errors.js';
import { tensor, type Tensor } from '../actors/core/tensor.js';

/** What the program handle needs of the op table for anyAborted(). */
interface Gather {
  allGather(t: Tensor): unknown;
}

/** One run's view of the abort. */
export class RunAbortState {
  private readonly controller = new AbortController();

  constructor(
    private readonly word: Int32Array | undefined,
    readonly id: number,
  ) {}

  get aborted(): boolean {
    if (this.controller.signal.aborted) return true;
    if (this.word === undefined || this.id === 0 || Atomics.load(this.word, 0) !== this.id) return false;
    this.abort('the run was aborted');
    return true;
  }

  get signal(): AbortSignal {
    void this.aborted;  // a word already written aborts the signal before anyone looks at it
    return this.controller.signal;
  }

  abort(reason: string): void {
    if (!this.controller.signal.aborted) this.controller.abort(new RankflowError('ABORTED', `group.run: ${reason}`));
  }

  /** A collective: whether any rank had seen the abort (the same answer on every rank). */
  anyAborted(ops: Gather): boolean {
    const all = ops.allGather(tensor('int32', [1], Int32Array.of(this.aborted ? 1 : 0))) as Tensor<'int32'>;
    const any = all.data.some((v) => v !== 0);
    if (any) this.abort('the run was aborted (seen by another rank)');
    return any;
  }
}

/** The worker's side: the run in progress, if any. */
export class RunAborts {
  private current: RunAbortState | undefined;

  constructor(private readonly word: Int32Array) {}

  begin(id: number): RunAbortState {
    this.current = new RunAbortState(id === 0 ? undefined : this.word, id);
    return this.current;
  }

  end(state: RunAbortState): void {
    if (this.current === state) this.current = undefined;
  }

  /** The main thread's abortRun(id): the run's signal aborts if it is still the one in progress. */
  abort(id: number, reason: string): void {
    if (this.current !== undefined && this.current.id === id) this.current.abort(reason);
  }
}
