/**
 * Naive references for the MoE and AGRS tests: plain loops over plain arrays, written from API.md
 * and nothing else (no layout, no signal, no native code). Also a seeded PRNG and input makers, so
 * that every test's data is reproducible.
 */
import { bf16ToFloat, floatToBf16, tensor, type Tensor } from '../../actors/index.js';

/** mulberry32: a small seeded PRNG with uniform floats in [0, 1). */
export function prng(seed: number): () => number {
    let a = seed >>> 0;
    return () => {
        a = (a + 0x6d2b79f5) >>> 0;
        let t = a;
        t = Math.imul(t ^ (t >>> 15), t | 1);
        t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
}

export const randInt = (rng: () => number, n: number): number => Math.floor(rng() * n);

export interface MoeConfig {
    worldSize: number;
    hidden: number;
    topk: number;
    numExperts: number;
}

/** The input one rank gives to dispatch. */
export interface RankRouting {
    x: Tensor<'bf16'> | Tensor<'fp8e4m3'>;
    scales?: Tensor<'fp32'>;
    topkIdx: Int32Array;
    topkWeights: Float32Array;
}

/** A random bf16 row-major [numTokens, hidden] tensor with values that are exact in bf16. */
export function randomBf16(rng: () => number, numTokens: number, hidden: number): Tensor<'bf16'> {
    const data = new Uint16Array(numTokens * hidden);
    for (let i = 0; i < data.length; i++) data[i] = floatToBf16((randInt(rng, 2001) - 1000) / 64);
    return tensor('bf16', [numTokens, hidden], data);
}

/** Random fp8e4m3 bits (any byte but the NaN encodings 0x7f / 0xff: the bits are moved, not read). */
export function randomFp8(rng: () => number, numTokens: number, hidden: number): { x: Tensor<'fp8e4m3'>; scales: Tensor<'fp32'> } {
    const data = new Uint8Array(numTokens * hidden);
    for (let i = 0; i < data.length; i++) data[i] = randInt(rng, 0x7f) | (rng() < 0.5 ? 0x80 : 0);
    const scales = new Float32Array(numTokens * (hidden / 128));
    for (let i = 0; i < scales.length; i++) scales[i] = Math.fround(1 + rng() * 7);
    return { x: tensor('fp8e4m3', [numTokens, hidden], data), scales: tensor('fp32', [numTokens, hidden / 128], scales) };
}

/**
 * Random top-k routing: each token picks `used` distinct experts (random count in [0, topk] unless
 * given), placed at random slots; the other slots are -1. Weights are nonzero on used slots only.
 */
export function randomRouting(rng: () => number, numTokens: number, cfg: MoeConfig, used?: number): { topkIdx: Int32Array; topkWeights: Float32Array } {
    const { topk: K, numExperts: E } = cfg;
    const topkIdx = new Int32Array(numTokens * K).fill(-1);
    const topkWeights = new Float32Array(numTokens * K);
    for (let t = 0; t < numTokens; t++) {
        const n = used ?? randInt(rng, K + 1);
        const experts = new Set<number>();
        while (experts.size < n) experts.add(randInt(rng, E));
        const slots = Array.from({ length: K }, (_, k) => k).sort(() => rng() - 0.5).slice(0, n);
        [...experts].forEach((e, i) => {
            topkIdx[t * K + slots[i]!] = e;
            topkWeights[t * K + slots[i]!] = Math.fround(0.125 + rng());
        });
    }
    return { topkIdx, topkWeights };
}

/** A random dispatch input for one rank (bf16, or fp8 with scales). */
export function randomDispatchInput(rng: () => number, numTokens: number, cfg: MoeConfig, fp8 = false): RankRouting {
    const routing = randomRouting(rng, numTokens, cfg);
    if (!fp8) return { x: randomBf16(rng, numTokens, cfg.hidden), ...routing };
    return { ...randomFp8(rng, numTokens, cfg.hidden), ...routing };
}

export interface ExpectedDispatch {
    /** received rows, as the flat element array of the x dtype */
    x: Uint16Array | Uint8Array;
    scales?: Float32Array;
    topkIdx: Int32Array;
    topkWeights: Float32Array;
    srcRank: Int32Array;
    srcToken: Int32Array;
    tokensPerExpert: number[];
}

/**
 * What rank `dst` receives (API.md): every token with at least one expert in dst's block
 * [dst*E/W, (dst+1)*E/W), once, in the order (source rank, source token); its slots keep only
 * dst's experts, as local ids (other slots -1, weight 0); tokensPerExpert counts tokens per local
 * expert, rounded up to `alignment`.
 */
export function referenceDispatch(inputs: RankRouting[], cfg: MoeConfig, dst: number, alignment = 1): ExpectedDispatch {
    const { hidden: H, topk: K, numExperts: E, worldSize: W } = cfg;
    const perRank = E / W;
    const lo = dst * perRank;
    const hi = lo + perRank;
    const rows: number[][] = [];
    const scales: number[][] = [];
    const idx: number[] = [];
    const weights: number[] = [];
    const srcRank: number[] = [];
    const srcToken: number[] = [];
    const counts = new Array<number>(perRank).fill(0);
    inputs.forEach((input, src) => {
        const T = input.x.shape[0]!;
        for (let t = 0; t < T; t++) {
            const slots = Array.from({ length: K }, (_, k) => input.topkIdx[t * K + k]!);
            if (!slots.some((e) => e >= lo && e < hi)) continue;
            rows.push(Array.from(input.x.data.subarray(t * H, (t + 1) * H)));
            if (input.scales) scales.push(Array.from(input.scales.data.subarray(t * (H / 128), (t + 1) * (H / 128))));
            slots.forEach((e, k) => {
                const mine = e >= lo && e < hi;
                idx.push(mine ? e - lo : -1);
                weights.push(mine ? input.topkWeights[t * K + k]! : 0);
                if (mine) counts[e - lo]! += 1;
            });
            srcRank.push(src);
            srcToken.push(t);
        }
    });
    const fp8 = inputs[0]!.x.dtype === 'fp8e4m3';
    return {
        x: fp8 ? Uint8Array.from(rows.flat()) : Uint16Array.from(rows.flat()),
        ...(inputs[0]!.scales ? { scales: Float32Array.from(scales.flat()) } : {}),
        topkIdx: Int32Array.from(idx),
        topkWeights: Float32Array.from(weights),
        srcRank: Int32Array.from(srcRank),
        srcToken: Int32Array.from(srcToken),
        tokensPerExpert: counts.map((n) => Math.ceil(n / alignment) * alignment),
    };
}

/** A rank's expert output for its received rows: a deterministic function of the rows and the rank. */
export function expertRows(x: Uint16Array, rank: number): Uint16Array {
    const out = new Uint16Array(x.length);
    for (let i = 0; i < x.length; i++) out[i] = floatToBf16(bf16ToFloat(x[i]!) * (rank + 1) + 0.25 * (i % 7));
    return out;
}

/** What one rank gives to combine, as the reference sees it: its received rows' sources and returns. */
export interface ReturnedRows {
    srcRank: Int32Array;
    srcToken: Int32Array;
    /** [numRecv, hidden] bf16 bits */
    x: Uint16Array;
    /** [numRecv, topk] */
    topkWeights: Float32Array;
}

/**
 * combine on rank `src` (API.md): for each of its tokens t, in the original order, the fp32 sum over
 * the ranks that received t, in rank order, of the row each returns, then + each bias in order,
 * rounded to bf16 (RNE). Weights: the fp32 sum, in rank order, of the weight rows they return.
 */
export function referenceCombine(
    returned: ReturnedRows[], src: number, numTokens: number, hidden: number, topk: number, bias: Uint16Array[] = [],
): { x: Uint16Array; topkWeights: Float32Array } {
    const acc = new Float64Array(numTokens * hidden); // every step is rounded with Math.fround: fp32 arithmetic
    const w = new Float32Array(numTokens * topk);
    returned.forEach((r) => {
        for (let i = 0; i < r.srcRank.length; i++) {
            if (r.srcRank[i] !== src) continue;
            const t = r.srcToken[i]!;
            for (let h = 0; h < hidden; h++) acc[t * hidden + h] = Math.fround(acc[t * hidden + h]! + bf16ToFloat(r.x[i * hidden + h]!));
            for (let k = 0; k < topk; k++) w[t * topk + k] = Math.fround(w[t * topk + k]! + r.topkWeights[i * topk + k]!);
        }
    });
    for (const b of bias) for (let i = 0; i < acc.length; i++) acc[i] = Math.fround(acc[i]! + bf16ToFloat(b[i]!));
    const x = new Uint16Array(acc.length);
    for (let i = 0; i < acc.length; i++) x[i] = floatToBf16(acc[i]!);
    return { x, topkWeights: w };
}
