// The `rank` a rank program receives (group.run): the same operations as driver mode with no thread
// hop, checked here (rank programs skip the main thread), on host tensors or, on cuda, device tensors;
// plus the cuda extras (streams, events, graphs, baselines, interop with the application's own GPU
// work: workers/interop.ts), whose calls and checks are the op table's (workers/ops/device.ts). The
// collectives are async, so a bad input rejects rather than throws; the ops themselves run
// synchronously on the rank's thread, every native call made by the op table (workers/ops/).
// RankProgramHandle<'host' | 'cuda'> types what tensor() makes on each backend; the default is both,
// told apart by `backend`.
import { invalid, RankflowError } from '../actors/core/errors.js';
import { DeviceTensor, isDeviceTensor } from '../actors/core/device-tensor.js';
import { checkArray, checkTensor, numel, tensor, type DType, type Tensor } from '../actors/core/tensor.js';
import {
  ASYNC_OPTION_KEYS, DEVICE_COMBINE_INPUT_KEYS, DEVICE_COMBINE_OPTION_KEYS, DEVICE_DISPATCH_INPUT_KEYS, DEVICE_DISPATCH_OPTION_KEYS, DEVICE_OUT_KEYS,
  type AsyncOptions, type CombineResult, DeviceCombineInput, DeviceCombineResult, DeviceDispatchInput, DeviceDispatchResult, DeviceOptions, DispatchResult,
  PendingFetch,
} from '../actors/core/types.js';
import {
  checkCombineInput, checkDispatchInput, checkHandle, checkOptions, checkPositiveInt, type BufferConfig, type CombineInput, type DispatchDType, type DispatchInput,
} from '../actors/core/validate.js';
import type { HandleRegistry } from '../actors/core/handles.js';
import { checkKnownKeys, unknownKeyError } from '../actors/core/option-keys.js';
import type { RankOps } from './ops/index.js';
import type { ReplayEvent } from './ops/device.js';
import { interopMethods } from './interop.js';
import { checkLiveOwners } from './ops/membership.js';
import { engramFetchAsync, openRankSession, refuseWhileFetching, type RankSession } from './session-views.js';
import { RunAbortState } from './run-abort.js';

/** What every replay() returns: it has happened when the call returns (the launch is on the stream). */
const REPLAYED: Promise<void> = Promise.resolve();

/** A captured sequence of no-CPU-sync ops (rank.capture): every replay is new collectives. */
export interface CapturedGraph {
  /** collectives one replay runs */
  readonly ops: number;
  replay(): Promise<void>;
  free(): void;
}

