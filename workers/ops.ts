// The operations of one rank inside its worker: tensors in, native phases run as the rank machine's
// states, tensors out. Driver mode reaches them through comlink (results transferred, not copied);
// rank programs call them directly through `programHandle()`.
import * as Comlink from 'comlink/dist/esm/comlink.mjs';

import type { RankEvent } from '../machines/index.js';
import type { NativeContext, NativeDispatchInput, NativeDispatchOutput, NativeDispatchRun } from '../actors/core/addon.js';
import { invalid } from '../actors/core/errors.js';
import { DeviceTensor, deviceTensor, isDeviceTensor } from '../actors/core/device-tensor.js';
import { bytesOf, checkArray, checkTensor, ELEMENT_BYTES, fromBytes, numel, tensor, type DType, type Tensor } from '../actors/core/tensor.js';
import {
  checkCombineInput, checkDispatchInput, checkHandle, checkPositiveInt, type BufferConfig, type CombineInput, type DispatchHandle, type DispatchInput,
} from '../actors/core/validate.js';
import { stagedPhases } from './staged.js';

export interface RankInit {
  rank: number;
  worldSize: number;
  ranksPerNode: number;
  groupId: string;
  buffer: BufferConfig;
  cpuSeconds: number;
  gpuSeconds: number;
  inspect: boolean;
  backend: 'host' | 'cuda';
  /** cuda: the rank's GPU ordinal */
  device?: number;
}

export interface DispatchResult {
  x: Tensor;
  scales?: Tensor;
  topkIdx: Int32Array;
  topkWeights: Float32Array;
  srcRank: Int32Array;
  srcToken: Int32Array;
  tokensPerExpert: number[];
  handle: DispatchHandle;
}

/** Dispatch of device tensors (cuda rank programs). With outputsInBuffer the tensors are views of the
 *  receive buffer sized for the worst case (W * maxTokensPerRank rows; the first numRecv are the
 *  tokens), valid until the next dispatch or combine, and numRecv/tokensPerExpert are null (no CPU sync). */
export interface DeviceDispatchResult {
  x: DeviceTensor;
  scales?: DeviceTensor<'fp32'>;
  topkIdx: DeviceTensor<'int32'>;
  topkWeights: DeviceTensor<'fp32'>;
  srcRank: DeviceTensor<'int32'>;
  srcToken: DeviceTensor<'int32'>;
  numRecv: number | null;
  tokensPerExpert: number[] | null;
  handle: DispatchHandle;
  /** frees every output (no-op for outputs left in the buffer) */
  free(): void;
}

export interface DeviceDispatchInput {
  x: DeviceTensor;
  scales?: DeviceTensor;
  topkIdx?: DeviceTensor;
  topkWeights?: DeviceTensor;
  expertAlignment?: number;
  handle?: DispatchHandle;
}
export interface DeviceCombineInput {
  x: DeviceTensor;
  handle: DispatchHandle;
  topkWeights?: DeviceTensor;
  bias?: DeviceTensor | DeviceTensor[];
}
export interface DeviceOptions {
  /** dispatch: leave the outputs in the receive buffer, no CPU sync (the kernels' zero-copy path) */
  outputsInBuffer?: boolean;
  /** SMs (blocks) of the data/combine kernel; 0 = all */
  numSms?: number;
}

export interface CombineResult {
  x: Tensor<'bf16'>;
  topkWeights: Float32Array;
}

type Phases = Partial<Record<string, () => Promise<unknown>>>;
type Request = <T>(event: RankEvent & { call: number }, phases: Phases) => Promise<T>;

const buffersOf = (...arrays: Array<ArrayBufferView | undefined>): ArrayBuffer[] =>
  [...new Set(arrays.filter((a): a is ArrayBufferView => a !== undefined).map((a) => a.buffer as ArrayBuffer))];

export class RankOps {
  private engram: { dtype: DType; rowShape: number[] } | null = null;

