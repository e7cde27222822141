// Input checks of the public API. Each throws EINVAL naming the argument, before any rank moves:
// the driver-mode group runs them for every rank first, rank programs run the per-rank ones.
import { describe, invalid } from './errors.js';
import { checkKnownKeys, keysOf, shapeKeys } from './option-keys.js';
import { MAX_LIVE_HANDLES, type HandleRegistry } from './handles.js';
import { checkArray, checkTensor, ELEMENT_BYTES, numel, type Tensor } from './tensor.js';

export interface BufferConfig {
  maxTokensPerRank: number;
  hidden: number;
  topk: number;
  numExperts: number;
  fp8Dispatch?: boolean;
  cpuBytes?: number;
  hybrid?: boolean;
  bytes?: number;
}

/** A dispatch handle: plain data naming the group, rank and routing it belongs to. */
export interface DispatchHandle {
  readonly group: string;
  readonly rank: number;
  readonly id: number;
  /** the collective sequence number of the dispatch that made it (equal on every rank) */
  readonly seq: number;
  readonly numTokens: number;
  readonly numRecv: number;
}

/** The dtypes a dispatch moves: bf16, or fp8e4m3 with scales (buffer.fp8Dispatch). */
export type DispatchDType = 'bf16' | 'fp8e4m3';

/** One rank's dispatch input; `D` (inferred from x) carries through to the result's x. */
export interface DispatchInput<D extends DispatchDType = DispatchDType> {
  x: Tensor<D>;
  scales?: Tensor<'fp32'>;
  topkIdx?: Int32Array;
  topkWeights?: Float32Array;
  expertAlignment?: number;
  handle?: DispatchHandle;
}

export interface CombineInput {
  x: Tensor;
  handle: DispatchHandle;
  topkWeights?: Float32Array;
  bias?: Tensor | Tensor[];
}

export const DISPATCH_INPUT_KEYS = keysOf<DispatchInput>()(['x', 'scales', 'topkIdx', 'topkWeights', 'expertAlignment', 'handle']);
export const COMBINE_INPUT_KEYS = keysOf<CombineInput>()(['x', 'handle', 'topkWeights', 'bias']);

const isInt = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v);

export function checkPositiveInt(name: string, v: unknown, max = Number.MAX_SAFE_INTEGER): number {
  if (!isInt(v) || v <= 0 || v > max) throw invalid(name, `must be a positive integer${max < Number.MAX_SAFE_INTEGER ? ` up to ${max}` : ''} (got ${String(v)})`);
  return v;
}

/** The most bytes one segment of a rank may have (buffer.bytes, buffer.cpuBytes): what the native side maps. */
export const MAX_SEGMENT_BYTES = 2 ** 50;

/** Every key of createGroup's `buffer` (sizeHint's config takes the same). */
export const BUFFER_KEYS = keysOf<BufferConfig>()(['maxTokensPerRank', 'hidden', 'topk', 'numExperts', 'fp8Dispatch', 'cpuBytes', 'hybrid', 'bytes']);