/** `run`: the abort of the group.run that calls the program (workers/run-abort.ts); none by default. */
export function programHandle(ops: RankOps, run = new RunAbortState(undefined, 0)) {
  const { rank, worldSize, buffer, groupId, backend } = ops.init;
  const { device } = ops;
  const cuda = backend === 'cuda';
  const registry = ops.handles;
  function dispatch(d: DeviceDispatchInput, opts?: DeviceOptions): Promise<DeviceDispatchResult>;
  function dispatch<D extends DispatchDType>(d: DispatchInput<D>): Promise<DispatchResult<D>>;
  async function dispatch(d: DispatchInput | DeviceDispatchInput, opts?: DeviceOptions): Promise<DispatchResult | DeviceDispatchResult> {
    if (isDeviceTensor((d as DeviceDispatchInput)?.x)) {
      checkDeviceDispatch(d as DeviceDispatchInput, buffer, rank, groupId, registry, opts);
      return ops.dispatchDevice(d as DeviceDispatchInput, opts);
    }
    if (ops.capturing) throw invalid('input.x', 'a captured dispatch takes device tensors');
    checkDispatchInput('input', d, buffer, worldSize, rank, groupId, registry);
    return ops.dispatch(d as DispatchInput);
  }
  function combine(c: DeviceCombineInput, opts?: DeviceOptions): Promise<DeviceCombineResult>;
  function combine(c: CombineInput): Promise<CombineResult>;
  async function combine(c: CombineInput | DeviceCombineInput, opts?: DeviceOptions): Promise<unknown> {
    if (isDeviceTensor((c as DeviceCombineInput)?.x))
      return ops.combineDevice(c as DeviceCombineInput, checkDeviceCombine(c as DeviceCombineInput, buffer, rank, groupId, registry, opts), opts);
    if (ops.capturing) throw invalid('input.x', 'a captured combine takes device tensors');
    return ops.combine(c as CombineInput, checkCombineInput('input', c, buffer, rank, groupId, registry));
  }
  function allGather(t: DeviceTensor): Promise<DeviceTensor>;
  function allGather(t: Tensor): Promise<Tensor>;
  async function allGather(t: Tensor | DeviceTensor): Promise<Tensor | DeviceTensor> {
    if (!isDeviceTensor(t)) checkTensor('input', t);
    else if (!cuda) throw invalid('input', "device tensors need backend 'cuda'");
    return ops.allGather(t);
  }
  /** the sum over the ranks of t (fp32 or bf16, the same shape on every rank) on every rank, in rank order with fp32 accumulation; { inPlace: true }: into t */
  function allReduce<D extends DType>(t: DeviceTensor<D>, opts?: { inPlace?: boolean }): Promise<DeviceTensor<D>>;
  function allReduce<D extends DType>(t: Tensor<D>, opts?: { inPlace?: boolean }): Promise<Tensor<D>>;
  async function allReduce(t: Tensor | DeviceTensor, opts?: { inPlace?: boolean }): Promise<Tensor | DeviceTensor> {
    if (opts !== undefined) {
      if (opts === null || typeof opts !== 'object' || Array.isArray(opts)) throw invalid('options', 'must be { inPlace? }');
      checkKnownKeys('options', opts, ['inPlace']);
      if (opts.inPlace !== undefined && typeof opts.inPlace !== 'boolean') throw invalid('inPlace', 'must be a boolean');
    }
    if (!isDeviceTensor(t)) {
      checkTensor('input', t, { dtypes: ['fp32', 'bf16'] });
      if (ops.capturing) throw invalid('input', 'a captured allReduce takes device tensors');
    } else if (!cuda) throw invalid('input', "device tensors need backend 'cuda'");
    else if (t.dtype !== 'fp32' && t.dtype !== 'bf16') throw invalid('input.dtype', `must be fp32 or bf16 (got ${t.dtype})`);
    return ops.allReduce(t, opts?.inPlace ?? false);
  }
  /** engram rows by global id; { async: true }: the fetch overlaps with what runs until wait() */
  function engramFetch(ids: Int32Array, opts: AsyncOptions & { async: true }): PendingFetch<Tensor & DeviceTensor>;
  function engramFetch(ids: Int32Array, opts?: AsyncOptions): Promise<Tensor>;
  function engramFetch(ids: Int32Array, opts?: AsyncOptions): PendingFetch<Tensor & DeviceTensor> | Promise<Tensor> {
    if (opts !== undefined && (opts === null || typeof opts !== 'object')) return Promise.reject(invalid('options', 'must be { async? }'));
    const unknownKey = opts !== undefined ? unknownKeyError('options', opts, ASYNC_OPTION_KEYS) : undefined;
    if (unknownKey) return Promise.reject(unknownKey);
    if (opts?.async === true) {
      checkArray('indices', ids, Int32Array);
      checkLiveOwners(ops.membership, worldSize, ops.engramEntries, ids);
      return engramFetchAsync(ops, ids) as PendingFetch<Tensor & DeviceTensor>;
    }
    return (async () => {
      checkArray('indices', ids, Int32Array);
      return ops.engramFetch(ids);
    })();
  }
  return {
    rank,
    worldSize,
    backend,
    /** host: a host tensor; cuda: a device tensor on this rank's GPU (free() it, or it goes with the group) */
    tensor: ((dtype: DType, shape: number[], data?: ArrayBufferView) =>
      cuda ? device.tensor(dtype, shape, data) : tensor(dtype, shape, data as never)) as {
      <D extends DType>(dtype: D, shape: number[], data?: Tensor<D>['data']): Tensor<D> | DeviceTensor<D>;
    },
    hostTensor: tensor,
    /** the sequence number of this rank's last collective, as its transitions carry it (a graph replay takes one per captured op) */
    get seq(): number {
      return ops.runner.seq();
    },
    /** the global ids of the ranks serving now, ascending (every rank but those that left an elastic group) */
    get liveRanks(): number[] {
      return ops.membership ? [...ops.membership.live] : Array.from({ length: worldSize }, (_, r) => r);
    },
    /** the rank machine's state, as a dotted path ('ready', 'session.gathering' while an allGather is in flight) */
    get state(): string {
      return ops.runner.state();
    },
    /** group.run's signal was aborted (read at once, from shared memory); see workers/run-abort.ts */
    get aborted(): boolean {
      return run.aborted;
    },
    /** group.run's signal, for async APIs (timers, fetch): aborted once the worker hears of it, or rank.aborted is read true */
    get signal(): AbortSignal {
      return run.signal;
    },
    /** A collective (every rank calls it at the same point): true on every rank if any rank had seen the run aborted. */
    anyAborted: async (): Promise<boolean> => run.anyAborted(ops),
    /** what group.info(rank) says: memory kind, windows, domains, and on cuda the GPU (sms, smShare, graphLaunches, directLaunches, fusedDispatches) */
    info: () => ops.lifecycle.info(),
    async barrier(opts?: { withCpuSync?: boolean }) {
      if (opts === undefined) return ops.barrier(false);
      if (opts === null || typeof opts !== 'object' || Array.isArray(opts)) throw invalid('options', 'must be { withCpuSync? }');
      checkKnownKeys('options', opts, ['withCpuSync']);
      if (opts.withCpuSync !== undefined && typeof opts.withCpuSync !== 'boolean') throw invalid('withCpuSync', 'must be a boolean');
      ops.barrier(opts.withCpuSync ?? false);
    },
    allGather,
    allReduce,
    dispatch,
    combine,
    /**
     * cuda: records the no-CPU-sync ops `fn` runs (a cached dispatch with outputsInBuffer, combine,
     * barrier, allGather and allReduce of device tensors, on fixed shapes) as a CUDA graph: nothing runs now, and
     * each replay() launches them all at once as new collectives. Tensors the captured ops return
     * belong to the graph (every replay writes them) until graph.free().
     */
    async capture(fn: () => Promise<unknown> | unknown): Promise<CapturedGraph> {
      device.captureBegin(fn);
      try {
        await fn();
      } catch (e) {
        device.captureDrop();
        throw e;
      }
      const { graph, ops: n } = device.captureEnd();
      let freed = false;
      const event: ReplayEvent = { type: 'REPLAY', ops: n };
      return {
        ops: n,
        // Not async: a replay is one synchronous launch, and the promise it returns is made once.
        replay() {
          try {
            if (freed) throw new RankflowError('STATE', 'this graph was freed');
            device.replay(graph, event);
            return REPLAYED;
          } catch (e) {
            return Promise.reject(e);
          }
        },
        free() {
          if (freed) return;
          freed = true;
          device.graphFree(graph);
        },
      };
    },
    /** cuda: waits for the rank's queued GPU work (device-tensor ops do not wait) */
    sync: async () => device.sync(),
    /** cuda: a CUDA event recorded on the rank's stream now */
    recordEvent: () => device.recordEvent(),
    /** cuda: ms between two recorded events (waits for the stream); the events are kept */
    elapsedMs: async (start: bigint, end: bigint) => device.elapsedMs(start, end),
    destroyEvent: (e: bigint) => device.destroyEvent(e),
    /** cuda: mean ms of fn over iters runs, between CUDA events on the rank's stream (run a warm-up first) */
    timeIt: (fn: (i: number) => Promise<unknown>, iters: number): Promise<number> => device.timeIt(fn, iters),
    /** cuda baselines (ms per op, CUDA events, after `warmup`): every rank calls them together */
    benchAlltoAll: async (bytes: number, iters: number, warmup = 3) => device.benchAlltoAll(bytes, iters, warmup),
    benchPeerCopy: async (bytes: number, iters: number, warmup = 3) => device.benchPeerCopy(bytes, iters, warmup),
    /**
     * cuda: device ms of the last dispatch (first launch to the data kernel's end) or combine; waits for the
     * stream. Needs timeOps(true) before that op (STATE otherwise).
     */
    lastOpDeviceMs: () => device.lastOpDeviceMs(),
    /**
     * cuda: whether later dispatches and combines record CUDA events around their launches, for
     * lastOpDeviceMs(). Off by default: the two event records cost the CPU a few µs per op.
     */
    timeOps: (on = true) => device.timeOps(on),
    /** cuda: microseconds per call of an AGRS/engram/pipeline transport on device-resident data (bench/gpu-agrs) */
    benchAgrs: async (op: string, engine: 'kernel' | 'ce' | 'auto', bytes: number, iters: number) => device.benchAgrs(op, engine, bytes, iters),
    /** tests: hold `sms` SMs of the rank's GPU for `ms` milliseconds (the compute-overlap case) */
    occupySms: (sms: number, ms: number) => device.occupySms(sms, ms),
    /** An AGRS session (every rank calls it): session tensors, allGather / reduceScatter, { async: true } (session-views.ts) */
    openSession: async (opts: { maxBytes: number; maxAllGathers: number }): Promise<RankSession> => openRankSession(ops, opts),
    async engramWrite(t: Tensor) {
      checkTensor('storage', t, { rank: 2 });
      refuseWhileFetching(ops, 'engramWrite');
      return ops.engramWrite(t);
    },
    engramFetch,
    async ppExchange(t: Tensor) {
      checkTensor('input', t);
      return ops.ppExchange(t);
    },
    ...interopMethods(device),
  };
}

