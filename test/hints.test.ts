/**
 * The size hints take what createGroup takes and refuse what it refuses, with EINVAL naming the
 * argument, never a crash or NaN; sessionSizeHint gives the buffer.bytes that openSession needs,
 * and openSession's refusal names that figure.
 */
import { describe, expect, test } from 'vitest';
import { bytesOf, createGroup, engramSizeHint, ppSizeHint, sessionSizeHint, sizeHint, tensor, type RankflowError } from '../actors/index.js';
import { withGroup } from './helpers/group.js';
import { prng } from './helpers/moe-reference.js';
import { randomTensor, referenceAllGather } from './helpers/agrs-reference.js';

const MiB = 1 << 20;
const ep = { maxTokensPerRank: 4, hidden: 128, topk: 2, numExperts: 8 };

function einval(f: () => unknown): RankflowError {
    let thrown: unknown;
    try {
        const v = f();
        thrown = new Error(`returned ${String(v)}`);
    } catch (e) {
        thrown = e;
    }
    expect(thrown).toMatchObject({ name: 'RankflowError', code: 'EINVAL' });
    return thrown as RankflowError;
}

describe('world sizes', () => {
    const bad: unknown[] = [0, 65, 2 ** 32, 2 ** 32 + 4, -1, 1.5, NaN, Infinity, '2', null];
    test.each(bad.map((w) => [String(w), w]))('worldSize %s is EINVAL naming worldSize in every hint', (_, w) => {
        for (const f of [
            () => ppSizeHint({ maxBytes: 1024 }, w as number),
            () => sizeHint(ep, w as number),
            () => sessionSizeHint({ maxBytes: 1024, maxAllGathers: 1 }, w as number),
        ]) expect(einval(f).message).toMatch(/^worldSize: must be an integer in \[1, 64\]/);
    });

    test('1 and 64 are world sizes', () => {
        expect(ppSizeHint({ maxBytes: 1024 }, 64) % (2 * MiB)).toBe(0);
        expect(sizeHint({ ...ep, numExperts: 64 }, 64) % (2 * MiB)).toBe(0);
        expect(sessionSizeHint({ maxBytes: 1024, maxAllGathers: 1 }, 1)).toBe(2 * MiB + 2 * MiB);
    });
});

describe('sizeHint refuses the configs createGroup refuses, naming the same field', () => {
    const cases: Array<[string, Record<string, unknown>, number]> = [
        ['maxTokensPerRank', { maxTokensPerRank: 2 ** 40 }, 2],
        ['maxTokensPerRank', { maxTokensPerRank: 2 ** 31 }, 2],  // the native layout would take it
        ['maxTokensPerRank', { maxTokensPerRank: 0 }, 2],
        ['hidden', { hidden: 12 }, 2],                          // not a multiple of 8
        ['hidden', { hidden: 2 ** 30 }, 2],
        ['hidden', { hidden: 136, fp8Dispatch: true }, 2],      // fp8 needs a multiple of 128
        ['topk', { topk: 17 }, 2],
        ['topk', { topk: 8, numExperts: 4 }, 2],                // more than numExperts
        ['numExperts', { numExperts: 7 }, 2],                   // not divisible by the world size
        ['numExperts', { numExperts: 2 ** 17 }, 2],
        ['fp8Dispatch', { fp8Dispatch: 'yes' }, 2],
        ['hybrid', { hybrid: 1 }, 2],
    ];
    test.each(cases)('%s: %j', async (field, change, W) => {
        const cfg = { ...ep, ...change };
        expect(einval(() => sizeHint(cfg as never, W)).message).toMatch(new RegExp(`^${field}: `));
        const err = (await createGroup({ backend: 'host', ranks: W, buffer: cfg as never }).catch((e: unknown) => e)) as RankflowError;
        expect(err).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(new RegExp(`^buffer\\.${field}: `)) });
    });

    test('not an object is EINVAL naming config', () => {
        for (const c of [null, 3, 'x', []]) expect(einval(() => sizeHint(c as never, 2)).message).toMatch(/^config: /);
    });
});

describe('engramSizeHint and ppSizeHint', () => {
    test('an unknown dtype is EINVAL naming dtype, not NaN', () => {
        for (const dtype of ['fp64', 'constructor', 'toString', 7]) {
            expect(einval(() => engramSizeHint({ entriesPerRank: 4, hidden: 8, dtype: dtype as never })).message).toMatch(/^dtype: must be one of bf16, fp32, fp8e4m3, int32/);
        }
        expect(engramSizeHint({ entriesPerRank: 4, hidden: 8, dtype: 'int32' })).toBe(2 * MiB);
    });

    test('a table or an exchange no rank can map is EINVAL, not a number', () => {
        expect(einval(() => engramSizeHint({ entriesPerRank: 2 ** 40, hidden: 2 ** 20 })).message).toMatch(/^entriesPerRank: needs \d+ bytes per rank, more than the 1125899906842624/);
        expect(einval(() => ppSizeHint({ maxBytes: 2 ** 51 }, 2)).message).toMatch(/^maxBytes: /);
        expect(einval(() => ppSizeHint({ maxBytes: 1.5 }, 2)).message).toMatch(/^maxBytes: /);
        expect(einval(() => ppSizeHint({ maxBytes: 1024, numExperts: 2 ** 17 }, 2)).message).toMatch(/^numExperts: /);
        expect(einval(() => ppSizeHint(null as never, 2)).message).toMatch(/^exchange: /);
        expect(einval(() => engramSizeHint([] as never)).message).toMatch(/^table: /);
    });
});