/** `prefix` names the fields ('buffer.' for createGroup, '' for sizeHint's config). */
export function checkBufferConfig(b: unknown, worldSize: number, prefix = 'buffer.'): BufferConfig {
  const name = prefix ? prefix.slice(0, -1) : 'config';
  if (b === null || typeof b !== 'object' || Array.isArray(b)) throw invalid(name, 'must be an object { maxTokensPerRank, hidden, topk, numExperts, ... }');
  checkKnownKeys(name, b, BUFFER_KEYS);
  const c = b as BufferConfig;
  const n = (field: string): string => `${prefix}${field}`;
  checkPositiveInt(n('maxTokensPerRank'), c.maxTokensPerRank, 1 << 20);
  checkPositiveInt(n('hidden'), c.hidden, 1 << 20);
  checkPositiveInt(n('topk'), c.topk, 16);
  checkPositiveInt(n('numExperts'), c.numExperts, 1 << 16);
  if (c.numExperts % worldSize !== 0) throw invalid(n('numExperts'), `(${c.numExperts}) must be divisible by the world size (${worldSize}): experts are owned in contiguous blocks`);
  if (c.topk > c.numExperts) throw invalid(n('topk'), `(${c.topk}) exceeds numExperts (${c.numExperts})`);
  if (c.hidden % 8 !== 0) throw invalid(n('hidden'), `(${c.hidden}) must be a multiple of 8 (16-byte rows)`);
  if (c.fp8Dispatch !== undefined && typeof c.fp8Dispatch !== 'boolean') throw invalid(n('fp8Dispatch'), 'must be a boolean');
  if (c.fp8Dispatch && c.hidden % 128 !== 0) throw invalid(n('hidden'), `(${c.hidden}) must be a multiple of 128 for fp8 dispatch (one scale per 128 values)`);
  if (c.cpuBytes !== undefined && (!isInt(c.cpuBytes) || c.cpuBytes < 0 || c.cpuBytes > MAX_SEGMENT_BYTES))
    throw invalid(n('cpuBytes'), `must be a non-negative integer up to ${MAX_SEGMENT_BYTES} (got ${String(c.cpuBytes)})`);
  if (c.hybrid !== undefined && typeof c.hybrid !== 'boolean') throw invalid(n('hybrid'), 'must be a boolean');
  if (c.bytes !== undefined && (!isInt(c.bytes) || c.bytes <= 0 || c.bytes > MAX_SEGMENT_BYTES))
    throw invalid(n('bytes'), `must be a positive integer up to ${MAX_SEGMENT_BYTES} (got ${String(c.bytes)})`);
  return c;
}

/** Per-rank dispatch checks; returns the number of tokens. */
export function checkDispatchInput(name: string, input: unknown, cfg: BufferConfig, worldSize: number, rank: number, groupId: string, registry?: HandleRegistry): number {
  if (input === null || typeof input !== 'object') throw invalid(name, 'must be an object { x, topkIdx, topkWeights, ... }');
  checkKnownKeys(name, input, DISPATCH_INPUT_KEYS);
  const d = input as DispatchInput;
  const fp8 = (d.x as Tensor | undefined)?.dtype === 'fp8e4m3';
  checkTensor(`${name}.x`, d.x, { dtypes: cfg.fp8Dispatch ? ['bf16', 'fp8e4m3'] : ['bf16'], rank: 2, shape: [undefined, cfg.hidden] });
  const T = d.x.shape[0]!;
  if (T > cfg.maxTokensPerRank) throw invalid(`${name}.x.shape[0]`, `${T} tokens exceed buffer.maxTokensPerRank (${cfg.maxTokensPerRank})`);
  if (fp8) checkTensor(`${name}.scales`, d.scales, { dtypes: ['fp32'], shape: [T, cfg.hidden / 128] });
  else if (d.scales !== undefined) throw invalid(`${name}.scales`, 'is only for fp8e4m3 x');
  const K = cfg.topk;
  if (d.expertAlignment !== undefined) checkPositiveInt(`${name}.expertAlignment`, d.expertAlignment, 1 << 16);
  if (d.handle !== undefined) {
    checkHandle(`${name}.handle`, d.handle, rank, groupId, registry);
    if (d.handle.numTokens !== T) throw invalid(`${name}.handle`, `was made for ${d.handle.numTokens} tokens, x has ${T}`);
  }
  if (d.topkIdx === undefined && d.handle === undefined) throw invalid(`${name}.topkIdx`, 'is required (or pass a handle of a previous dispatch)');
  if (d.topkIdx !== undefined) {
    checkArray(`${name}.topkIdx`, d.topkIdx, Int32Array, T * K);
    const E = cfg.numExperts;
    const seen = new Set<number>();
    for (let t = 0; t < T; t++) {
      seen.clear();
      for (let k = 0; k < K; k++) {
        const e = d.topkIdx[t * K + k]!;
        if (e === -1) continue;
        if (e < -1 || e >= E) throw invalid(`${name}.topkIdx[${t * K + k}]`, `${e} is outside [0, ${E}) and not -1`);
        if (seen.has(e)) throw invalid(`${name}.topkIdx[${t * K + k}]`, `token ${t} lists expert ${e} twice`);
        seen.add(e);
      }
    }
  }
  if (d.topkWeights === undefined && d.handle === undefined) throw invalid(`${name}.topkWeights`, 'is required');
  if (d.topkWeights !== undefined) {
    checkArray(`${name}.topkWeights`, d.topkWeights, Float32Array, T * K);
    for (let i = 0; i < d.topkWeights.length; i++) {
      if (!Number.isFinite(d.topkWeights[i])) throw invalid(`${name}.topkWeights[${i}]`, `is ${d.topkWeights[i]}: weights must be finite`);
    }
  }
  return T;
}

