/**
 * AGRS in rank programs with the data kept in the symmetric buffer (host backend): s.tensor() is a
 * view of the rank's mapped window (a peer's write shows through it, and it is the gathered region's
 * slot: zero copy), allGather / reduceScatter with { async: true } return { result, wait() } and any
 * number of them may be in flight (up to maxAllGathers), ordinary tensors still work; every result
 * equals a plain reference computed here, for W = 2..8. In-flight ops keep the rank in
 * session.gathering / reducing; close, a second wait and views after close are refused.
 */
import { describe, expect, test } from 'vitest';
import { createGroup, tensor, type RankflowError, type Tensor } from '../actors/index.js';
import { program, recordTransitions, withGroup } from './helpers/group.js';
import { prng } from './helpers/moe-reference.js';
import { randomTensor, referenceAllGather, referenceReduceScatter } from './helpers/agrs-reference.js';

const buffer = { maxTokensPerRank: 16, hidden: 128, topk: 2, numExperts: 840 };

interface Case { op: 'ag' | 'rs'; inPlace: boolean; async: boolean; inputs: Tensor[] }

const plain = (t: Tensor) => ({ dtype: t.dtype, shape: t.shape, data: t.data });

function reference(c: Case, r: number): Tensor {
    return c.op === 'ag' ? referenceAllGather(c.inputs) : referenceReduceScatter(c.inputs, r);
}

/** Runs `cases` in one session on every rank and checks each result against the reference. */
async function runCases(W: number, cases: Case[], order?: number[], maxBytes = 1 << 14): Promise<void> {
    await withGroup({ ranks: W, buffer: { ...buffer, bytes: 64 << 20 } }, async (g) => {
        const out = (await g.run(program('agrs-cases.mjs'), { cases, maxBytes, maxAllGathers: 2 * cases.length, order })) as Tensor[][];
        out.forEach((results, r) =>
            results.forEach((got, i) => expect(plain(got), `rank ${r}, case ${i} (${cases[i]!.op}${cases[i]!.inPlace ? ', in place' : ''}${cases[i]!.async ? ', async' : ''})`).toEqual(plain(reference(cases[i]!, r)))));
    });
}

function gathers(rng: () => number, W: number, dtype: 'fp32' | 'bf16' | 'int32', shape: number[], inPlace: boolean, async: boolean): Case {
    return { op: 'ag', inPlace, async, inputs: Array.from({ length: W }, () => randomTensor(rng, dtype, shape)) };
}
function reduces(rng: () => number, W: number, dtype: 'fp32' | 'bf16', shape: number[], inPlace: boolean, async: boolean): Case {
    return { op: 'rs', inPlace, async, inputs: Array.from({ length: W }, () => randomTensor(rng, dtype, shape)) };
}

describe('session tensors are the shared segment (zero copy)', () => {
    test("rank 0's view shows bytes rank 1 writes into its window, and its tensor is its slot of the gathered region", async () => {
        const n = 64, marker = 1000;
        await withGroup({ ranks: 3, buffer }, async (g) => {
            const flags = new SharedArrayBuffer(8);
            const f = new Int32Array(flags);
            const run = g.run(program('agrs-alias.mjs'), { flags, n, marker });
            const until = Date.now() + 20_000;
            while (Atomics.load(f, 0) === 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 5));
            const offset = Atomics.load(f, 0);
            expect(offset).toBeGreaterThan(0);
            // through rank 1's mapping of rank 0's window: no rankflow op involved
            await g.writePeer(1, 0, offset, new Uint8Array(Int32Array.from({ length: n }, (_, i) => marker + i).buffer));
            const res = (await run) as Array<{ out: number[]; aliased: boolean; detached: boolean }>;
            const want = [Array.from({ length: n }, (_, i) => marker + i), Array(n).fill(2), Array(n).fill(3)].flat();
            for (const [r, x] of res.entries()) {
                expect(x.out, `rank ${r}`).toEqual(want);
                expect(x.aliased, `rank ${r}: its tensor and the result's slot are one memory`).toBe(true);
                expect(x.detached, `rank ${r}: views are detached at close`).toBe(true);
            }
        });
    });
});

describe('in place and async collectives equal the reference', () => {
    test.each([2, 3, 4, 5, 8])('W = %i: allGather in place / copied, async / not; reduceScatter fp32 and bf16 likewise', async (W) => {
        const rng = prng(100 + W);
        await runCases(W, [
            gathers(rng, W, 'fp32', [3, 5], true, true),
            gathers(rng, W, 'bf16', [17], true, false),
            gathers(rng, W, 'int32', [2, 2, 3], false, true),
            reduces(rng, W, 'fp32', [W * 3, 4], true, true),
            reduces(rng, W, 'bf16', [W * 8], false, true),
            reduces(rng, W, 'fp32', [W * 5], true, false),
            gathers(rng, W, 'int32', [1], false, false),
        ]);
    });

    test('six collectives in flight at once, waited for in reverse order', async () => {
        const W = 4, rng = prng(7);
        const cases = [
            gathers(rng, W, 'fp32', [64], true, true), reduces(rng, W, 'fp32', [W * 16], true, true),
            gathers(rng, W, 'bf16', [8, 8], true, true), reduces(rng, W, 'bf16', [W * 32], false, true),
            gathers(rng, W, 'int32', [100], false, true), gathers(rng, W, 'fp32', [1], true, true),
        ];
        await runCases(W, cases, [5, 4, 3, 2, 1, 0]);
    });

    test('a tensor of maxBytes per rank, in place', async () => {
        const rng = prng(8);
        await runCases(2, [gathers(rng, 2, 'fp32', [1024], true, true), reduces(rng, 2, 'fp32', [2 * 512], true, true)], undefined, 4096);
    });
});

