/**
 * AGRS sessions on the host backend (API.md): group.openSession puts every rank in its session
 * state; allGather and reduceScatter (fp32 and bf16, fp32 accumulation in rank order) run inside it,
 * each checked exactly against a plain reference; close() brings the ranks back to ready. Calls out
 * of turn are refused with STATE, limits with EINVAL, and a rank that never joins times out.
 */
import { describe, expect, test } from 'vitest';
import { createGroup, sessionSizeHint, tensor, type RankflowError, type Tensor } from '../actors/index.js';
import { program, recordTransitions, withGroup } from './helpers/group.js';
import { prng } from './helpers/moe-reference.js';
import { randomTensor, referenceAllGather, referenceReduceScatter } from './helpers/agrs-reference.js';
import { floatToBf16 } from '../actors/index.js';

// 24 experts: divisible by every world size used here (1, 2, 3, 4, 8)
const buffer = { maxTokensPerRank: 16, hidden: 128, topk: 2, numExperts: 24 };

describe('AGRS session: states', () => {
    test('open, allGather, reduceScatter, close: every rank goes session.opening -> open -> gathering/reducing -> open -> closing -> ready', async () => {
        await withGroup({ ranks: 3, buffer }, async (g) => {
            const rec = recordTransitions(g);
            const s = await g.openSession({ maxBytes: 4096, maxAllGathers: 4 });
            expect(g.snapshot().map((x) => x.state)).toEqual(['session.open', 'session.open', 'session.open']);
            await s.allGather([0, 1, 2].map(() => tensor('fp32', [4])));
            await s.reduceScatter([0, 1, 2].map(() => tensor('fp32', [6])));
            await s.close();
            for (let r = 0; r < 3; r++) {
                expect(rec.paths(r)).toEqual([
                    'session.opening', 'session.open', 'session.gathering', 'session.open', 'session.reducing', 'session.open', 'session.closing', 'ready',
                ]);
            }
        });
    });

    test('sessions can be opened again after close, and collectives outside still work', async () => {
        const rng = prng(1);
        await withGroup({ ranks: 2, buffer }, async (g) => {
            for (let i = 0; i < 3; i++) {
                const s = await g.openSession({ maxBytes: 1024, maxAllGathers: 2 });
                const inputs = [0, 1].map(() => randomTensor(rng, 'fp32', [8]));
                expect(await s.allGather(inputs)).toEqual([0, 1].map(() => referenceAllGather(inputs)));
                await s.close();
                const outside = [0, 1].map(() => randomTensor(rng, 'int32', [5]));
                expect(await g.allGather(outside)).toEqual([0, 1].map(() => referenceAllGather(outside)));
            }
        });
    });
});

describe('AGRS session: allGather and reduceScatter', () => {
    test.each([
        ['fp32', 2], ['bf16', 3], ['int32', 4], ['fp32', 8],
    ] as const)('allGather of %s on %i ranks: g[r] is the concatenation in rank order', async (dtype, W) => {
        const rng = prng(10 + W);
        await withGroup({ ranks: W, buffer }, async (g) => {
            const s = await g.openSession({ maxBytes: 4096, maxAllGathers: 3 });
            for (const shape of [[3, 5], [1], [7, 2, 2]]) {
                const inputs = Array.from({ length: W }, () => randomTensor(rng, dtype, shape));
                const want = referenceAllGather(inputs);
                expect(await s.allGather(inputs)).toEqual(Array.from({ length: W }, () => want));
            }
            await s.close();
        });
    });

    test.each([
        ['fp32', 2], ['fp32', 3], ['bf16', 4], ['bf16', 8], ['fp32', 1],
    ] as const)('reduceScatter of %s on %i ranks: rank r gets the fp32 sum over ranks of rows [r*n, (r+1)*n)', async (dtype, W) => {
        const rng = prng(20 + W);
        await withGroup({ ranks: W, buffer }, async (g) => {
            const s = await g.openSession({ maxBytes: 4096, maxAllGathers: 2 });
            for (const shape of [[W * 3, 4], [W * 17]]) {
                const inputs = Array.from({ length: W }, () => randomTensor(rng, dtype, shape) as Tensor<'fp32' | 'bf16'>);
                const out = await s.reduceScatter(inputs);
                out.forEach((o, r) => expect(o, `rank ${r}`).toEqual(referenceReduceScatter(inputs, r)));
            }
            await s.close();
        });
    });

    test('bf16 reduceScatter accumulates in fp32 and rounds once: 1 + 2^-8 + 2^-8 is 1 + 2^-7, not 1', async () => {
        // pairwise bf16 rounding would give 1 (1 + 2^-8 ties to even, twice); fp32 keeps both halves
        await withGroup({ ranks: 3, buffer }, async (g) => {
            const s = await g.openSession({ maxBytes: 64, maxAllGathers: 1 });
            const inputs = [1, 2 ** -8, 2 ** -8].map((v) => tensor('bf16', [3, 2], new Uint16Array(6).fill(floatToBf16(v))));
            const out = await s.reduceScatter(inputs);
            for (const o of out) expect(Array.from(o.data)).toEqual([floatToBf16(1 + 2 ** -7), floatToBf16(1 + 2 ** -7)]);
            await s.close();
        });
    });
});

