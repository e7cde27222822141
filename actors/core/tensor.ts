// Host tensors (API.md "Tensors"): plain data, row-major, with the dtypes rankflow moves.
// Also the bf16 conversions the tests and demos need (round to nearest even, as the native side).
import { describe, invalid } from './errors.js';

export type DType = 'bf16' | 'fp32' | 'fp8e4m3' | 'int32';
export type TensorData = Uint16Array | Float32Array | Uint8Array | Int32Array;

export interface Tensor<D extends DType = DType> {
  dtype: D;
  shape: number[];
  data: D extends 'bf16' ? Uint16Array : D extends 'fp32' ? Float32Array : D extends 'fp8e4m3' ? Uint8Array : Int32Array;
}

export const ELEMENT_BYTES: Record<DType, number> = { bf16: 2, fp32: 4, fp8e4m3: 1, int32: 4 };
const ARRAY_OF: Record<DType, new (n: number) => TensorData> = { bf16: Uint16Array, fp32: Float32Array, fp8e4m3: Uint8Array, int32: Int32Array };
const NAME_OF: Record<DType, string> = { bf16: 'Uint16Array', fp32: 'Float32Array', fp8e4m3: 'Uint8Array', int32: 'Int32Array' };

/** One of the dtypes rankflow moves (an own key of ELEMENT_BYTES: not 'fp64', not 'constructor'). */
export const isDType = (d: unknown): d is DType => typeof d === 'string' && Object.hasOwn(ELEMENT_BYTES, d);

export const numel = (shape: readonly number[]): number => shape.reduce((a, b) => a * b, 1);

/**
 * A zero-filled tensor, or one wrapping `data` (no copy). EINVAL naming the argument for a dtype that
 * is not one of DType, a shape that is not non-negative integers, data of another typed array than the
 * dtype's or of another length than the shape's: such a tensor would only fail later, in a collective.
 */
export function tensor<D extends DType>(dtype: D, shape: number[], data?: Tensor<D>['data']): Tensor<D> {
  if (!isDType(dtype)) throw invalid('dtype', `must be one of ${Object.keys(ELEMENT_BYTES).join(', ')} (got ${describe(dtype)})`);
  if (!Array.isArray(shape) || shape.some((n) => !Number.isSafeInteger(n) || n < 0))
    throw invalid('shape', `must be an array of non-negative integers (got ${Array.isArray(shape) ? `[${shape.map((n) => describe(n)).join(', ')}]` : describe(shape)})`);
  const n = numel(shape);
  if (data !== undefined) {
    if (!(data instanceof (ARRAY_OF[dtype] as unknown as typeof Uint8Array))) throw invalid('data', `must be a ${NAME_OF[dtype]} for dtype ${dtype} (got ${describe(data)})`);
    if (data.length !== n)
      throw invalid('data', `has ${data.length} elements; shape [${shape.join(', ')}] needs ${n}${isDetached(data.buffer) ? ' (its memory is detached: a transferred buffer, or a view of a closed AGRS session)' : ''}`);
    return { dtype, shape: [...shape], data };
  }
  let d: Tensor<D>['data'];
  try {
    d = new ARRAY_OF[dtype](n) as Tensor<D>['data'];
  } catch (e) {
    throw invalid('shape', `[${shape.join(', ')}] is ${n} elements: ${(e as Error).message}`);
  }
  return { dtype, shape: [...shape], data: d };
}

/** Bytes of a tensor as a Uint8Array view (no copy). */
export function bytesOf(t: { data: TensorData }): Uint8Array {
  return new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
}