  constructor(
    private readonly init: RankInit,
    private readonly native: NativeContext,
    private readonly request: Request,
    private readonly newCall: () => number,
    private readonly seqNow: () => number = () => 0,
  ) {}

  barrier(withCpuSync = false): Promise<void> {
    if (!withCpuSync) return this.request({ type: 'BARRIER', call: this.newCall(), withCpuSync }, { barrierDevice: () => this.native.barrier(false) });
    // Both rounds in one native job; the phases observe it (workers/staged.ts).
    const [barrierDevice, barrierCpuSync] = stagedPhases(2, (progress) => this.native.barrierRun(true, progress));
    return this.request({ type: 'BARRIER', call: this.newCall(), withCpuSync }, { barrierDevice, barrierCpuSync });
  }

  async allGather(t: Tensor): Promise<Tensor> {
    const out = await this.request<Uint8Array>({ type: 'ALL_GATHER', call: this.newCall() }, {
      allGather: () => this.native.allGather(bytesOf(t)),
    });
    return fromBytes(t.dtype, [this.init.worldSize * (t.shape[0] ?? 1), ...t.shape.slice(1)], out);
  }

  async dispatch(d: DispatchInput): Promise<DispatchResult> {
    const { hidden, topk } = this.init.buffer;
    const fp8 = d.x.dtype === 'fp8e4m3';
    const numTokens = d.x.shape[0]!;
    const input: NativeDispatchInput = {
      numTokens,
      x: d.x.data as Uint8Array | Uint16Array,
      xElemBytes: ELEMENT_BYTES[d.x.dtype],
      scales: d.scales?.data as Float32Array | undefined,
      topkIdx: d.topkIdx,
      // absent only with a handle: the native layout replays the weights of the dispatch that made it
      ...(d.topkWeights ? { topkWeights: d.topkWeights } : {}),
      expertAlignment: d.expertAlignment ?? 1,
      ...(d.handle ? { handle: d.handle.id } : {}),
    };
    let layoutId = 0;
    let counts = { numRecv: 0, tokensPerExpert: [] as number[] };
    return this.request<DispatchResult>({ type: 'DISPATCH', call: this.newCall() }, {
      dispatchNotify: async () => {
        layoutId = await this.native.dispatchNotify(input);
      },
      dispatchCpuSync: async () => {
        counts = await this.native.dispatchWait(layoutId);
      },
      dispatchData: async () => {
        const R = counts.numRecv;
        const out: NativeDispatchOutput = {
          x: fp8 ? new Uint8Array(R * hidden) : new Uint16Array(R * hidden),
          ...(fp8 ? { scales: new Float32Array(R * (hidden / 128)) } : {}),
          topkIdx: new Int32Array(R * topk),
          topkWeights: new Float32Array(R * topk),
          srcRank: new Int32Array(R),
          srcToken: new Int32Array(R),
        };
        await this.native.dispatchData(layoutId, input, out);
        const handle: DispatchHandle = Object.freeze({
          group: this.init.groupId, rank: this.init.rank, id: layoutId, seq: this.seqNow(), numTokens, numRecv: R,
        });
        return {
          x: tensor(d.x.dtype, [R, hidden], out.x as never),
          ...(out.scales ? { scales: tensor('fp32', [R, hidden / 128], out.scales) } : {}),
          topkIdx: out.topkIdx,
          topkWeights: out.topkWeights,
          srcRank: out.srcRank,
          srcToken: out.srcToken,
          tokensPerExpert: counts.tokensPerExpert,
          handle,
        } satisfies DispatchResult;
      },
    });
  }

  async combine(c: CombineInput, bias: Tensor[]): Promise<CombineResult> {
    const { hidden, topk } = this.init.buffer;
    const T = c.handle.numTokens;
    const out = { x: new Uint16Array(T * hidden), topkWeights: new Float32Array(T * topk) };
    await this.request({ type: 'COMBINE', call: this.newCall() }, {
      combine: () => this.native.combine({
        handle: c.handle.id,
        x: c.x.data as Uint16Array,
        ...(c.topkWeights ? { topkWeights: c.topkWeights } : {}),
        ...(bias[0] ? { bias0: bias[0].data as Uint16Array } : {}),
        ...(bias[1] ? { bias1: bias[1].data as Uint16Array } : {}),
      }, out),
    });
    return { x: tensor('bf16', [T, hidden], out.x), topkWeights: out.topkWeights };
  }

