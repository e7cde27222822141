// The abort words of one rank (ABORT in addon.ts), as the main thread writes them: a failure (a peer
// died: the rank's waits end with RANK_FAILED and so does the rank), the teardown, and a run's
// release (a rank program ended: the rank's ops from a sequence number on end with ABORTED, the rank
// lives on). The rank's native waits and kernels read them while its own thread is blocked in an op,
// so each text goes in before the word that raises it (Atomics: sequentially consistent).
import { ABORT } from './addon.js';

const encoder = new TextEncoder();

/** The words of a rank, over the SharedArrayBuffer it was given, from the offset its worker reported. */
export class AbortWords {
  readonly i32: Int32Array;
  private readonly u64: BigUint64Array;
  private readonly bytes: Uint8Array;

  constructor(buffer: SharedArrayBuffer, offset: number) {
    this.i32 = new Int32Array(buffer, offset, ABORT.words);
    this.u64 = new BigUint64Array(buffer, offset, ABORT.words / 2);
    this.bytes = new Uint8Array(buffer, offset, ABORT.span);
  }

  get failed(): boolean {
    return Atomics.load(this.i32, ABORT.failedRank) !== 0;
  }

  /** Rank `rank` failed (`message` says how): the first failure stands. */
  fail(rank: number, message: string): void {
    if (this.failed) return;
    Atomics.store(this.i32, ABORT.failureReasonBytes, this.text(ABORT.failureReasonAt, message));
    Atomics.store(this.i32, ABORT.failedRank, rank + 1);
  }

  /**
   * Elastic groups: rank `rank` left (`message` says how). The rank's ops end with RANK_FAILED naming
   * it, in their waits and at their start, until clearLeft(); the rank lives on. The text shares the
   * failure's bytes: an elastic group's ranks never get a peer's failure.
   */
  left(rank: number, message: string): void {
    Atomics.store(this.i32, ABORT.failureReasonBytes, this.text(ABORT.failureReasonAt, message));
    Atomics.store(this.i32, ABORT.leftRank, rank + 1);
  }

  /** The group re-formed without the ranks that left: the rank's ops run again. */
  clearLeft(): void {
    Atomics.store(this.i32, ABORT.leftRank, 0);
  }

  /** The rank is being torn down: whatever it waits for, it stops waiting. */
  stop(): void {
    Atomics.store(this.i32, ABORT.stopping, 1);
  }

  /** The first sequence number the run's release ends (0n: none). */
  get releasedAbove(): bigint {
    return Atomics.load(this.u64, ABORT.releasedAbove / 2);
  }

  /**
   * Releases the rank's ops numbered `above` and later (1: every op), because rank `origin`'s program
   * ended (`message`). A release only ever grows: a lower `above` replaces a higher one, never the
   * reverse, and the origin and text stay those of the release that first took effect.
   */
  release(origin: number, above: bigint, message: string): void {
    const now = this.releasedAbove;
    if (now !== 0n && now <= above) return;
    if (now === 0n) {
      Atomics.store(this.i32, ABORT.releaseReasonBytes, this.text(ABORT.releaseReasonAt, message));
      Atomics.store(this.i32, ABORT.releaseOrigin, origin + 1);
    }
    Atomics.store(this.u64, ABORT.releasedAbove / 2, above);
  }

  /** The release is over (every rank of the run is back in step): the rank's ops run again. */
  clearRelease(): void {
    Atomics.store(this.u64, ABORT.releasedAbove / 2, 0n);
    Atomics.store(this.i32, ABORT.releaseOrigin, 0);
    Atomics.store(this.i32, ABORT.releaseReasonBytes, 0);
  }

  /** `message` as UTF-8 at byte `at`, cut on a character boundary to ABORT.maxReason bytes; its length. */
  private text(at: number, message: string): number {
    return encoder.encodeInto(message, this.bytes.subarray(at, at + ABORT.maxReason)).written;
  }
}