export function checkHandle(name: string, h: unknown, rank: number, groupId: string, registry?: HandleRegistry): asserts h is DispatchHandle {
  if (h === null || typeof h !== 'object' || typeof (h as DispatchHandle).id !== 'number') throw invalid(name, 'must be the handle a dispatch returned');
  const handle = h as DispatchHandle;
  if (handle.group !== groupId) throw invalid(name, 'belongs to another group');
  if (handle.rank !== rank) throw invalid(name, `belongs to rank ${handle.rank}, not rank ${rank}`);
  // A live handle becomes the most recently used; any other object is refused (nothing moves).
  if (registry && !registry.touch(handle))
    throw invalid(name, `is not a handle a dispatch of rank ${rank} returned (a copy or a made-up object), or it expired (a rank keeps the ${MAX_LIVE_HANDLES} most recently used handles)`);
}

/** Per-rank combine checks; returns the bias tensors as a list. */
export function checkCombineInput(name: string, input: unknown, cfg: BufferConfig, rank: number, groupId: string, registry?: HandleRegistry): Tensor[] {
  if (input === null || typeof input !== 'object') throw invalid(name, 'must be an object { x, handle, ... }');
  checkKnownKeys(name, input, COMBINE_INPUT_KEYS);
  const c = input as CombineInput;
  checkHandle(`${name}.handle`, c.handle, rank, groupId, registry);
  checkTensor(`${name}.x`, c.x, { dtypes: ['bf16'], rank: 2, shape: [c.handle.numRecv, cfg.hidden] });
  if (c.topkWeights !== undefined) {
    checkArray(`${name}.topkWeights`, c.topkWeights, Float32Array, c.handle.numRecv * cfg.topk);
    for (let i = 0; i < c.topkWeights.length; i++) {
      if (!Number.isFinite(c.topkWeights[i])) throw invalid(`${name}.topkWeights[${i}]`, `is ${c.topkWeights[i]}: weights must be finite`);
    }
  }
  const bias = c.bias === undefined ? [] : Array.isArray(c.bias) ? c.bias : [c.bias];
  if (bias.length > 2) throw invalid(`${name}.bias`, `takes at most 2 tensors (got ${bias.length})`);
  bias.forEach((b, i) => checkTensor(`${name}.bias[${i}]`, b, { dtypes: ['bf16'], shape: [c.handle.numTokens, cfg.hidden], rank: 2 }));
  return bias;
}

/** Driver mode: every rank's tensor must have the same dtype and shape. */
export function checkSameShape(name: string, tensors: readonly Tensor[]): void {
  const first = tensors[0]!;
  tensors.forEach((t, r) => {
    if (t.dtype !== first.dtype) throw invalid(`${name}[${r}].dtype`, `is ${t.dtype} but rank 0 has ${first.dtype}: all ranks must match`);
    if (t.shape.length !== first.shape.length || t.shape.some((d, i) => d !== first.shape[i]))
      throw invalid(`${name}[${r}].shape`, `is [${t.shape.join(', ')}] but rank 0 has [${first.shape.join(', ')}]: all ranks must match`);
  });
}

