/**
 * MoE combine on the host backend (API.md): back[r].x[t] = the fp32 sum, over the ranks that
 * received token t and in rank order, of the row each returns for it, plus the biases, rounded to
 * bf16 (RNE); back[r].topkWeights = the fp32 sum of the weight rows they return; original token
 * order. Checked bit for bit against test/helpers/moe-reference.ts#referenceCombine.
 */
import { describe, expect, test } from 'vitest';
import { floatToBf16, tensor, type DispatchResult, type Group, type RankflowError, type Tensor } from '../actors/index.js';
import { program, recordTransitions, withGroup } from './helpers/group.js';
import {
    expertRows, prng, randomBf16, randomDispatchInput, referenceCombine, type MoeConfig, type RankRouting, type ReturnedRows,
} from './helpers/moe-reference.js';

const cfg: MoeConfig = { worldSize: 4, hidden: 256, topk: 4, numExperts: 16 };
const buffer = (c: MoeConfig, maxTokensPerRank = 32) => ({ maxTokensPerRank, hidden: c.hidden, topk: c.topk, numExperts: c.numExperts });

const randomInputs = (seed: number, c: MoeConfig, tokens: (r: number) => number): RankRouting[] => {
    const rng = prng(seed);
    return Array.from({ length: c.worldSize }, (_, r) => randomDispatchInput(rng, tokens(r), c));
};

/** Each rank returns expertRows(its received rows, rank), and the reference sees the same rows. */
function expertReturns(out: DispatchResult[], weights?: Float32Array[]): { returned: ReturnedRows[]; x: Tensor<'bf16'>[] } {
    const x = out.map((o, r) => tensor('bf16', o.x.shape, expertRows(o.x.data as Uint16Array, r)));
    const returned = out.map((o, r) => ({ srcRank: o.srcRank, srcToken: o.srcToken, x: x[r]!.data, topkWeights: weights?.[r] ?? o.topkWeights }));
    return { returned, x };
}

async function dispatchAndCombine(g: Group, inputs: RankRouting[], c: MoeConfig, opts: { bias?: (r: number) => Tensor<'bf16'>[]; weights?: boolean } = {}) {
    const out = await g.dispatch(inputs);
    const rng = prng(99);
    const weights = opts.weights ? out.map((o) => Float32Array.from(o.topkWeights, () => Math.fround(rng() * 4 - 2))) : undefined;
    const { returned, x } = expertReturns(out, weights);
    const back = await g.combine(out.map((o, r) => ({
        x: x[r]!, handle: o.handle,
        ...(weights ? { topkWeights: weights[r] } : {}),
        ...(opts.bias ? { bias: opts.bias(r) } : {}),
    })));
    back.forEach((b, r) => {
        const T = inputs[r]!.x.shape[0]!;
        const want = referenceCombine(returned, r, T, c.hidden, c.topk, opts.bias?.(r).map((t) => t.data) ?? []);
        expect(b.x.shape).toEqual([T, c.hidden]);
        expect(b.x.data, `rank ${r} x`).toEqual(want.x);
        expect(b.topkWeights, `rank ${r} topkWeights`).toEqual(want.topkWeights);
    });
    return { out, back };
}