describe('AGRS session: refusals', () => {
    test('a session op after close is refused with STATE, and so is a second close', async () => {
        await withGroup({ ranks: 2, buffer }, async (g) => {
            const s = await g.openSession({ maxBytes: 256, maxAllGathers: 1 });
            await s.close();
            const gathered = (await s.allGather([tensor('fp32', [2]), tensor('fp32', [2])]).catch((e: unknown) => e)) as RankflowError;
            expect(gathered.code).toBe('STATE');
            expect(gathered.message).toMatch(/session is closed/);
            const reduced = (await s.reduceScatter([tensor('fp32', [2]), tensor('fp32', [2])]).catch((e: unknown) => e)) as RankflowError;
            expect(reduced.code).toBe('STATE');
            expect(((await s.close().catch((e: unknown) => e)) as RankflowError).code).toBe('STATE');
            expect(g.snapshot().map((x) => x.state)).toEqual(['ready', 'ready']);
        });
    });

    test('openSession while a session is open is refused with STATE saying so; the open session goes on', async () => {
        await withGroup({ ranks: 2, buffer }, async (g) => {
            const s = await g.openSession({ maxBytes: 256, maxAllGathers: 1 });
            const err = (await g.openSession({ maxBytes: 256, maxAllGathers: 1 }).catch((e: unknown) => e)) as RankflowError;
            expect(err.code).toBe('STATE');
            expect(err.message).toMatch(/an AGRS session is already open/);
            const inputs = [tensor('int32', [1], Int32Array.of(7)), tensor('int32', [1], Int32Array.of(9))];
            expect((await s.allGather(inputs))[1]!.data).toEqual(Int32Array.of(7, 9));
            await s.close();
        });
    });

    test('collectives outside the session are refused with STATE while it is open', async () => {
        await withGroup({ ranks: 2, buffer }, async (g) => {
            const s = await g.openSession({ maxBytes: 256, maxAllGathers: 1 });
            const err = (await g.barrier().catch((e: unknown) => e)) as RankflowError;
            expect(err.code).toBe('STATE');
            expect(err.message).toMatch(/rank 0 is in state 'session\.open'; this operation needs ready/);
            await s.close();
            await g.barrier();
        });
    });

    test('more collectives than maxAllGathers: EINVAL naming it, and the ranks stay in session.open', async () => {
        await withGroup({ ranks: 3, buffer }, async (g) => {
            const s = await g.openSession({ maxBytes: 256, maxAllGathers: 2 });
            const t = [0, 1, 2].map((r) => tensor('int32', [1], Int32Array.of(r)));
            await s.allGather(t);
            await s.reduceScatter([0, 1, 2].map(() => tensor('fp32', [3])));
            const err = (await s.allGather(t).catch((e: unknown) => e)) as RankflowError;
            expect(err.code).toBe('EINVAL');
            expect(err.message).toMatch(/^maxAllGathers: this session allows 2 collectives/);
            expect(g.snapshot().map((x) => x.state)).toEqual(['session.open', 'session.open', 'session.open']);
            await s.close();
            expect(g.snapshot().map((x) => x.state)).toEqual(['ready', 'ready', 'ready']);
        });
    });

    test('a tensor above maxBytes per rank, and a session larger than the buffer, are EINVAL before any rank moves', async () => {
        await withGroup({ ranks: 2, buffer }, async (g) => {
            const big = (await g.openSession({ maxBytes: 1 << 30, maxAllGathers: 4 }).catch((e: unknown) => e)) as RankflowError;
            expect(big.code).toBe('EINVAL');
            expect(big.message).toMatch(/maxBytes: .* exceeds the buffer/);
            const s = await g.openSession({ maxBytes: 16, maxAllGathers: 1 });
            const rec = recordTransitions(g);
            const err = (await s.allGather([tensor('fp32', [5]), tensor('fp32', [5])]).catch((e: unknown) => e)) as RankflowError;
            expect(err.code).toBe('EINVAL');
            expect(err.message).toMatch(/20 bytes per rank exceed the session's maxBytes \(16\)/);
            expect(rec.events).toEqual([]);
            await s.close();
        });
    });

    test('a rank whose program returns instead of joining: the others are released at once, the run rejects with STATE naming it, and the group is ready', async () => {
        const g = await createGroup({ ranks: 2, backend: 'host', buffer });
        try {
            const rec = recordTransitions(g);
            const err = (await g.run(program('session-unless.mjs'), { skip: 1, maxBytes: 64 }).catch((e: unknown) => e)) as RankflowError;
            expect(err).toMatchObject({ code: 'STATE', rank: 1, message: expect.stringMatching(/rank 1's program returned after collective/) });
            // rank 0 was released from its session open, or refused it at the start when the release came first
            expect(rec.paths(0).filter((p) => p !== 'session.opening')).toEqual(['released', 'recovering', 'ready']);
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
            const s = await g.openSession({ maxBytes: 16, maxAllGathers: 1 });
            const gathered = await s.allGather([tensor('int32', [2], Int32Array.of(1, 2)), tensor('int32', [2], Int32Array.of(3, 4))]);
            expect(gathered[1]!.data).toEqual(Int32Array.of(1, 2, 3, 4));
            await s.close();
        } finally {
            await g.destroy();
        }
    });
});

describe('sessionSizeHint', () => {
    // 1 MiB + 128 bytes per rank on 2 ranks: each collective needs just over 2 MiB of the buffer.
    const maxBytes = (1 << 20) + 128;
    const parts = (rng: () => number) => [0, 1].map(() => randomTensor(rng, 'int32', [maxBytes / 4]));

    test('gives a buffer.bytes whose group opens the session and runs maxAllGathers collectives of maxBytes', async () => {
        const bytes = sessionSizeHint({ maxBytes, maxAllGathers: 2, numExperts: buffer.numExperts }, 2);
        expect(bytes % (1 << 21)).toBe(0);
        await withGroup({ ranks: 2, buffer: { ...buffer, bytes } }, async (g) => {
            const s = await g.openSession({ maxBytes, maxAllGathers: 2 });
            const rng = prng(3);
            const a = parts(rng), b = parts(rng);
            expect((await s.allGather(a))[0]).toEqual(referenceAllGather(a));
            expect((await s.allGather(b))[1]).toEqual(referenceAllGather(b));
            await s.close();
        });
    });

    test('2 MiB less is too little: openSession is EINVAL naming maxBytes', async () => {
        const bytes = sessionSizeHint({ maxBytes, maxAllGathers: 1, numExperts: buffer.numExperts }, 2) - (1 << 21);
        await withGroup({ ranks: 2, buffer: { ...buffer, bytes } }, async (g) => {
            await expect(g.openSession({ maxBytes, maxAllGathers: 1 })).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^maxBytes: /) });
        });
    });

    test('refuses bad sizes with EINVAL naming them', () => {
        expect(() => sessionSizeHint({ maxBytes: 0, maxAllGathers: 1 }, 2)).toThrow(/^maxBytes: must be a positive integer/);
        expect(() => sessionSizeHint({ maxBytes: 64, maxAllGathers: 1.5 }, 2)).toThrow(/^maxAllGathers: must be a positive integer/);
        expect(() => sessionSizeHint({ maxBytes: 64, maxAllGathers: 1 }, 0)).toThrow(/^worldSize: /);
    });
});