  /** cuda rank programs: dispatch of device tensors, the same three phases (notify -> cpuSync -> data). */
  async dispatchDevice(d: DeviceDispatchInput, opts: DeviceOptions = {}): Promise<DeviceDispatchResult> {
    const { hidden, topk, maxTokensPerRank } = this.init.buffer;
    const W = this.init.worldSize;
    const fp8 = d.x.dtype === 'fp8e4m3';
    const numTokens = d.x.shape[0]!;
    const inBuffer = opts.outputsInBuffer === true;
    const input = {
      device: true, numTokens, x: d.x.ptr, xElemBytes: ELEMENT_BYTES[d.x.dtype], numSms: opts.numSms ?? 0,
      ...(d.scales ? { scales: d.scales.ptr } : {}),
      ...(d.topkIdx ? { topkIdx: d.topkIdx.ptr } : {}),
      ...(d.topkWeights ? { topkWeights: d.topkWeights.ptr } : {}),
      expertAlignment: d.expertAlignment ?? 1,
      ...(d.handle ? { handle: d.handle.id } : {}),
    } as unknown as NativeDispatchInput;
    const mem = this.native;
    // The fast path: notify, the CPU sync (outputs allocated natively once the counts are known) or
    // none (outputs left in the buffer), and data run as one native job, GPU launches back to back;
    // the machine's three phases resolve as the job reports them (workers/staged.ts).
    const [dispatchNotify, dispatchCpuSync, run] = stagedPhases(3, (progress) => this.native.dispatchRun(input, { alloc: !inBuffer }, progress));
    return this.request<DeviceDispatchResult>({ type: 'DISPATCH', call: this.newCall() }, {
      dispatchNotify,
      dispatchCpuSync,
      dispatchData: async () => {
        const at = (await run!()) as NativeDispatchRun;
        const R = at.numRecv ?? null;
        const rows = R ?? W * maxTokensPerRank;
        const shapes = {
          x: [rows, hidden], scales: [rows, hidden / 128], topkIdx: [rows, topk], topkWeights: [rows, topk], srcRank: [rows], srcToken: [rows],
        } as const;
        const dtypes = { x: d.x.dtype, scales: 'fp32', topkIdx: 'int32', topkWeights: 'fp32', srcRank: 'int32', srcToken: 'int32' } as const;
        const names = ['x', ...(fp8 ? ['scales'] as const : []), 'topkIdx', 'topkWeights', 'srcRank', 'srcToken'] as const;
        const out: Record<string, DeviceTensor> = {};
        // Outputs in the buffer are views (free() forgets them); allocated ones are the caller's to free.
        for (const n of names) out[n] = new DeviceTensor(mem, dtypes[n], [...shapes[n]], at[n]!, !inBuffer);
        const handle: DispatchHandle = Object.freeze({
          group: this.init.groupId, rank: this.init.rank, id: at.id, seq: this.seqNow(), numTokens, numRecv: R ?? -1,
        });
        return {
          x: out.x!, ...(out.scales ? { scales: out.scales as DeviceTensor<'fp32'> } : {}),
          topkIdx: out.topkIdx as DeviceTensor<'int32'>, topkWeights: out.topkWeights as DeviceTensor<'fp32'>,
          srcRank: out.srcRank as DeviceTensor<'int32'>, srcToken: out.srcToken as DeviceTensor<'int32'>,
          numRecv: R, tokensPerExpert: at.tokensPerExpert ?? null, handle,
          free: () => { for (const t of Object.values(out)) t.free(); },
        };
      },
    });
  }

