/**
 * Naive references for AGRS collectives: allGather concatenates in rank order; reduceScatter sums
 * in fp32, rank by rank (Math.fround at every step), and rounds bf16 results once (RNE); allReduce
 * is the same sums over whole tensors.
 */
import { fromBf16, tensor, toBf16, type Tensor } from '../../actors/index.js';
import { randInt } from './moe-reference.js';

export function randomTensor(rng: () => number, dtype: 'fp32' | 'bf16' | 'int32', shape: number[]): Tensor {
    const n = shape.reduce((a, b) => a * b, 1);
    if (dtype === 'int32') return tensor('int32', shape, Int32Array.from({ length: n }, () => randInt(rng, 1 << 30) - (1 << 29)));
    const values = Array.from({ length: n }, () => (rng() - 0.5) * 2 ** randInt(rng, 12));
    return dtype === 'fp32' ? tensor('fp32', shape, Float32Array.from(values)) : tensor('bf16', shape, toBf16(values));
}

/** allGather reference: the ranks' tensors concatenated along the first dimension, in rank order. */
export function referenceAllGather(inputs: Tensor[]): Tensor {
    const [first] = inputs;
    const data = new (first!.data.constructor as new (n: number) => Tensor['data'])(first!.data.length * inputs.length);
    inputs.forEach((t, r) => data.set(t.data as never, r * t.data.length));
    return tensor(first!.dtype, [inputs.length * first!.shape[0]!, ...first!.shape.slice(1)], data as never);
}

/** Element-wise fp32 sums of values[q][from + i], i < n, over q in `order` (rank order by default), Math.fround at every step. */
function sumsInOrder(values: ArrayLike<number>[], from: number, n: number, order: readonly number[] = values.map((_, q) => q)): Float32Array {
    const acc = new Float32Array(n);
    for (let i = 0; i < n; i++) {
        let s = 0;
        for (const q of order) s = Math.fround(s + values[q]![from + i]!);
        acc[i] = s;
    }
    return acc;
}

const valuesOf = (t: Tensor): ArrayLike<number> => (t.dtype === 'bf16' ? fromBf16(t.data as Uint16Array) : (t.data as Float32Array));
const rounded = (dtype: string, shape: number[], acc: Float32Array): Tensor => (dtype === 'bf16' ? tensor('bf16', shape, toBf16(acc)) : tensor('fp32', shape, acc));

/** reduceScatter reference: rank r gets, per element of rows [r*n, (r+1)*n), the fp32 sum over ranks q in order. */
export function referenceReduceScatter(inputs: Tensor[], r: number): Tensor {
    const W = inputs.length;
    const { dtype, shape } = inputs[0]!;
    const chunk = inputs[0]!.data.length / W;
    return rounded(dtype, [shape[0]! / W, ...shape.slice(1)], sumsInOrder(inputs.map(valuesOf), r * chunk, chunk));
}

/** allReduce reference: the ranks' tensors summed element by element in rank order (or in `order`), bf16 rounded once. */
export function referenceAllReduce(inputs: Tensor[], order?: readonly number[]): Tensor {
    const { dtype, shape, data } = inputs[0]!;
    return rounded(dtype, shape, sumsInOrder(inputs.map(valuesOf), 0, data.length, order));
}