describe('states while in flight', () => {
    test('an async allGather holds every rank in session.gathering until wait(); then open, closing, ready', async () => {
        await withGroup({ ranks: 2, buffer }, async (g) => {
            const rec = recordTransitions(g);
            const flags = new SharedArrayBuffer(8);
            const f = new Int32Array(flags);
            const run = g.run(program('agrs-hold.mjs'), { flags });
            const until = Date.now() + 20_000;
            while (Atomics.load(f, 0) < 2 && Date.now() < until) await new Promise((r) => setTimeout(r, 5));
            await expect.poll(() => g.snapshot().map((s) => s.state)).toEqual(['session.gathering', 'session.gathering']);
            Atomics.store(f, 1, 1);
            expect(await run).toEqual([[0, 1], [0, 1]]);
            for (const r of [0, 1]) {
                expect(rec.paths(r)).toEqual(['session.opening', 'session.open', 'session.gathering', 'session.reducing', 'session.gathering', 'session.open', 'session.closing', 'ready']);
                const done = rec.records(r).find((t) => t.from === 'session.gathering' && t.to === 'session.open')!;
                expect(done.event).toBe('COMPLETED');
                expect(done.op).toBe('sessionAllGather');
            }
        });
    });
});

describe('refusals', () => {
    test('wait() twice, close() while in flight, more than maxAllGathers, a result used before its wait: STATE / EINVAL, nothing corrupted', async () => {
        await withGroup({ ranks: 2, buffer }, async (g) => {
            const res = (await g.run(program('agrs-refusals.mjs'), {})) as Array<Record<string, unknown>>;
            for (const [r, x] of res.entries()) {
                expect(x, `rank ${r}`).toMatchObject({
                    secondWait: { code: 'STATE', message: expect.stringMatching(/waited for already/) },
                    closeInFlight: { code: 'STATE', message: expect.stringMatching(/1 collective\(s\) of this session are in flight/) },
                    stateWhileRefused: 'session.gathering',
                    inputInFlight: { code: 'STATE', message: expect.stringMatching(/still writing: wait\(\) for it first/) },
                    tooMany: { code: 'EINVAL', message: expect.stringMatching(/maxAllGathers/) },
                    gathered: [1, 2, 11, 12],
                    viewAfterClose: { length: 0, code: 'STATE', message: expect.stringMatching(/closed|memory is gone/) },
                    tensorAfterClose: { code: 'STATE' },
                });
            }
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
        });
    });

    test('a session tensor larger than maxBytes is EINVAL naming it', async () => {
        await withGroup({ ranks: 2, buffer }, async (g) => {
            const err = (await g.run(program('agrs-too-big.mjs'), {}).catch((e: unknown) => e)) as RankflowError;
            expect(err.code).toBe('EINVAL');
            expect(err.message).toMatch(/maxBytes is 64/);
        });
    });

    test('a rank that returns without issuing its part: the waiting rank is released at once, the run rejects with STATE, the session is closed and the group ready', async () => {
        const g = await createGroup({ ranks: 2, backend: 'host', buffer });
        try {
            const err = (await g.run(program('agrs-lonely.mjs'), {}).catch((e: unknown) => e)) as RankflowError;
            expect(err).toMatchObject({ code: 'STATE', rank: 1 });
            expect(err.cause).toMatchObject({ code: 'ABORTED', message: expect.stringMatching(/rank 1's program returned after collective #\d+ \(rank 0 was released from/) });
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
            const s = await g.openSession({ maxBytes: 64, maxAllGathers: 1 });
            const inputs = [tensor('int32', [2], Int32Array.of(1, 2)), tensor('int32', [2], Int32Array.of(3, 4))];
            expect((await s.allGather(inputs))[1]!.data).toEqual(Int32Array.of(1, 2, 3, 4));
            await s.close();
        } finally {
            await g.destroy();
        }
    });
});

test('ordinary tensors in driver mode are unaffected: group sessions copy in and out as before', async () => {
    await withGroup({ ranks: 2, buffer }, async (g) => {
        const s = await g.openSession({ maxBytes: 64, maxAllGathers: 1 });
        const inputs = [tensor('int32', [2], Int32Array.of(1, 2)), tensor('int32', [2], Int32Array.of(3, 4))];
        expect((await s.allGather(inputs))[0]!.data).toEqual(Int32Array.of(1, 2, 3, 4));
        await s.close();
    });
});