  /** cuda rank programs: combine of device tensors; x must not lie in the receive buffer. */
  async combineDevice(c: DeviceCombineInput, bias: DeviceTensor[], opts: DeviceOptions = {}): Promise<{ x: DeviceTensor<'bf16'>; topkWeights: DeviceTensor<'fp32'> }> {
    const { hidden, topk } = this.init.buffer;
    const T = c.handle.numTokens;
    // The outputs are allocated natively in the combine's own job (no synchronous round trips).
    const at = (await this.request({ type: 'COMBINE', call: this.newCall() }, {
      combine: () => this.native.combine({
        device: true, handle: c.handle.id, x: c.x.ptr, numSms: opts.numSms ?? 0,
        ...(c.topkWeights ? { topkWeights: c.topkWeights.ptr } : {}),
        ...(bias[0] ? { bias0: bias[0].ptr } : {}),
        ...(bias[1] ? { bias1: bias[1].ptr } : {}),
      } as never, { alloc: true } as never),
    })) as unknown as { x: bigint; topkWeights: bigint };
    return { x: new DeviceTensor(this.native, 'bf16', [T, hidden], at.x), topkWeights: new DeviceTensor(this.native, 'fp32', [T, topk], at.topkWeights) };
  }

  sessionOpen(maxBytes: number, maxAllGathers: number): Promise<void> {
    return this.request({ type: 'SESSION_OPEN', call: this.newCall() }, {
      sessionOpen: () => this.native.sessionOpen(maxBytes, maxAllGathers),
    });
  }

  async sessionAllGather(t: Tensor): Promise<Tensor> {
    const out = await this.request<Uint8Array>({ type: 'SESSION_ALL_GATHER', call: this.newCall() }, {
      sessionAllGather: () => this.native.sessionAllGather(bytesOf(t)),
    });
    return fromBytes(t.dtype, [this.init.worldSize * (t.shape[0] ?? 1), ...t.shape.slice(1)], out);
  }

  async sessionReduceScatter(t: Tensor): Promise<Tensor> {
    const W = this.init.worldSize;
    const out = await this.request<Float32Array | Uint16Array>({ type: 'SESSION_REDUCE_SCATTER', call: this.newCall() }, {
      sessionReduceScatter: () => this.native.sessionReduceScatter(t.data as Float32Array | Uint16Array, t.dtype === 'bf16'),
    });
    return tensor(t.dtype, [t.shape[0]! / W, ...t.shape.slice(1)], out as never);
  }

  sessionClose(): Promise<void> {
    return this.request({ type: 'SESSION_CLOSE', call: this.newCall() }, { sessionClose: () => this.native.sessionClose() });
  }

  async engramWrite(t: Tensor): Promise<void> {
    const [entries, ...row] = t.shape;
    const rowBytes = numel(row) * ELEMENT_BYTES[t.dtype];
    await this.request({ type: 'ENGRAM_WRITE', call: this.newCall() }, {
      engramWrite: () => this.native.engramWrite(t.data, entries!, rowBytes),
    });
    this.engram = { dtype: t.dtype, rowShape: row };
  }

  async engramFetch(ids: Int32Array): Promise<Tensor> {
    const meta = this.engram;
    const out = await this.request<Uint8Array>({ type: 'ENGRAM_FETCH', call: this.newCall() }, {
      engramFetch: () => this.native.engramFetch(ids),
    });
    return fromBytes(meta!.dtype, [ids.length, ...meta!.rowShape], out);
  }

  async ppExchange(t: Tensor): Promise<Tensor> {
    const out = await this.request<Uint8Array>({ type: 'PP_EXCHANGE', call: this.newCall() }, {
      ppExchange: () => this.native.ppExchange(bytesOf(t)),
    });
    return fromBytes(t.dtype, [...t.shape], out);
  }

