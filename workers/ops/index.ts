// The op table of one rank, the one place in workers/ that calls the rank's native context: for each
// operation, its tensors marshalled into one synchronous native call, run by the runner as one pass
// of the rank machine (event in, call, DONE / FAILED out), and its results made into tensors. Driver
// mode (comlink) and rank programs (workers/program.ts) both come through here; inputs are checked
// before (on the main thread, or by the program handle). RankOps holds the collectives; the context's
// other calls are its parts: ops.device (./device.ts, the cuda-only extras), ops.lifecycle
// (./lifecycle.ts, around the ops) and ops.session (./session.ts, session views and ops in flight).
import {
  COMBINE_ARG, DISPATCH_ARG, DISPATCH_DEVICE_ALLOC, DISPATCH_HOST, DISPATCH_IN_BUFFER, DISPATCH_PENDING, SCRATCH, loadAddon, type TensorArg,
  type NativeContext, type NativeDispatchOutputs,
} from '../../actors/core/addon.js';
import { DeviceTensor } from '../../actors/core/device-tensor.js';
import { HandleRegistry } from '../../actors/core/handles.js';
import { RankflowError } from '../../actors/core/errors.js';
import { ELEMENT_BYTES, fromBytes, numel, tensor, type DType, type Tensor } from '../../actors/core/tensor.js';
import type {
  CombineResult, DeviceCombineInput, DeviceCombineResult, DeviceDispatchInput, DeviceDispatchResult, DeviceOptions, DispatchResult,
} from '../../actors/core/types.js';
import type { CombineInput, DispatchHandle, DispatchInput } from '../../actors/core/validate.js';
import type { RankInit } from '../protocol.js';
import { EVENTS, PHASES, type RankRunner } from '../runner.js';
import { DeviceOps } from './device.js';
import { LifecycleOps } from './lifecycle.js';
import { SessionOps } from './session.js';
import { checkLiveOwners, refuseDegraded } from './membership.js';
import type { Membership } from '../protocol.js';

const OUT_NAMES = ['x', 'scales', 'topkIdx', 'topkWeights', 'srcRank', 'srcToken'] as const;

interface BufferViews {
  x: DeviceTensor<'bf16'>;
  x8: DeviceTensor<'fp8e4m3'>;
  scales: DeviceTensor<'fp32'>;
  topkIdx: DeviceTensor<'int32'>;
  topkWeights: DeviceTensor<'fp32'>;
  srcRank: DeviceTensor<'int32'>;
  srcToken: DeviceTensor<'int32'>;
}

/** free() of outputs left in the buffer: nothing to free (one function for every such result; named free, as before). */
const freeViews = { free: (): void => {} }.free;
/** the options of a call that passes none (read only: one object for every such call) */
const NO_OPTIONS: DeviceOptions = Object.freeze({});

export class RankOps {
  /** handles this rank's dispatches returned (rank programs check theirs against it) */
  readonly handles = new HandleRegistry();
  private readonly f64: Float64Array;
  private readonly u64: BigUint64Array;
  /** @internal the engram table's row type and entries (rank programs' async fetches shape their rows with it) */
  engram: { dtype: DType; rowShape: number[]; entries: number } | null = null;
  /** the receive buffer's regions as device tensors: the outputs of every outputsInBuffer dispatch (x8: x as fp8) */
  private views: BufferViews | null = null;
  /** the cuda-only calls of rank programs: device tensors, graphs, events, baselines, interop (./device.ts) */
  readonly device: DeviceOps;
  /** the rank's calls around its ops: exports, NCCL, scale-out, info, probes, counts, recover, destroy (./lifecycle.ts) */
  readonly lifecycle: LifecycleOps;
  /** the native side of rank programs' session views and asynchronous ops: regions, views, issue, wait (./session.ts) */
  readonly session: SessionOps;
  /** elastic groups: the membership the rank was last told (null: every rank serves; ./membership.ts) */
  membership: Membership | null = null;

  constructor(
    readonly init: RankInit,
    private readonly native: NativeContext,
    readonly runner: RankRunner,
  ) {
    this.f64 = new Float64Array(native.scratch);
    this.u64 = new BigUint64Array(native.scratch);
    this.device = new DeviceOps(this, native);
    this.lifecycle = new LifecycleOps(this, native);
    this.session = new SessionOps(native);
  }

  register(peers: Array<{ deviceFd: number; hostFd: number }>): void {
    this.run(EVENTS.register, () => this.native.importPeers(peers));
  }