/** What a rank program's handle offers on every backend (docs/api.md, "Rank programs"). */
export interface RankOperations extends Omit<ReturnType<typeof programHandle>, 'backend' | 'tensor'> {}

/** The backends a rank program runs on. */
export type RankBackend = 'host' | 'cuda';
/** What `rank.tensor()` makes on backend B: a host tensor on 'host', a device tensor on 'cuda'. */
export type RankTensor<B extends RankBackend, D extends DType = DType> = B extends 'cuda' ? DeviceTensor<D> : Tensor<D>;

/**
 * The `rank` a rank program's default export receives. RankProgramHandle<'cuda'> (or <'host'>) for a
 * program written for one backend; the default, RankProgramHandle, is either, told apart by
 * `rank.backend` (`if (rank.backend === 'cuda')` narrows it, and so what `rank.tensor()` returns).
 */
export type RankProgramHandle<B extends RankBackend = RankBackend> = B extends RankBackend
  ? RankOperations & {
      readonly backend: B;
      /** host: a host tensor; cuda: a device tensor on this rank's GPU (free() it, or it goes with the group) */
      tensor<D extends DType>(dtype: D, shape: number[], data?: Tensor<D>['data']): RankTensor<B, D>;
    }
  : never;

function checkDevice(name: string, t: unknown, dtypes: readonly DType[], numelWant?: number, shape?: Array<number | undefined>): DeviceTensor {
  if (!isDeviceTensor(t)) throw invalid(name, 'must be a device tensor (rank.tensor on cuda)');
  if (!dtypes.includes(t.dtype)) throw invalid(`${name}.dtype`, `is ${t.dtype}; expected ${dtypes.join(' or ')}`);
  if (shape && (t.shape.length !== shape.length || shape.some((d, i) => d !== undefined && d !== t.shape[i])))
    throw invalid(`${name}.shape`, `is [${t.shape.join(', ')}]; expected [${shape.map((d) => d ?? 'n').join(', ')}]`);
  if (numelWant !== undefined && numel(t.shape) !== numelWant) throw invalid(name, `has ${numel(t.shape)} elements; expected ${numelWant}`);
  return t;
}