describe('sessionSizeHint', () => {
    test('bad arguments are EINVAL naming them', () => {
        expect(einval(() => sessionSizeHint({ maxBytes: 0, maxAllGathers: 1 }, 2)).message).toMatch(/^maxBytes: /);
        expect(einval(() => sessionSizeHint({ maxBytes: 64, maxAllGathers: 2 ** 17 }, 2)).message).toMatch(/^maxAllGathers: /);
        expect(einval(() => sessionSizeHint({ maxBytes: 2 ** 49, maxAllGathers: 64 }, 64)).message).toMatch(/^maxBytes: needs/);
        expect(einval(() => sessionSizeHint({ maxBytes: 64, maxAllGathers: 1, numExperts: 3 }, 2)).message).toMatch(/^numExperts: /);
        expect(einval(() => sessionSizeHint('x' as never, 2)).message).toMatch(/^session: /);
    });

    test('the workspace plus maxAllGathers regions of maxBytes from every rank (256-byte aligned), rounded up to 2 MiB', () => {
        // 2 MiB of workspace for these worlds; each region W * maxBytes rounded up to 256
        expect(sessionSizeHint({ maxBytes: MiB, maxAllGathers: 3 }, 2)).toBe(2 * MiB + 6 * MiB);
        expect(sessionSizeHint({ maxBytes: MiB + 1, maxAllGathers: 3 }, 2)).toBe(2 * MiB + 8 * MiB);
        expect(sessionSizeHint({ maxBytes: 100, maxAllGathers: 1 }, 3)).toBe(4 * MiB);
    });

    test("openSession's refusal names the buffer.bytes to set; a group made with it runs maxAllGathers allGathers of maxBytes, exact", async () => {
        const W = 2, maxBytes = MiB, maxAllGathers = 3;
        const bytes = sessionSizeHint({ maxBytes, maxAllGathers, numExperts: ep.numExperts }, W);
        expect(bytes).toBe(8 * MiB);
        await withGroup({ ranks: W, buffer: ep }, async (g) => {
            expect((await g.info(0)).symmetricBytes).toBeLessThan(bytes);  // sizeHint(ep) is smaller
            const err = (await g.openSession({ maxBytes, maxAllGathers }).catch((e: unknown) => e)) as RankflowError;
            expect(err).toMatchObject({ code: 'EINVAL' });
            expect(err.message).toMatch(new RegExp(`^maxBytes: .*exceeds the buffer .*buffer\\.bytes of at least ${bytes} \\(sessionSizeHint\\(\\{ maxBytes: ${maxBytes}, maxAllGathers: ${maxAllGathers}, numExperts: 8 \\}, 2\\)\\)`));
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
        });
        await withGroup({ ranks: W, buffer: { ...ep, bytes } }, async (g) => {
            const rng = prng(3);
            const s = await g.openSession({ maxBytes, maxAllGathers });
            for (let i = 0; i < maxAllGathers; i++) {
                const parts = [0, 1].map(() => randomTensor(rng, 'fp32', [maxBytes / 4]));
                const want = referenceAllGather(parts);
                for (const got of await s.allGather(parts)) {
                    expect(got.shape).toEqual(want.shape);
                    expect(Buffer.from(bytesOf(got)).equals(bytesOf(want))).toBe(true);  // byte for byte (toEqual on 2^18 floats is slow)
                }
            }
            await s.close();
        });
        // 2 MiB less is one region short: refused
        await withGroup({ ranks: W, buffer: { ...ep, bytes: bytes - 2 * MiB } }, async (g) => {
            await expect(g.openSession({ maxBytes, maxAllGathers })).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^maxBytes: /) });
            await expect(g.openSession({ maxBytes, maxAllGathers: maxAllGathers - 1 })).resolves.toBeDefined();
        });
    });
});

describe('tensors', () => {
    test("a dtype that is an inherited key ('constructor') is EINVAL, not accepted", async () => {
        await withGroup({ ranks: 2, buffer: ep }, async (g) => {
            const t = { dtype: 'constructor', shape: [2], data: new Float32Array(2) };
            await expect(g.allGather([t, t] as never)).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^tensors\[0\]\.dtype: must be one of/) });
            const ok = [0, 1].map((r) => tensor('int32', [1], Int32Array.of(r)));
            expect((await g.allGather(ok))[0]!.data).toEqual(Int32Array.of(0, 1));
        });
    });
});
