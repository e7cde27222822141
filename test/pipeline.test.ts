/**
 * Pipeline send/recv on the ring (host backend): out[r] = in[(r - 1 + W) % W], for W in 1..8;
 * ppSizeHint gives a buffer.bytes that fits a given exchange, and a larger one is refused.
 */
import { describe, expect, test } from 'vitest';
import { ppSizeHint, tensor, type RankflowError, type Tensor } from '../actors/index.js';
import { recordTransitions, withGroup } from './helpers/group.js';
import { prng, randInt } from './helpers/moe-reference.js';

const buffer = (W: number) => ({ maxTokensPerRank: 8, hidden: 128, topk: 1, numExperts: W });

const randomInt32 = (rng: () => number, shape: number[]): Tensor<'int32'> =>
    tensor('int32', shape, Int32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, () => randInt(rng, 2 ** 31)));

describe('ppExchange', () => {
    test.each([1, 2, 3, 4, 5, 6, 7, 8])('%i ranks: each rank receives what its previous rank on the ring sent', async (W) => {
        const rng = prng(W);
        await withGroup({ ranks: W, buffer: buffer(W) }, async (g) => {
            for (const shape of [[3, 5], [64]]) {
                const inputs = Array.from({ length: W }, () => randomInt32(rng, shape));
                const out = await g.ppExchange(inputs);
                out.forEach((o, r) => expect(o, `rank ${r}`).toEqual(inputs[(r - 1 + W) % W]));
            }
        });
    });

    test('back-to-back exchanges of bf16 and fp32 each deliver their own data', async () => {
        const rng = prng(9);
        await withGroup({ ranks: 4, buffer: buffer(4) }, async (g) => {
            for (let i = 0; i < 6; i++) {
                const inputs = [0, 1, 2, 3].map((r) => (i % 2 === 0
                    ? tensor('bf16', [2, 8], Uint16Array.from({ length: 16 }, () => randInt(rng, 0x7f00)))
                    : tensor('fp32', [4], Float32Array.from({ length: 4 }, () => r + i + rng()))));
                const out = await g.ppExchange(inputs);
                out.forEach((o, r) => expect(o).toEqual(inputs[(r + 3) % 4]));
            }
        });
    });

    test('every rank passes pipeline -> ready', async () => {
        await withGroup({ ranks: 3, buffer: buffer(3) }, async (g) => {
            const rec = recordTransitions(g);
            await g.ppExchange([0, 1, 2].map(() => tensor('fp32', [2])));
            for (let r = 0; r < 3; r++) expect(rec.paths(r)).toEqual(['pipeline', 'ready']);
        });
    });

    test('ppSizeHint counts the per-expert counters of the workspace when told numExperts', async () => {
        const maxBytes = 1 << 20, numExperts = 65536;  // 4 MiB of counters: the workspace outgrows 2 MiB
        const bytes = ppSizeHint({ maxBytes, numExperts }, 2);
        expect(bytes).toBeGreaterThan(ppSizeHint({ maxBytes }, 2));
        await withGroup({ ranks: 2, buffer: { ...buffer(2), numExperts, bytes } }, async (g) => {
            const t = [0, 1].map(() => tensor('int32', [maxBytes / 4]));
            await expect(g.ppExchange(t)).resolves.toHaveLength(2);
        });
        expect(() => ppSizeHint({ maxBytes, numExperts: 3 }, 2)).toThrow(/^numExperts/);
    });

    test('ppSizeHint: a group made with it exchanges maxBytes per rank; one byte more is EINVAL', async () => {
        const maxBytes = 3 * (1 << 20);
        const bytes = ppSizeHint({ maxBytes }, 2);
        expect(bytes % (1 << 21)).toBe(0);
        await withGroup({ ranks: 2, buffer: { ...buffer(2), bytes } }, async (g) => {
            const rng = prng(10);
            const big = [0, 1].map(() => randomInt32(rng, [maxBytes / 4]));
            const out = await g.ppExchange(big);
            expect(out[0]).toEqual(big[1]);
            const bufferBytes = (await g.info(0)).bufferBytes;
            const over = [0, 1].map(() => tensor('fp32', [bufferBytes / 4 + 1]));
            const err = (await g.ppExchange(over).catch((e: unknown) => e)) as RankflowError;
            expect(err.code).toBe('EINVAL');
            expect(err.message).toMatch(/per rank exceed the buffer .*ppSizeHint/);
        });
    });
});