/** Driver mode: one input per rank. */
export function checkPerRank<T>(name: string, inputs: unknown, size: number): T[] {
  if (!Array.isArray(inputs)) throw invalid(name, `must be an array with one entry per rank (${size})`);
  if (inputs.length !== size) throw invalid(name, `has ${inputs.length} entries; the group has ${size} ranks`);
  return inputs as T[];
}

/** Driver mode: one tensor per rank, all alike, whose world-wide gather fits `capacity` bytes. */
export function checkGatherInputs(name: string, tensors: unknown, size: number, worldSize: number, capacity: number, serves = (_r: number) => true): void {
  // A rank that left an elastic group takes no part: its entry is not read (null).
  const list = checkPerRank<Tensor>(name, tensors, size).filter((t, r) => {
    if (serves(r)) checkTensor(`${name}[${r}]`, t, {});
    return serves(r);
  });
  if (list.length === 0) return;
  checkSameShape(name, list);
  const bytes = numel(list[0]!.shape) * ELEMENT_BYTES[list[0]!.dtype];
  if (bytes * worldSize > capacity) throw invalid(name, `${bytes} bytes per rank need ${bytes * worldSize} buffer bytes; ${capacity} are available (raise buffer.bytes)`);
}

/** Driver mode: handles used together must come from the same dispatch, or none may be given (cached dispatch). */
export function checkHandlesAgree(name: string, handles: Array<DispatchHandle | undefined>): void {
  const given = handles.filter((h) => h !== undefined);
  if (given.length === 0) return;
  if (given.length !== handles.length) throw invalid(`${name}[${handles.findIndex((h) => h === undefined)}].handle`, 'is missing: either every rank passes a handle or none does');
  const seq = given[0]!.seq;
  const bad = handles.findIndex((h) => h!.seq !== seq);
  if (bad >= 0) throw invalid(`${name}[${bad}].handle`, `comes from another dispatch (collective #${handles[bad]!.seq}, rank 0's from #${seq})`);
}

/**
 * An options argument: a plain object, or undefined where `optional`. Numbers, strings, booleans,
 * arrays and null are refused (EINVAL naming `name` and the shape it takes), and so is a key that is
 * not one of `known`: by default the keys the shape names ('{ withCpuSync? }'; option-keys.ts).
 */
export function checkOptions<T extends object>(name: string, v: unknown, shape: string, optional = true, known = shapeKeys(shape)): Partial<T> {
  if (v === undefined && optional) return {};
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw invalid(name, `must be an object ${shape} (got ${describe(v)})`);
  if (known) checkKnownKeys(name, v, known);
  return v as Partial<T>;
}

/** An integer in [lo, hi]: EINVAL naming `name` otherwise (NaN, fractions, out of range, not a number). */
export function checkIntIn(name: string, v: unknown, lo: number, hi: number): number {
  if (!isInt(v) || v < lo || v > hi) throw invalid(name, `must be an integer in [${lo}, ${hi}] (got ${describe(v)})`);
  return v;
}

export { describe };

/**
 * The largest RANKFLOW_TEST_FIRST_SEQ. Sequence numbers are uint64 natively but JS numbers in the
 * rank machines, handles and transition records: exact up to 2^53. A group started here still has
 * 2^32 collectives of exact numbers; one started at 0 would need 2^53 (285 years at a million a second).
 */
export const MAX_FIRST_SEQ = 2 ** 53 - 2 ** 32;

/** RANKFLOW_TEST_FIRST_SEQ (tests only): a decimal integer in [0, MAX_FIRST_SEQ], or unset (0). */
export function checkTestFirstSeq(raw: string | undefined): number {
  if (raw === undefined) return 0;
  const v = /^\d{1,16}$/.test(raw.trim()) ? Number(raw.trim()) : NaN;
  if (!(v <= MAX_FIRST_SEQ))
    throw invalid('RANKFLOW_TEST_FIRST_SEQ', `must be a decimal integer in [0, ${MAX_FIRST_SEQ}] (2^53 - 2^32: sequence numbers are exact JS numbers up to 2^53); got ${JSON.stringify(raw.slice(0, 40))}`);
  return v;
}