/** Reinterprets bytes as a tensor of `dtype` (copies when the bytes are not aligned for it). */
export function fromBytes<D extends DType>(dtype: D, shape: number[], bytes: Uint8Array): Tensor<D> {
  const size = ELEMENT_BYTES[dtype];
  const ctor = ARRAY_OF[dtype] as unknown as { new (b: ArrayBufferLike, o: number, n: number): TensorData; new (n: number): TensorData };
  if (bytes.byteOffset % size === 0) return tensor(dtype, shape, new ctor(bytes.buffer, bytes.byteOffset, bytes.byteLength / size) as Tensor<D>['data']);
  const copy = new Uint8Array(bytes);
  return tensor(dtype, shape, new ctor(copy.buffer, 0, copy.byteLength / size) as Tensor<D>['data']);
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

export function floatToBf16(x: number): number {
  f32[0] = x;
  const u = u32[0]!;
  if ((u & 0x7fffffff) > 0x7f800000) return ((u >>> 16) | 0x40) & 0xffff;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}
export function bf16ToFloat(b: number): number {
  u32[0] = (b & 0xffff) << 16;
  return f32[0]!;
}
export function toBf16(values: ArrayLike<number>): Uint16Array {
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = floatToBf16(values[i]!);
  return out;
}
export function fromBf16(bits: Uint16Array): Float32Array {
  const out = new Float32Array(bits.length);
  for (let i = 0; i < bits.length; i++) out[i] = bf16ToFloat(bits[i]!);
  return out;
}

/** Checks that `t` is a tensor of the given dtype(s) and, where given, shape; throws EINVAL naming `name`. */
export function checkTensor(name: string, t: unknown, opts: { dtypes?: readonly DType[]; shape?: ReadonlyArray<number | undefined>; rank?: number } = {}): asserts t is Tensor {
  if (t === null || typeof t !== 'object') throw invalid(name, 'must be a tensor { dtype, shape, data }');
  const { dtype, shape, data } = t as Partial<Tensor>;
  if (!isDType(dtype)) throw invalid(`${name}.dtype`, `must be one of bf16, fp32, fp8e4m3, int32 (got ${String(dtype)})`);
  if (opts.dtypes && !opts.dtypes.includes(dtype)) throw invalid(`${name}.dtype`, `must be ${opts.dtypes.join(' or ')} (got ${dtype})`);
  if (!Array.isArray(shape) || shape.some((d) => !Number.isInteger(d) || d < 0)) throw invalid(`${name}.shape`, 'must be an array of non-negative integers');
  if (opts.rank !== undefined && shape.length !== opts.rank) throw invalid(`${name}.shape`, `must have ${opts.rank} dimensions (got [${shape.join(', ')}])`);
  if (opts.shape) {
    opts.shape.forEach((want, i) => {
      if (want !== undefined && shape[i] !== want) throw invalid(`${name}.shape[${i}]`, `must be ${want} (got ${shape[i]})`);
    });
  }
  if (!(data instanceof (ARRAY_OF[dtype] as unknown as typeof Uint8Array))) throw invalid(`${name}.data`, `must be a ${NAME_OF[dtype]} for dtype ${dtype}`);
  if (data.length !== numel(shape)) {
    const gone = isDetached(data.buffer) ? ' (its memory is detached: a view of a closed AGRS session, or a transferred buffer)' : '';
    throw invalid(`${name}.data`, `has ${data.length} elements, shape [${shape.join(', ')}] needs ${numel(shape)}${gone}`);
  }
}

/** Checks a flat typed array argument (topkIdx, topkWeights, indices). */
export function checkArray(name: string, a: unknown, ctor: typeof Int32Array | typeof Float32Array, length?: number): void {
  if (!(a instanceof ctor)) throw invalid(name, `must be a ${ctor.name}`);
  if (isDetached(a.buffer)) throw invalid(name, 'its memory is detached (a transferred buffer, or a view of a closed AGRS session)');
  if (length !== undefined && a.length !== length) throw invalid(name, `has ${a.length} elements, expected ${length}`);
}

/**
 * Whether `buffer` was detached (transferred, or a session view's memory taken back): only an empty
 * one can be, and a view of a detached buffer cannot be made (Node 20 has no ArrayBuffer#detached).
 */
export function isDetached(buffer: ArrayBufferLike): boolean {
  if (buffer.byteLength !== 0 || typeof SharedArrayBuffer !== 'undefined' && buffer instanceof SharedArrayBuffer) return false;
  try {
    new Uint8Array(buffer);
    return false;
  } catch {
    return true;
  }
}