describe('combine: sums what the receiving ranks return', () => {
    test('bf16 rows summed in fp32 over the receiving ranks, rounded to bf16, in the original token order', async () => {
        await withGroup({ ranks: 4, buffer: buffer(cfg) }, async (g) => {
            await dispatchAndCombine(g, randomInputs(1, cfg, (r) => 12 + 5 * r), cfg);
        });
    });

    test('without topkWeights the combined weights are the dispatched ones (0 on -1 slots)', async () => {
        const inputs = randomInputs(2, cfg, () => 16);
        await withGroup({ ranks: 4, buffer: buffer(cfg) }, async (g) => {
            const { back } = await dispatchAndCombine(g, inputs, cfg);
            back.forEach((b, r) => {
                const d = inputs[r]!;
                expect(b.topkWeights).toEqual(d.topkWeights.map((w, i) => (d.topkIdx[i] === -1 ? 0 : w)));
            });
        });
    });

    test('with topkWeights each rank returns its own weights and they are summed in rank order', async () => {
        await withGroup({ ranks: 4, buffer: buffer(cfg) }, async (g) => {
            await dispatchAndCombine(g, randomInputs(3, cfg, () => 10), cfg, { weights: true });
        });
    });

    test.each([1, 2])('%i bias tensor(s) [numTokens, hidden] are added after the sum', async (n) => {
        const rng = prng(4 + n);
        const T = (r: number) => 6 + r;
        const biases = Array.from({ length: 4 }, (_, r) => Array.from({ length: n }, () => randomBf16(rng, T(r), cfg.hidden)));
        await withGroup({ ranks: 4, buffer: buffer(cfg) }, async (g) => {
            await dispatchAndCombine(g, randomInputs(6, cfg, T), cfg, { bias: (r) => biases[r]! });
        });
    });

    test('a single bias tensor may be passed without an array', async () => {
        const rng = prng(7);
        const inputs = randomInputs(8, cfg, () => 5);
        const bias = inputs.map(() => randomBf16(rng, 5, cfg.hidden));
        await withGroup({ ranks: 4, buffer: buffer(cfg) }, async (g) => {
            const out = await g.dispatch(inputs);
            const { returned, x } = expertReturns(out);
            const back = await g.combine(out.map((o, r) => ({ x: x[r]!, handle: o.handle, bias: bias[r]! })));
            back.forEach((b, r) => expect(b.x.data).toEqual(referenceCombine(returned, r, 5, cfg.hidden, cfg.topk, [bias[r]!.data]).x));
        });
    });

    test.each([1, 2, 3, 8])('world size %i', async (W) => {
        const c: MoeConfig = { worldSize: W, hidden: 128, topk: Math.min(4, 2 * W), numExperts: 2 * W };
        await withGroup({ ranks: W, buffer: buffer(c, 16) }, async (g) => {
            await dispatchAndCombine(g, randomInputs(20 + W, c, (r) => 3 + ((5 * r) % 13)), c);
        });
    });

    test('every rank passes combining -> ready', async () => {
        await withGroup({ ranks: 4, buffer: buffer(cfg) }, async (g) => {
            const out = await g.dispatch(randomInputs(9, cfg, () => 4));
            const rec = recordTransitions(g);
            await g.combine(out.map((o) => ({ x: o.x as Tensor<'bf16'>, handle: o.handle })));
            for (let r = 0; r < 4; r++) expect(rec.paths(r)).toEqual(['combining', 'ready']);
        });
    });
});

describe('combine: rounding', () => {
    // Token 0 of rank 0 goes to experts on ranks 0, 1 and 2; they return the constant rows a, b, c.
    async function combineConstants(a: number, b: number, c: number): Promise<number> {
        const c3: MoeConfig = { worldSize: 3, hidden: 128, topk: 3, numExperts: 3 };
        const inputs: RankRouting[] = [0, 1, 2].map((r) => ({
            x: randomBf16(prng(r), r === 0 ? 1 : 0, 128),
            topkIdx: Int32Array.from(r === 0 ? [0, 1, 2] : []),
            topkWeights: Float32Array.from(r === 0 ? [1, 1, 1] : []),
        }));
        return withGroup({ ranks: 3, buffer: buffer(c3, 4) }, async (g) => {
            const out = await g.dispatch(inputs);
            const rows = [a, b, c].map((v, r) => tensor('bf16', out[r]!.x.shape, new Uint16Array(out[r]!.x.data.length).fill(floatToBf16(v))));
            const back = await g.combine(out.map((o, r) => ({ x: rows[r]!, handle: o.handle })));
            expect(new Set(back[0]!.x.data).size).toBe(1);
            return back[0]!.x.data[0]!;
        });
    }

    test('ties round to even: 1 + 2^-8 -> 1, and 1 + 3 * 2^-8 -> 1 + 2^-6', async () => {
        expect(await combineConstants(1, 2 ** -8, 0)).toBe(floatToBf16(1));
        expect(await combineConstants(1 + 2 ** -7, 2 ** -8, 0)).toBe(floatToBf16(1 + 2 ** -6));
    });

    test('the sum is fp32, not exact: 1 + 2^-8 + 2^-30 loses 2^-30 and then ties to 1 (exact math would round up)', async () => {
        expect(await combineConstants(1, 2 ** -8, 2 ** -30)).toBe(floatToBf16(1));
        // in fp32 the third term vanishes, leaving the exact tie 1 + 2^-8 (the exact sum lies above it)
        expect(Math.fround(Math.fround(1 + 2 ** -8) + 2 ** -30)).toBe(1 + 2 ** -8);
    });
});