  barrier(withCpuSync: boolean): void {
    if (this.capturing) return this.native.barrier(withCpuSync);
    const r = this.runner;
    r.enter(withCpuSync ? EVENTS.barrierCpuSync : EVENTS.barrier);
    try {
      this.native.barrier(withCpuSync);
    } catch (e) {
      r.fail(e);
    }
    r.done(withCpuSync ? PHASES.barrierCpuSync : PHASES.barrier);
  }

  /** Host tensors in and out; device tensors (cuda rank programs) in, a device tensor out. */
  allGather(t: Tensor | DeviceTensor): Tensor | DeviceTensor {
    const W = this.init.worldSize;
    const shape = [W * (t.shape[0] ?? 1), ...t.shape.slice(1)];
    const bytes = numel(t.shape) * ELEMENT_BYTES[t.dtype];
    if (t instanceof DeviceTensor) {
      return this.intoNew(t.dtype, shape, bytes * W, (out) => this.run(EVENTS.allGather, () => this.native.allGather(t.ptr, bytes, out)));
    }
    const out = new Uint8Array(bytes * W);
    this.run(EVENTS.allGather, () => this.native.allGather(t.data, bytes, out));
    return fromBytes(t.dtype, shape, out);
  }

  /** The sum over the ranks of t (fp32 or bf16; every rank's of the same shape), on every rank: into t with inPlace, else a new tensor. */
  allReduce(t: Tensor | DeviceTensor, inPlace: boolean): Tensor | DeviceTensor {
    refuseDegraded(this.membership, this.init.worldSize, 'allReduce');
    const n = numel(t.shape), bf16 = t.dtype === 'bf16';
    if (t instanceof DeviceTensor) {
      // Allocated while a graph is captured, the output belongs to the graph (every replay writes it).
      const out = inPlace ? t : new DeviceTensor(this.native, t.dtype, t.shape, this.native.deviceAlloc(Math.max(t.bytes, 16)), !this.capturing);
      try {
        this.run(EVENTS.allReduce, () => this.native.allReduce(t.ptr, n, bf16, out.ptr));
      } catch (e) {
        if (out !== t) out.free();
        throw e;
      }
      return out;
    }
    const out = inPlace ? t : tensor(t.dtype, t.shape);
    this.run(EVENTS.allReduce, () => this.native.allReduce(t.data, n, bf16, out.data));
    return out;
  }

  private handleOf(id: number, numTokens: number, numRecv: number): DispatchHandle {
    const h: DispatchHandle = Object.freeze({ group: this.init.groupId, rank: this.init.rank, id, seq: this.runner.seq(), numTokens, numRecv });
    this.handles.add(h);
    return h;
  }

  /** The counts the native side left in the scratch, as a fresh array (a plain loop: Array.from over a
   *  typed array walks an iterator, ~8 µs for 256 experts on the GPU machine's CPU, the largest part of
   *  a cached dispatch's CPU cost when measured). */
  private tokensPerExpert(): number[] {
    const n = this.init.buffer.numExperts / this.init.worldSize;
    const out = new Array<number>(n);
    const f = this.f64, at = SCRATCH.tokensPerExpert;
    for (let e = 0; e < n; e++) out[e] = f[at + e]!;
    return out;
  }

  /** While a graph is captured, ops only record (nothing runs, no collective happens): no machine pass. */
  capturing = false;

  private run<T>(event: Parameters<RankRunner['run']>[0], fn: () => T, phases?: readonly string[]): T {
    return this.capturing ? fn() : this.runner.run(event, fn, phases);
  }

  /** A collective `call` into a new device tensor of `bytes` (its address): the tensor, freed again if the call fails. */
  private intoNew(dtype: DType, shape: number[], bytes: number, call: (out: bigint) => void): DeviceTensor {
    const out = new DeviceTensor(this.native, dtype, shape, this.native.deviceAlloc(bytes));
    try {
      call(out.ptr);
    } catch (e) {
      out.free();
      throw e;
    }
    return out;
  }

  /** A combine's numbers, into the scratch's args words (addon.ts COMBINE_ARG) just before its call. */
  private combineArgs(handle: number, numSms: number, xRows: number): void {
    const a = this.f64, at = SCRATCH.args;
    a[at + COMBINE_ARG.handle] = handle;
    a[at + COMBINE_ARG.numSms] = numSms;
    a[at + COMBINE_ARG.xRows] = xRows;
  }

