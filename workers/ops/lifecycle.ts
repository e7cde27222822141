// The op table's lifecycle part (`ops.lifecycle`): the rank's native calls around its ops, which
// workers/rank.ts serves to the main thread: the segments it exports for its peers, NCCL's id and
// init, the scale-out listener and connections, what info() says, the layout probes of tests, its
// sequence and session counts, the recovery after a released run and the destroy (each one pass of
// the machine), and the context's hooks: where it counts traffic, what runs when a wait lasts.
import type { ExportedSegments, NativeContext, NativeInfo } from '../../actors/core/addon.js';
import type { RankflowError } from '../../actors/core/errors.js';
import { EVENTS } from '../runner.js';
import type { Membership } from '../protocol.js';
import type { RankOps } from './index.js';

type Segments = { deviceFd: number; hostFd: number };

export class LifecycleOps {
  constructor(
    private readonly ops: RankOps,
    private readonly native: NativeContext,
  ) {}

  /** byte offset of the rank's abort words in the SharedArrayBuffer its context was made with */
  get abortOffset(): number {
    return this.native.abortOffset;
  }

  /** where the rank counts the bytes it sends (the group's TRAFFIC words) */
  trafficWords(words: BigUint64Array): void {
    this.native.trafficWords(words);
  }

  /** fn runs on the rank's thread when one of its waits has lasted a millisecond */
  onSlowWait(fn: () => void): void {
    this.native.onSlowWait(fn);
  }

  exported(): ExportedSegments {
    return this.native.exported();
  }

  /** memory kind, windows, domains, and on cuda the GPU */
  info(): NativeInfo {
    return this.native.info();
  }

  ncclUniqueId(): Uint8Array | null {
    return this.native.ncclUniqueId();
  }

  ncclInit(id: Uint8Array): void {
    this.native.ncclInit(id);
  }

  /** A world that spans nodes: the rank's scale-out listener on `host` (its port). */
  scaleoutListen(host: string): number {
    return this.native.scaleoutListen(host);
  }

  /** Its authenticated connections to its rail peers (before register). */
  scaleoutConnect(endpoints: Array<{ host: string; port: number }>, key: Uint8Array, timeoutMs: number): void {
    this.native.scaleoutConnect(endpoints, key, timeoutMs);
  }

  /** Layout probe (tests): `bytes` through this rank's translated pointer into `peer`'s window. */
  writePeer(peer: number, offset: number, bytes: Uint8Array): bigint {
    return this.native.writePeer(peer, offset, bytes);
  }

  /** Layout probe (tests): bytes of this rank's window. */
  readWindow(offset: number, length: number): Uint8Array {
    return this.native.readWindow(offset, length);
  }

  /** the rank's sequence number now (its last collective's) */
  seq(): number {
    return this.native.seq();
  }

  /** AGRS sessions the rank opened so far */
  sessionCount(): number {
    return this.native.sessionCount();
  }

  /** After a released run: no capture goes on, and the rank's `seq` and `sessions` are the group's (ops/recover.cc). */
  recover(seq: number, sessions: number): void {
    this.ops.capturing = false;
    this.ops.runner.recover(seq, () => this.native.recover(seq, sessions));
  }

  /** Elastic: the membership the rank's ops follow (what the native call `apply` wrote into its workspace). */
  membership(m: Membership, apply: () => void): void {
    apply();
    this.ops.membership = m;
  }

  /** Elastic: a replacement starts in the group's membership `m`, before its registration (whose barrier is among m's ranks). */
  startIn(m: Membership): void {
    this.membership(m, () => this.native.remask(this.native.seq(), m.sessions, m.mask, m.epoch));
  }

  /** Elastic: the group re-formed with `m`'s ranks; the rank in step at `seq` (ops/membership.cc remask). */
  remask(seq: number, m: Membership): void {
    this.ops.capturing = false;
    this.ops.runner.remask(seq, () => this.membership(m, () => this.native.remask(seq, m.sessions, m.mask, m.epoch)));
  }

  /** Elastic: the replacements of `peer` (or of each of several: a world's range) join: REJOIN through the machine (one collective: the barrier with them). */
  rejoin(peer: number | number[], segments: Segments | Segments[], m: Membership): void {
    this.ops.runner.run(EVENTS.rejoin, () => this.membership(m, () => this.native.rejoin(peer, segments, m.mask, m.epoch)));
    this.ops.engram = null;  // the table went with the old rank (ops/membership.cc): written again before a fetch
  }

  /** DESTROY through the machine; a rank that cannot take it now (mid-operation) is torn down anyway. */
  destroy(): void {
    try {
      this.ops.runner.run(EVENTS.destroy, () => this.native.destroy());
    } catch (e) {
      if ((e as RankflowError).code !== 'STATE') throw e;
      this.native.destroy();
    }
  }
}
