// The public result and input types of the operations (API.md), shared by the main thread's group
// and the ranks' workers, so that neither layer imports the other for its types.
import type { DeviceTensor } from './device-tensor.js';
import type { Tensor } from './tensor.js';
import type { DispatchDType, DispatchHandle } from './validate.js';
import type { FailureInfo } from '../../machines/index.js';
import { keysOf } from './option-keys.js';

/** One rank's dispatch result: x has the input's dtype (a bf16 dispatch gives a Uint16Array, no cast needed). */
export interface DispatchResult<D extends DispatchDType = DispatchDType> {
  x: Tensor<D>;
  /** fp8 dispatch: the received rows' scales */
  scales?: Tensor<'fp32'>;
  topkIdx: Int32Array;
  topkWeights: Float32Array;
  srcRank: Int32Array;
  srcToken: Int32Array;
  tokensPerExpert: number[];
  handle: DispatchHandle;
  /** elastic groups only: this rank's top-k slots dropped (as -1 slots) because their expert's rank left */
  maskedSlots?: number;
}

export interface CombineResult {
  x: Tensor<'bf16'>;
  topkWeights: Float32Array;
}

/**
 * Dispatch of device tensors (cuda rank programs). With outputsInBuffer the tensors are views of the
 * receive buffer sized for the worst case (W * maxTokensPerRank rows; the first numRecv are the
 * tokens; the same views after every dispatch), valid until the next dispatch or combine, and
 * numRecv/tokensPerExpert are null (no CPU sync) unless the handle's dispatch had a CPU sync.
 */
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

export interface DeviceCombineResult {
  x: DeviceTensor<'bf16'>;
  topkWeights: DeviceTensor<'fp32'>;
}

export interface DeviceOptions {
  /** dispatch: leave the outputs in the receive buffer, no CPU sync (the kernels' zero-copy path) */
  outputsInBuffer?: boolean;
  /** SMs (blocks) of the data/combine kernel; 0 = the rank's share of the GPU */
  numSms?: number;
  /**
   * combine: write the result into these device tensors ([numTokens, hidden] bf16 and [numTokens, topk]
   * fp32) instead of allocating new ones: a decode loop then allocates nothing per combine.
   */
  out?: { x: DeviceTensor<'bf16'>; topkWeights: DeviceTensor<'fp32'> };
}

/** Rank programs: `{ async: true }` starts a session collective or an engram fetch and returns at once. */
export interface AsyncOptions {
  async?: boolean;
}

/**
 * A session collective started with `{ async: true }`: `result` is a view of the session's buffer
 * (the gathered `[W * n, ...]` region, or the reduceScatter's `[n, ...]` sums), valid once wait() has
 * resolved and until the session closes. wait() resolves to it; wait once.
 */
export interface InFlightCollective<T> {
  readonly result: T;
  wait(): Promise<T>;
}

/** An engram fetch started with `{ async: true }`: other ops may run until wait(), which gives its rows (once). */
export interface PendingFetch<T> {
  wait(): Promise<T>;
}

/** What group.snapshot() reports of a rank. */
export interface RankSnapshot {
  rank: number;
  state: string;
  seq: number;
  error?: FailureInfo;
}

/** What group.traffic() reports of a local rank (see there). */
export interface TrafficReport {
  rank: number;
  scaleUpBytes: number;
  scaleOutBytes: number;
  scaleOutSeconds: number;
}

// The keys each options object of the rank programs' ops takes (option-keys.ts: any other is EINVAL).
export const DEVICE_DISPATCH_INPUT_KEYS = keysOf<DeviceDispatchInput>()(['x', 'scales', 'topkIdx', 'topkWeights', 'expertAlignment', 'handle']);
export const DEVICE_COMBINE_INPUT_KEYS = keysOf<DeviceCombineInput>()(['x', 'handle', 'topkWeights', 'bias']);
/** a device dispatch's options (out is a combine's) */
export const DEVICE_DISPATCH_OPTION_KEYS: readonly string[] = ['outputsInBuffer', 'numSms'];
/** a device combine's options (outputsInBuffer is a dispatch's) */
export const DEVICE_COMBINE_OPTION_KEYS: readonly string[] = ['numSms', 'out'];
export const DEVICE_OUT_KEYS = keysOf<NonNullable<DeviceOptions['out']>>()(['x', 'topkWeights']);
export const ASYNC_OPTION_KEYS = keysOf<AsyncOptions>()(['async']);