  // A dispatch whose CPU-sync wait outlasts its spin comes back PENDING: the machine shows the wait
  // (dispatching.cpuSync) and the resume blocks for it. One native call otherwise; no closure.
  private dispatchCall(x: TensorArg, scales: TensorArg, idx: TensorArg, w: TensorArg, T: number, elem: number, align: number,
    handle: number, numSms: number, mode: number, phases: readonly string[]): NativeDispatchOutputs | undefined {
    const n = this.native, a = this.f64, at = SCRATCH.args;
    a[at + DISPATCH_ARG.numTokens] = T;
    a[at + DISPATCH_ARG.xElemBytes] = elem;
    a[at + DISPATCH_ARG.expertAlignment] = align;
    a[at + DISPATCH_ARG.handle] = handle;
    a[at + DISPATCH_ARG.numSms] = numSms;
    a[at + DISPATCH_ARG.mode] = mode;
    if (this.capturing) return n.dispatch(x, scales, idx, w) as NativeDispatchOutputs | undefined;
    const r = this.runner;
    r.enter(EVENTS.dispatch);
    let out: NativeDispatchOutputs | number | undefined;
    try {
      out = n.dispatch(x, scales, idx, w) as NativeDispatchOutputs | number | undefined;
      if (out === DISPATCH_PENDING) {
        r.waiting();
        out = n.dispatchResume() as NativeDispatchOutputs | undefined;
      }
    } catch (e) {
      r.fail(e);
    }
    r.done(phases);
    return out as NativeDispatchOutputs | undefined;
  }

  dispatch(d: DispatchInput): DispatchResult {
    const { hidden } = this.init.buffer;
    const T = d.x.shape[0]!;
    const fp8 = d.x.dtype === 'fp8e4m3';
    const out = this.dispatchCall(d.x.data, d.scales?.data, d.topkIdx, d.topkWeights, T, ELEMENT_BYTES[d.x.dtype], d.expertAlignment ?? 1,
      d.handle?.id ?? 0, 0, DISPATCH_HOST, d.handle ? PHASES.dispatchCached : PHASES.dispatch)!;
    const R = this.f64[SCRATCH.numRecv]!;
    return {
      x: tensor(d.x.dtype, [R, hidden], out.x as never),
      ...(fp8 ? { scales: tensor('fp32', [R, hidden / 128], out.scales!) } : {}),
      topkIdx: out.topkIdx,
      topkWeights: out.topkWeights,
      srcRank: out.srcRank,
      srcToken: out.srcToken,
      tokensPerExpert: this.tokensPerExpert(),
      handle: this.handleOf(this.f64[SCRATCH.layoutId]!, T, R),
      ...(this.init.elastic ? { maskedSlots: this.f64[SCRATCH.maskedSlots]! } : {}),
    };
  }

  combine(c: CombineInput, bias: Tensor[]): CombineResult {
    const { hidden, topk } = this.init.buffer;
    const T = c.handle.numTokens;
    const x = new Uint16Array(T * hidden), w = new Float32Array(T * topk);
    this.combineArgs(c.handle.id, 0, c.x.shape[0]!);
    this.run(EVENTS.combine, () => this.native.combine(c.x.data, c.topkWeights, bias[0]?.data, bias[1]?.data, x, w));
    return { x: tensor('bf16', [T, hidden], x), topkWeights: w };
  }