/** Shapes and dtypes of a device dispatch (values stay on the GPU: the kernels report bad expert ids). The
 *  argument names are constants (input.x, ...): nothing is built per call. */
function checkDeviceDispatch(d: DeviceDispatchInput, cfg: BufferConfig, rank: number, groupId: string, registry: HandleRegistry, opts?: DeviceOptions): void {
  checkKnownKeys('input', d, DEVICE_DISPATCH_INPUT_KEYS);
  const x = checkDevice('input.x', d.x, cfg.fp8Dispatch ? ['bf16', 'fp8e4m3'] : ['bf16'], undefined, [undefined, cfg.hidden]);
  const T = x.shape[0]!;
  // More tokens than buffer.maxTokensPerRank: a value, refused by the runtime (native ops/dispatch.cc).
  if (x.dtype === 'fp8e4m3') checkDevice('input.scales', d.scales, ['fp32'], T * (cfg.hidden / 128));
  else if (d.scales !== undefined) throw invalid('input.scales', 'is only for fp8e4m3 x');
  if (d.expertAlignment !== undefined) checkPositiveInt('input.expertAlignment', d.expertAlignment, 1 << 16);
  if (d.handle !== undefined) {
    checkHandle('input.handle', d.handle, rank, groupId, registry);
    if (d.handle.numTokens !== T) throw invalid('input.handle', `was made for ${d.handle.numTokens} tokens, x has ${T}`);
  }
  if (d.topkIdx === undefined && d.handle === undefined) throw invalid('input.topkIdx', 'is required (or pass a handle of a previous dispatch)');
  if (d.topkIdx !== undefined) checkDevice('input.topkIdx', d.topkIdx, ['int32'], T * cfg.topk);
  if (d.topkWeights !== undefined) checkDevice('input.topkWeights', d.topkWeights, ['fp32'], T * cfg.topk);
  else if (d.handle === undefined) throw invalid('input.topkWeights', 'is required (or pass a handle of a previous dispatch)');
  if (opts !== undefined && (opts === null || typeof opts !== 'object')) throw invalid('options', 'must be { outputsInBuffer?, numSms? }');
  if (opts !== undefined) checkKnownKeys('options', opts, DEVICE_DISPATCH_OPTION_KEYS);
  if (opts?.numSms !== undefined && opts.numSms !== 0) checkPositiveInt('options.numSms', opts.numSms, 1 << 16);
}

