// The op table's cuda-only part (`ops.device`): what a rank program has beyond the collectives on
// cuda (device tensors, graphs, the stream's sync, CUDA events, baselines, and the interop calls of
// workers/interop.ts), each one native call. Every call but the makers of device tensors starts with
// the one check that refuses it on host (EINVAL "<call>: needs backend 'cuda' ..."), as the runtime's
// DeviceOps is behind Context::device(what); a call's own argument checks follow that check.
import { SCRATCH, type NativeContext } from '../../actors/core/addon.js';
import { deviceTensor, externalTensor, type DeviceTensor } from '../../actors/core/device-tensor.js';
import { invalid, RankflowError } from '../../actors/core/errors.js';
import type { DType } from '../../actors/core/tensor.js';
import { checkPositiveInt } from '../../actors/core/validate.js';
import type { RankOps } from './index.js';

/** A native call whose errors (plain objects with a code) come out as RankflowErrors. */
function rankflowErrors<T>(call: () => T): T {
  try {
    return call();
  } catch (e) {
    throw RankflowError.from(e);
  }
}

/** A graph's replay as the machine takes it: made once per graph, so a replay allocates no event. */
export interface ReplayEvent {
  readonly type: 'REPLAY';
  /** the collectives one replay runs */
  readonly ops: number;
}

const REPLAY_PHASES = Object.freeze(['graph']);

export class DeviceOps {
  private readonly cuda: boolean;
  private readonly f64: Float64Array;

  constructor(
    private readonly ops: RankOps,
    private readonly native: NativeContext,
  ) {
    this.cuda = ops.init.backend === 'cuda';
    this.f64 = new Float64Array(native.scratch);
  }

  /** EINVAL naming the rank program's call `what` unless the rank runs on cuda. */
  private need(what: string): void {
    if (!this.cuda) throw invalid(what, "needs backend 'cuda' (device tensors, streams and CUDA events)");
  }

  /** rank.tensor on cuda: device memory of the rank's GPU, zero-filled or holding `data`. */
  tensor<D extends DType>(dtype: D, shape: number[], data?: ArrayBufferView): DeviceTensor<D> {
    return deviceTensor(this.native, dtype, shape, data);
  }

  /** rank.capture's start: from now on the rank's ops record into a graph (ops.capturing) instead of running. */
  captureBegin(fn: unknown): void {
    this.need('capture');
    if (typeof fn !== 'function') throw invalid('fn', 'must be a function');
    if (this.ops.capturing) throw new RankflowError('STATE', 'capture: a capture is already in progress on this rank');
    this.native.captureBegin();
    this.ops.capturing = true;
  }

  /** The capture's end: its graph, and the collectives one replay of it runs (the native side counts them). */
  captureEnd(): { graph: bigint; ops: number } {
    this.ops.capturing = false;
    const graph = this.native.captureEnd();
    return { graph, ops: this.f64[SCRATCH.graphOps]! };
  }

  /** The capture's end when the captured function threw: what it recorded, if anything, is freed. */
  captureDrop(): void {
    this.ops.capturing = false;
    try {
      this.native.graphFree(this.native.captureEnd());
    } catch {
      // the capture was already invalid: the error that matters is the captured function's
    }
  }

  /** One launch of the graph: new collectives, one pass of the machine (replaying) for them all. */
  replay(graph: bigint, event: ReplayEvent): void {
    this.ops.runner.run(event, () => this.native.replay(graph, event.ops), REPLAY_PHASES);
  }

  graphFree(graph: bigint): void {
    this.native.graphFree(graph);
  }

  sync(): void {
    this.need('sync');
    this.native.deviceSync();
  }

  recordEvent(): bigint {
    this.need('recordEvent');
    return this.native.eventRecord();
  }

  elapsedMs(start: bigint, end: bigint): number {
    this.need('elapsedMs');
    return this.native.eventElapsed(start, end);
  }

  destroyEvent(event: bigint): void {
    this.need('destroyEvent');
    this.native.eventDestroy(event);
  }

  /** Mean ms of fn over `iters` runs, between two CUDA events on the rank's stream (destroyed after). */
  async timeIt(fn: (i: number) => Promise<unknown>, iters: number): Promise<number> {
    this.need('timeIt');
    checkPositiveInt('iters', iters);
    const n = this.native;
    const a = n.eventRecord();
    for (let i = 0; i < iters; i++) await fn(i);
    const b = n.eventRecord();
    try {
      return n.eventElapsed(a, b) / iters;
    } finally {
      n.eventDestroy(a);
      n.eventDestroy(b);
    }
  }

  benchAlltoAll(bytes: number, iters: number, warmup: number): number {
    this.need('benchAlltoAll');
    return this.native.benchAlltoAll(bytes, iters, warmup);
  }

  benchPeerCopy(bytes: number, iters: number, warmup: number): number {
    this.need('benchPeerCopy');
    return this.native.benchPeerCopy(bytes, iters, warmup);
  }

  benchAgrs(op: string, engine: 'kernel' | 'ce' | 'auto', bytes: number, iters: number): number {
    this.need('benchAgrs');
    return this.native.benchAgrs(op, engine, bytes, iters);
  }

  lastOpDeviceMs(): number {
    this.need('lastOpDeviceMs');
    return this.native.lastOpMs();
  }

  timeOps(on: unknown): void {
    this.need('timeOps');
    if (typeof on !== 'boolean') throw invalid('on', 'must be a boolean');
    this.native.setOpTiming(on);
  }

  occupySms(sms: number, ms: number): void {
    this.need('occupySms');
    this.native.occupy(sms, ms);
  }

  cudaStream(): bigint {
    this.need('cudaStream');
    return rankflowErrors(() => this.native.cudaStream());
  }

  cudaContext(): bigint {
    this.need('cudaContext');
    return rankflowErrors(() => this.native.cudaContext());
  }

  /** A device tensor over the application's memory (checked to be device memory of the rank's GPU; never freed here). */
  wrapDevice<D extends DType>(ptr: bigint, dtype: D, shape: number[], opts?: { owner?: unknown }): DeviceTensor<D> {
    this.need('wrapDevice');
    return externalTensor(this.native, ptr, dtype, shape, opts);
  }

  /** The rank's stream waits on the GPU for a CUevent recorded on any stream; not inside a capture. */
  waitEvent(event: bigint): void {
    this.need('waitEvent');
    if (typeof event !== 'bigint' || event <= 0n || event >= 1n << 64n) throw invalid('event', 'must be a CUevent address as a BigInt in (0, 2^64)');
    if (this.ops.capturing) throw new RankflowError('STATE', 'waitEvent inside rank.capture(): a graph cannot wait for an event recorded outside it');
    rankflowErrors(() => this.native.eventWait(event));
  }
}