  /** Comlink-facing methods: inputs were already checked on the main thread; results are transferred. */
  driverApi() {
    return {
      barrier: (withCpuSync: boolean) => this.barrier(withCpuSync),
      allGather: async (t: Tensor) => { const r = await this.allGather(t); return Comlink.transfer(r, buffersOf(r.data)); },
      dispatch: async (d: DispatchInput) => {
        const r = await this.dispatch(d);
        return Comlink.transfer(r, buffersOf(r.x.data, r.scales?.data, r.topkIdx, r.topkWeights, r.srcRank, r.srcToken));
      },
      combine: async (c: CombineInput, bias: Tensor[]) => {
        const r = await this.combine(c, bias);
        return Comlink.transfer(r, buffersOf(r.x.data, r.topkWeights));
      },
      sessionOpen: (maxBytes: number, maxAllGathers: number) => this.sessionOpen(maxBytes, maxAllGathers),
      sessionAllGather: async (t: Tensor) => { const r = await this.sessionAllGather(t); return Comlink.transfer(r, buffersOf(r.data)); },
      sessionReduceScatter: async (t: Tensor) => { const r = await this.sessionReduceScatter(t); return Comlink.transfer(r, buffersOf(r.data)); },
      sessionClose: () => this.sessionClose(),
      engramWrite: (t: Tensor) => this.engramWrite(t),
      engramFetch: async (ids: Int32Array) => { const r = await this.engramFetch(ids); return Comlink.transfer(r, buffersOf(r.data)); },
      ppExchange: async (t: Tensor) => { const r = await this.ppExchange(t); return Comlink.transfer(r, buffersOf(r.data)); },
    };
  }

