// The operations of one rank inside its worker: tensors in, native phases run as the rank machine's
// states, tensors out. Driver mode reaches them through comlink (results transferred, not copied);
// rank programs call them directly through `programHandle()`.
import * as Comlink from 'comlink/dist/esm/comlink.mjs';

import type { RankEvent } from '../machines/index.js';
import type { NativeContext, NativeDispatchInput, NativeDispatchOutput } from '../actors/native.js';
import { invalid } from '../actors/errors.js';
import { bytesOf, checkArray, checkTensor, ELEMENT_BYTES, fromBytes, numel, tensor, type DType, type Tensor } from '../actors/tensor.js';
import {
  checkCombineInput, checkDispatchInput, checkPositiveInt, type BufferConfig, type CombineInput, type DispatchHandle, type DispatchInput,
} from '../actors/validate.js';

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
    return this.request({ type: 'BARRIER', call: this.newCall(), withCpuSync }, {
      barrierDevice: () => this.native.barrier(false),
      barrierCpuSync: () => this.native.barrier(true),
    });
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
    return {
      rank,
      worldSize,
      backend: this.init.backend,
      tensor,
      async barrier(opts: { withCpuSync?: boolean } = {}) {
        if (opts === null || typeof opts !== 'object') throw invalid('options', 'must be { withCpuSync? }');
        if (opts.withCpuSync !== undefined && typeof opts.withCpuSync !== 'boolean') throw invalid('withCpuSync', 'must be a boolean');
        return self.barrier(opts.withCpuSync ?? false);
      },
      async allGather(t: Tensor) {
        checkTensor('input', t);
        return self.allGather(t);
      },
      async dispatch(d: DispatchInput) {
        checkDispatchInput('input', d, buffer, worldSize, rank, groupId);
        return self.dispatch(d);
      },
      async combine(c: CombineInput) {
        return self.combine(c, checkCombineInput('input', c, buffer, rank, groupId));
      },
      async openSession(opts: { maxBytes: number; maxAllGathers: number }) {
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