  /** The buffer's receive regions as device tensors (views: free() forgets them), for worst-case rows; made once. */
  private bufferViews(): BufferViews {
    if (!this.views) {
      const { hidden, topk, maxTokensPerRank } = this.init.buffer;
      const rows = this.init.worldSize * maxTokensPerRank;
      const info = this.native.info();
      const base = info.window + BigInt(info.workspaceBytes);
      const layout = loadAddon().layout(this.init.buffer, this.init.worldSize).buffer;
      const view = <D extends DType>(dtype: D, shape: number[], off: number) => new DeviceTensor(this.native, dtype, shape, base + BigInt(off), false);
      this.views = {
        x: view('bf16', [rows, hidden], layout.x), x8: view('fp8e4m3', [rows, hidden], layout.x),
        scales: view('fp32', [rows, hidden / 128], layout.scales), topkIdx: view('int32', [rows, topk], layout.topkIdx),
        topkWeights: view('fp32', [rows, topk], layout.topkWeights), srcRank: view('int32', [rows], layout.srcRank),
        srcToken: view('int32', [rows], layout.srcToken),
      };
    }
    return this.views;
  }
  /** cuda rank programs: dispatch of device tensors. */
  dispatchDevice(d: DeviceDispatchInput, opts: DeviceOptions = NO_OPTIONS): DeviceDispatchResult {
    const inBuffer = opts.outputsInBuffer === true;
    const T = d.x.shape[0]!;
    const fp8 = d.x.dtype === 'fp8e4m3';
    const phases = d.handle ? PHASES.dispatchCached : inBuffer ? PHASES.dispatchNoSync : PHASES.dispatch;
    this.dispatchCall(d.x.ptr, d.scales?.ptr, d.topkIdx?.ptr, d.topkWeights?.ptr, T, ELEMENT_BYTES[d.x.dtype], d.expertAlignment ?? 1,
      d.handle?.id ?? 0, opts.numSms ?? 0, inBuffer ? DISPATCH_IN_BUFFER : DISPATCH_DEVICE_ALLOC, phases);
    const numRecv = this.f64[SCRATCH.numRecv]!;
    const known = numRecv >= 0;
    const handle = this.handleOf(this.f64[SCRATCH.layoutId]!, T, known ? numRecv : -1);
    const tokensPerExpert = known ? this.tokensPerExpert() : null;
    if (inBuffer) {
      // Two literals (no spread), the keys in the same order: scales comes after x, fp8 only.
      const v = this.bufferViews(), R = known ? numRecv : null;
      return fp8
        ? { x: v.x8, scales: v.scales, topkIdx: v.topkIdx, topkWeights: v.topkWeights, srcRank: v.srcRank, srcToken: v.srcToken, numRecv: R, tokensPerExpert, handle, free: freeViews }
        : { x: v.x, topkIdx: v.topkIdx, topkWeights: v.topkWeights, srcRank: v.srcRank, srcToken: v.srcToken, numRecv: R, tokensPerExpert, handle, free: freeViews };
    }
    const { hidden, topk } = this.init.buffer;
    const R = numRecv;
    const shapes: Record<string, number[]> = { x: [R, hidden], scales: [R, hidden / 128], topkIdx: [R, topk], topkWeights: [R, topk], srcRank: [R], srcToken: [R] };
    const dtypes: Record<string, DType> = { x: d.x.dtype, scales: 'fp32', topkIdx: 'int32', topkWeights: 'fp32', srcRank: 'int32', srcToken: 'int32' };
    const out: Record<string, DeviceTensor> = {};
    OUT_NAMES.forEach((n, i) => {
      if (n === 'scales' && !fp8) return;
      out[n] = new DeviceTensor(this.native, dtypes[n]!, shapes[n]!, this.u64[SCRATCH.addresses + i]!);
    });
    return {
      x: out.x!, ...(out.scales ? { scales: out.scales as DeviceTensor<'fp32'> } : {}), topkIdx: out.topkIdx as DeviceTensor<'int32'>,
      topkWeights: out.topkWeights as DeviceTensor<'fp32'>, srcRank: out.srcRank as DeviceTensor<'int32'>, srcToken: out.srcToken as DeviceTensor<'int32'>,
      numRecv: R, tokensPerExpert, handle, free: () => { for (const t of Object.values(out)) t.free(); },
    };
  }

  /** cuda rank programs: combine of device tensors; x must not lie in the receive buffer. */
  combineDevice(c: DeviceCombineInput, bias: readonly DeviceTensor[], opts: DeviceOptions = NO_OPTIONS): DeviceCombineResult {
    const capturing = this.capturing;
    const { hidden, topk } = this.init.buffer;
    const T = c.handle.numTokens;
    const n = this.native;
    const ox = opts.out ? opts.out.x.ptr : 0n, ow = opts.out ? opts.out.topkWeights.ptr : 0n;
    this.combineArgs(c.handle.id, opts.numSms ?? 0, c.x.shape[0]!);
    if (capturing) n.combine(c.x.ptr, c.topkWeights?.ptr, bias[0]?.ptr, bias[1]?.ptr, ox, ow);
    else {
      const r = this.runner;
      r.enter(EVENTS.combine);
      try {
        n.combine(c.x.ptr, c.topkWeights?.ptr, bias[0]?.ptr, bias[1]?.ptr, ox, ow);
      } catch (e) {
        r.fail(e);
      }
      r.done();
    }
    if (opts.out) return { x: opts.out.x, topkWeights: opts.out.topkWeights };
    // Outputs allocated while a graph is captured belong to the graph (every replay writes them).
    return {
      x: new DeviceTensor(this.native, 'bf16', [T, hidden], this.u64[SCRATCH.addresses + 6]!, !capturing),
      topkWeights: new DeviceTensor(this.native, 'fp32', [T, topk], this.u64[SCRATCH.addresses + 7]!, !capturing),
    };
  }