  /** The `rank` a rank program receives: the same operations, checked here, with no thread hop. */
  programHandle() {
    const { rank, worldSize, buffer, groupId } = this.init;
    const self = this;
    // Rank programs skip the main thread, so their inputs are checked here (same checks, same
    // EINVAL messages); all methods are async, so a bad input rejects rather than throws.
    const cuda = this.init.backend === 'cuda';
    const native = this.native;
    const needCuda = (what: string) => {
      if (!cuda) throw invalid(what, "needs backend 'cuda' (device tensors and CUDA events)");
    };
    function dispatch(d: DeviceDispatchInput, opts?: DeviceOptions): Promise<DeviceDispatchResult>;
    function dispatch(d: DispatchInput): Promise<DispatchResult>;
    async function dispatch(d: DispatchInput | DeviceDispatchInput, opts?: DeviceOptions): Promise<DispatchResult | DeviceDispatchResult> {
      if (isDeviceTensor((d as DeviceDispatchInput)?.x)) {
        checkDeviceDispatch('input', d as DeviceDispatchInput, buffer, rank, groupId);
        return self.dispatchDevice(d as DeviceDispatchInput, opts);
      }
      checkDispatchInput('input', d, buffer, worldSize, rank, groupId);
      return self.dispatch(d as DispatchInput);
    }
    function combine(c: DeviceCombineInput, opts?: DeviceOptions): Promise<{ x: DeviceTensor<'bf16'>; topkWeights: DeviceTensor<'fp32'> }>;
    function combine(c: CombineInput): Promise<CombineResult>;
    async function combine(c: CombineInput | DeviceCombineInput, opts?: DeviceOptions): Promise<unknown> {
      if (isDeviceTensor((c as DeviceCombineInput)?.x)) return self.combineDevice(c as DeviceCombineInput, checkDeviceCombine('input', c as DeviceCombineInput, buffer, rank, groupId), opts);
      return self.combine(c as CombineInput, checkCombineInput('input', c, buffer, rank, groupId));
    }
    return {
      rank,
      worldSize,
      backend: this.init.backend,
      /** host: a host tensor; cuda: a device tensor on this rank's GPU (free() it, or it goes with the group) */
      tensor: ((dtype: DType, shape: number[], data?: ArrayBufferView) =>
        cuda ? deviceTensor(native, dtype, shape, data) : tensor(dtype, shape, data as never)) as {
        <D extends DType>(dtype: D, shape: number[], data?: Tensor<D>['data']): Tensor<D> & DeviceTensor<D>;
      },
      hostTensor: tensor,
      async barrier(opts: { withCpuSync?: boolean } = {}) {
        if (opts === null || typeof opts !== 'object') throw invalid('options', 'must be { withCpuSync? }');
        if (opts.withCpuSync !== undefined && typeof opts.withCpuSync !== 'boolean') throw invalid('withCpuSync', 'must be a boolean');
        return self.barrier(opts.withCpuSync ?? false);
      },
      async allGather(t: Tensor) {
        checkTensor('input', t);
        return self.allGather(t);
      },
      dispatch,
      combine,
      /** cuda: waits for the rank's queued GPU work (device-tensor ops do not wait) */
      sync: () => (needCuda('sync'), native.deviceSync()),
      /** cuda: a CUDA event recorded on the rank's stream now */
      recordEvent: () => (needCuda('recordEvent'), native.eventRecord()),
      /** cuda: ms between two recorded events (waits for the stream); the events are kept */
      elapsedMs: (start: bigint, end: bigint) => (needCuda('elapsedMs'), native.eventElapsed(start, end)),
      destroyEvent: (e: bigint) => native.eventDestroy(e),
      /** cuda: mean ms of fn over iters runs, between CUDA events on the rank's stream (run a warm-up first) */
      timeIt: async (fn: (i: number) => Promise<unknown>, iters: number): Promise<number> => {
        needCuda('timeIt');
        checkPositiveInt('iters', iters);
        const a = native.eventRecord();
        for (let i = 0; i < iters; i++) await fn(i);
        const b = native.eventRecord();
        try {
          return (await native.eventElapsed(a, b)) / iters;
        } finally {
          native.eventDestroy(a);
          native.eventDestroy(b);
        }
      },
      /** cuda baselines (ms per op, CUDA events, after `warmup`): every rank calls them together */
      benchAlltoAll: (bytes: number, iters: number, warmup = 3) => (needCuda('benchAlltoAll'), native.benchAlltoAll(bytes, iters, warmup)),
      /** cuda: device ms of the last dispatch (first launch to the data kernel's end) or combine; waits for the stream */
      lastOpDeviceMs: () => (needCuda('lastOpDeviceMs'), native.lastOpMs()),
      benchPeerCopy: (bytes: number, iters: number, warmup = 3) => (needCuda('benchPeerCopy'), native.benchPeerCopy(bytes, iters, warmup)),
      openSession: async (opts: { maxBytes: number; maxAllGathers: number }) => {
        checkPositiveInt('maxBytes', opts?.maxBytes);
        checkPositiveInt('maxAllGathers', opts?.maxAllGathers, 1 << 16);
        await self.sessionOpen(opts.maxBytes, opts.maxAllGathers);
        return {
          async allGather(t: Tensor) {
            checkTensor('input', t);
            return self.sessionAllGather(t);
          },
          async reduceScatter(t: Tensor) {
            checkTensor('input', t, { dtypes: ['fp32', 'bf16'] });
            if (t.shape.length < 1 || t.shape[0]! % worldSize !== 0) throw invalid('input.shape[0]', `must be a multiple of the world size (${worldSize})`);
            return self.sessionReduceScatter(t);
          },
          close: () => self.sessionClose(),
        };
      },
      async engramWrite(t: Tensor) {
        checkTensor('storage', t, { rank: 2 });
        return self.engramWrite(t);
      },
      async engramFetch(ids: Int32Array) {
        checkArray('indices', ids, Int32Array);
        return self.engramFetch(ids);
      },
      async ppExchange(t: Tensor) {
        checkTensor('input', t);
        return self.ppExchange(t);
      },
      /** cuda: microseconds per call of an AGRS/engram/pipeline op on device-resident data (bench/gpu-agrs) */
      benchAgrs: (op: string, engine: 'kernel' | 'ce' | 'auto', bytes: number, iters: number) =>
        self.native.benchAgrs(op, engine, bytes, iters),
    };
  }

}

export type RankProgramHandle = ReturnType<RankOps['programHandle']>;