/** A combine's bias when it has none (read only). */
const NO_BIAS: readonly DeviceTensor[] = Object.freeze([]);

function checkDeviceCombine(c: DeviceCombineInput, cfg: BufferConfig, rank: number, groupId: string, registry: HandleRegistry, opts?: DeviceOptions): readonly DeviceTensor[] {
  checkKnownKeys('input', c, DEVICE_COMBINE_INPUT_KEYS);
  checkHandle('input.handle', c.handle, rank, groupId, registry);
  const x = checkDevice('input.x', c.x, ['bf16'], undefined, [undefined, cfg.hidden]);
  if (c.handle.numRecv >= 0 && x.shape[0]! < c.handle.numRecv) throw invalid('input.x.shape[0]', `is ${x.shape[0]}; the dispatch received ${c.handle.numRecv} rows`);
  if (c.topkWeights !== undefined) checkDevice('input.topkWeights', c.topkWeights, ['fp32'], x.shape[0]! * cfg.topk);
  const bias = c.bias === undefined ? NO_BIAS : Array.isArray(c.bias) ? c.bias : [c.bias];
  if (bias.length > 2) throw invalid('input.bias', `takes at most 2 tensors (got ${bias.length})`);
  for (let i = 0; i < bias.length; i++) checkDevice(`input.bias[${i}]`, bias[i], ['bf16'], undefined, [c.handle.numTokens, cfg.hidden]);
  if (opts !== undefined && (opts === null || typeof opts !== 'object')) throw invalid('options', 'must be { numSms?, out? }');
  if (opts !== undefined) checkKnownKeys('options', opts, DEVICE_COMBINE_OPTION_KEYS);
  if (opts?.numSms !== undefined && opts.numSms !== 0) checkPositiveInt('options.numSms', opts.numSms, 1 << 16);
  if (opts?.out !== undefined) {
    if (opts.out === null || typeof opts.out !== 'object') throw invalid('options.out', 'must be { x, topkWeights } (device tensors)');
    checkKnownKeys('options.out', opts.out, DEVICE_OUT_KEYS);
    checkDevice('options.out.x', opts.out.x, ['bf16'], undefined, [c.handle.numTokens, cfg.hidden]);
    checkDevice('options.out.topkWeights', opts.out.topkWeights, ['fp32'], undefined, [c.handle.numTokens, cfg.topk]);
  }
  return bias;
}