  sessionOpen(maxBytes: number, maxAllGathers: number): void {
    refuseDegraded(this.membership, this.init.worldSize, 'openSession');
    this.run(EVENTS.sessionOpen, () => this.native.sessionOpen(maxBytes, maxAllGathers));
  }

  // A session collective of a tensor that is not a view of the session's buffer: copied in, and out
  // into a host tensor, or on cuda a device tensor of its own (a pass of the machine even while capturing).
  sessionAllGather(t: Tensor | DeviceTensor): Tensor | DeviceTensor {
    const W = this.init.worldSize;
    const bytes = numel(t.shape) * ELEMENT_BYTES[t.dtype];
    const shape = [W * (t.shape[0] ?? 1), ...t.shape.slice(1)];
    if (t instanceof DeviceTensor) {
      const call = (out: bigint) => this.runner.run(EVENTS.sessionAllGather, () => this.native.sessionAllGather(t.ptr, bytes, out));
      return this.intoNew(t.dtype, shape, bytes * W, call);
    }
    const out = new Uint8Array(bytes * W);
    this.run(EVENTS.sessionAllGather, () => this.native.sessionAllGather(t.data, bytes, out));
    return fromBytes(t.dtype, shape, out);
  }

  sessionReduceScatter(t: Tensor | DeviceTensor): Tensor | DeviceTensor {
    const W = this.init.worldSize;
    const n = numel(t.shape) / W;
    const shape = [t.shape[0]! / W, ...t.shape.slice(1)];
    if (t instanceof DeviceTensor) {
      const call = (out: bigint) => this.runner.run(EVENTS.sessionReduceScatter, () => this.native.sessionReduceScatter(t.ptr, n, t.dtype === 'bf16', out));
      return this.intoNew(t.dtype, shape, n * ELEMENT_BYTES[t.dtype], call);
    }
    const out = t.dtype === 'bf16' ? new Uint16Array(n) : new Float32Array(n);
    this.run(EVENTS.sessionReduceScatter, () => this.native.sessionReduceScatter(t.data, n, t.dtype === 'bf16', out));
    return tensor(t.dtype, shape, out as never);
  }

  sessionClose(): void {
    this.run(EVENTS.sessionClose, () => this.native.sessionClose());
  }

  engramWrite(t: Tensor): void {
    const [entries, ...row] = t.shape;
    const rowBytes = numel(row) * ELEMENT_BYTES[t.dtype];
    this.run(EVENTS.engramWrite, () => this.native.engramWrite(t.data, entries!, rowBytes));
    this.engram = { dtype: t.dtype, rowShape: row, entries: entries! };
  }

  /** Entries per rank of the stored engram table, -1 if none is. */
  get engramEntries(): number {
    return this.engram?.entries ?? -1;
  }

  engramFetch(ids: Int32Array): Tensor {
    const meta = this.engram;
    // Refused before the machine moves: nothing is fetched, the rank stays ready.
    if (!meta) throw new RankflowError('STATE', 'engramFetch before engramWrite: no table is stored', { rank: this.init.rank, state: this.runner.state() });
    checkLiveOwners(this.membership, this.init.worldSize, meta.entries, ids);
    const rowBytes = numel(meta.rowShape) * ELEMENT_BYTES[meta.dtype];
    const out = new Uint8Array(ids.length * rowBytes);
    this.run(EVENTS.engramFetch, () => this.native.engramFetch(ids, out));
    return fromBytes(meta.dtype, [ids.length, ...meta.rowShape], out);
  }

  ppExchange(t: Tensor): Tensor {
    refuseDegraded(this.membership, this.init.worldSize, 'ppExchange');
    const bytes = numel(t.shape) * ELEMENT_BYTES[t.dtype];
    const out = new Uint8Array(bytes);
    this.run(EVENTS.ppExchange, () => this.native.ppExchange(t.data, bytes, out));
    return fromBytes(t.dtype, [...t.shape], out);
  }
}