function checkDevice(name: string, t: unknown, dtypes: readonly DType[], numelWant?: number, shape?: Array<number | undefined>): DeviceTensor {
  if (!isDeviceTensor(t)) throw invalid(name, 'must be a device tensor (rank.tensor on cuda)');
  if (!dtypes.includes(t.dtype)) throw invalid(`${name}.dtype`, `is ${t.dtype}; expected ${dtypes.join(' or ')}`);
  if (shape && (t.shape.length !== shape.length || shape.some((d, i) => d !== undefined && d !== t.shape[i])))
    throw invalid(`${name}.shape`, `is [${t.shape.join(', ')}]; expected [${shape.map((d) => d ?? 'n').join(', ')}]`);
  if (numelWant !== undefined && numel(t.shape) !== numelWant) throw invalid(name, `has ${numel(t.shape)} elements; expected ${numelWant}`);
  return t;
}

/** Shapes and dtypes of a device dispatch (values stay on the GPU: expert ids are not checked). */
function checkDeviceDispatch(name: string, d: DeviceDispatchInput, cfg: BufferConfig, rank: number, groupId: string): void {
  const x = checkDevice(`${name}.x`, d.x, cfg.fp8Dispatch ? ['bf16', 'fp8e4m3'] : ['bf16'], undefined, [undefined, cfg.hidden]);
  const T = x.shape[0]!;
  if (T > cfg.maxTokensPerRank) throw invalid(`${name}.x.shape[0]`, `${T} tokens exceed buffer.maxTokensPerRank (${cfg.maxTokensPerRank})`);
  if (x.dtype === 'fp8e4m3') checkDevice(`${name}.scales`, d.scales, ['fp32'], T * (cfg.hidden / 128));
  else if (d.scales !== undefined) throw invalid(`${name}.scales`, 'is only for fp8e4m3 x');
  if (d.expertAlignment !== undefined) checkPositiveInt(`${name}.expertAlignment`, d.expertAlignment, 1 << 16);
  if (d.handle !== undefined) {
    checkHandle(`${name}.handle`, d.handle, rank, groupId);
    if (d.handle.numTokens !== T) throw invalid(`${name}.handle`, `was made for ${d.handle.numTokens} tokens, x has ${T}`);
  }
  if (d.topkIdx === undefined && d.handle === undefined) throw invalid(`${name}.topkIdx`, 'is required (or pass a handle of a previous dispatch)');
  if (d.topkIdx !== undefined) checkDevice(`${name}.topkIdx`, d.topkIdx, ['int32'], T * cfg.topk);
  if (d.topkWeights !== undefined) checkDevice(`${name}.topkWeights`, d.topkWeights, ['fp32'], T * cfg.topk);
  else if (d.handle === undefined) throw invalid(`${name}.topkWeights`, 'is required (or pass a handle of a previous dispatch)');
}

function checkDeviceCombine(name: string, c: DeviceCombineInput, cfg: BufferConfig, rank: number, groupId: string): DeviceTensor[] {
  checkHandle(`${name}.handle`, c.handle, rank, groupId);
  const x = checkDevice(`${name}.x`, c.x, ['bf16'], undefined, [undefined, cfg.hidden]);
  if (c.handle.numRecv >= 0 && x.shape[0]! < c.handle.numRecv) throw invalid(`${name}.x.shape[0]`, `is ${x.shape[0]}; the dispatch received ${c.handle.numRecv} rows`);
  if (c.topkWeights !== undefined) checkDevice(`${name}.topkWeights`, c.topkWeights, ['fp32'], x.shape[0]! * cfg.topk);
  const bias = c.bias === undefined ? [] : Array.isArray(c.bias) ? c.bias : [c.bias];
  if (bias.length > 2) throw invalid(`${name}.bias`, `takes at most 2 tensors (got ${bias.length})`);
  bias.forEach((b, i) => checkDevice(`${name}.bias[${i}]`, b, ['bf16'], undefined, [c.handle.numTokens, cfg.hidden]));
  return bias;
}