describe('combine: edge cases', () => {
    const small: MoeConfig = { worldSize: 4, hidden: 128, topk: 4, numExperts: 8 };

    test('ranks with zero tokens get an empty result; their peers are unaffected', async () => {
        await withGroup({ ranks: 4, buffer: buffer(small) }, async (g) => {
            const { back } = await dispatchAndCombine(g, randomInputs(30, small, (r) => (r === 1 ? 0 : 9)), small);
            expect(back[1]!.x.shape).toEqual([0, 128]);
        });
    });

    test('every slot -1: tokens come back as zeros plus the bias', async () => {
        const rng = prng(31);
        const inputs: RankRouting[] = [0, 1, 2, 3].map(() => ({ x: randomBf16(rng, 3, 128), topkIdx: new Int32Array(12).fill(-1), topkWeights: new Float32Array(12) }));
        const bias = inputs.map(() => randomBf16(rng, 3, 128));
        await withGroup({ ranks: 4, buffer: buffer(small) }, async (g) => {
            const out = await g.dispatch(inputs);
            const back = await g.combine(out.map((o, r) => ({ x: o.x as Tensor<'bf16'>, handle: o.handle, bias: [bias[r]!] })));
            back.forEach((b, r) => {
                expect(b.x.data).toEqual(bias[r]!.data);
                expect(b.topkWeights).toEqual(new Float32Array(12));
            });
        });
    });

    test('all tokens to one expert: only its owner returns rows', async () => {
        const rng = prng(32);
        const inputs: RankRouting[] = [0, 1, 2, 3].map(() => ({
            x: randomBf16(rng, 8, 128), topkIdx: Int32Array.from({ length: 32 }, (_, i) => (i % 4 === 3 ? 7 : -1)), topkWeights: new Float32Array(32).fill(0.75),
        }));
        await withGroup({ ranks: 4, buffer: buffer(small) }, async (g) => {
            await dispatchAndCombine(g, inputs, small);
        });
    });

    test('a combine whose x does not have numRecv rows is refused with EINVAL and no rank moves', async () => {
        await withGroup({ ranks: 4, buffer: buffer(small) }, async (g) => {
            const out = await g.dispatch(randomInputs(33, small, () => 6));
            const rec = recordTransitions(g);
            const bad = out.map((o, r) => ({ x: tensor('bf16', [o.x.shape[0]! + (r === 2 ? 1 : 0), 128]), handle: o.handle }));
            const err = (await g.combine(bad).catch((e: unknown) => e)) as RankflowError;
            expect(err.code).toBe('EINVAL');
            expect(err.message).toMatch(/inputs\[2\]\.x\.shape\[0\]: must be \d+/);
            expect(rec.events).toEqual([]);
        });
    });

    test('combine twice with the same handle gives the same result', async () => {
        await withGroup({ ranks: 4, buffer: buffer(small) }, async (g) => {
            const out = await g.dispatch(randomInputs(34, small, () => 7));
            const args = out.map((o) => ({ x: o.x as Tensor<'bf16'>, handle: o.handle }));
            const a = await g.combine(args);
            const b = await g.combine(args);
            expect(b).toEqual(a);
        });
    });
});

describe('combine in a rank program', () => {
    test('dispatch + expert + combine inside the workers equals driver mode, and a cached dispatch gives the same', async () => {
        const inputs = randomInputs(40, cfg, (r) => 4 + 4 * r);
        await withGroup({ ranks: 4, buffer: buffer(cfg) }, async (g) => {
            type Result = { combined: { x: Uint16Array; topkWeights: Float32Array } };
            const fromProgram = await g.run<Result>(program('moe.mjs'), { inputs });
            const cached = await g.run<Result>(program('moe.mjs'), { inputs, handleOnly: true });
            const out = await g.dispatch(inputs);
            const { returned, x } = expertReturns(out);
            const back = await g.combine(out.map((o, r) => ({ x: x[r]!, handle: o.handle })));
            back.forEach((b, r) => {
                expect(b.x.data).toEqual(referenceCombine(returned, r, inputs[r]!.x.shape[0]!, cfg.hidden, cfg.topk).x);
                expect(fromProgram[r]!.combined).toEqual({ x: b.x.data, topkWeights: b.topkWeights });
                expect(cached[r]!.combined).toEqual({ x: b.x.data, topkWeights: b.topkWeights });
            });
        });
    });
});
