/**
 * Asynchronous engram fetches in rank programs (host backend): rank.engramFetch(ids, { async: true })
 * starts the fetch (on the rank's fetch thread) and returns { wait() }; other ops run until then, two
 * (up to 16) fetches may be in flight, and each returns exactly the rows of the plain reference. The
 * rank shows engram.fetching while fetches are in flight, between the other ops it runs; what would
 * reuse or replace what a fetch reads (openSession, engramWrite) is refused until its wait.
 */
import { describe, expect, test } from 'vitest';
import { createGroup, engramSizeHint, tensor, toBf16, type Tensor } from '../actors/index.js';
import { program, recordTransitions, withGroup } from './helpers/group.js';
import { prng, randInt } from './helpers/moe-reference.js';

const base = { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 24 };

function referenceFetch(tables: Tensor[], ids: Int32Array): Tensor {
    const [entries, hidden] = tables[0]!.shape as [number, number];
    const out = new (tables[0]!.data.constructor as new (n: number) => Tensor['data'])(ids.length * hidden);
    ids.forEach((g, i) => out.set(tables[Math.floor(g / entries)]!.data.subarray((g % entries) * hidden, (g % entries + 1) * hidden) as never, i * hidden));
    return tensor(tables[0]!.dtype, [ids.length, hidden], out as never);
}

const plain = (t: Tensor) => ({ dtype: t.dtype, shape: t.shape, data: t.data });

describe('async engram fetches', () => {
    test.each([2, 3, 4, 8])('W = %i: two fetches in flight across a barrier and an allGather equal the reference; states and refusals', async (W) => {
        const rng = prng(300 + W);
        const entries = 40, hidden = 64;
        const tables = Array.from({ length: W }, () => tensor('bf16', [entries, hidden], toBf16(Array.from({ length: entries * hidden }, () => randInt(rng, 1 << 12) / 16 - 100))));
        const ids = Array.from({ length: W }, () => [0, 1].map((k) => Int32Array.from({ length: 25 + 10 * k }, () => randInt(rng, W * entries))));
        await withGroup({ ranks: W, buffer: { ...base, cpuBytes: engramSizeHint({ entriesPerRank: entries, hidden }) } }, async (g) => {
            const rec = recordTransitions(g);
            const res = (await g.run(program('engram-async.mjs'), { tables, ids })) as Array<Record<string, unknown> & { a: Tensor; b: Tensor; last: Tensor }>;
            for (const [r, x] of res.entries()) {
                expect(plain(x.a), `rank ${r} fetch a`).toEqual(plain(referenceFetch(tables, ids[r]![0]!)));
                expect(plain(x.b), `rank ${r} fetch b`).toEqual(plain(referenceFetch(tables, ids[r]![1]!)));
                expect(plain(x.last), `rank ${r}: the 16th fetch in flight`).toEqual(plain(referenceFetch(tables, ids[r]![1]!)));
                expect(x).toMatchObject({
                    during: 'engram.fetching', between: 'engram.fetching', stillOne: 'engram.fetching', after: 'ready', end: 'ready',
                    gathered: Array.from({ length: W }, (_, q) => q),
                    refused: {
                        openSession: { code: 'STATE', message: expect.stringMatching(/^openSession: 1 engram fetch\(es\) are in flight/) },
                        engramWrite: { code: 'STATE', message: expect.stringMatching(/^engramWrite: 1 engram fetch\(es\) are in flight/) },
                        secondWait: { code: 'STATE', message: expect.stringMatching(/waited for already/) },
                    },
                    tooMany: { code: 'STATE', message: expect.stringMatching(/16 fetches are in flight already/), issued: 16 },
                });
                expect(rec.paths(r).slice(0, 10)).toEqual([
                    'engram.writing', 'ready', 'engram.fetching', 'barrier', 'engram.fetching', 'allGathering', 'engram.fetching', 'ready', 'engram.fetching', 'ready',
                ]);
            }
            expect(g.snapshot().map((s) => s.state)).toEqual(Array(W).fill('ready'));
        });
    });

    test('fetches a program leaves in flight are waited for when the run ends: the ranks are ready, the next fetch is exact', async () => {
        const entries = 4096, hidden = 256;
        await withGroup({ ranks: 2, buffer: { ...base, cpuBytes: engramSizeHint({ entriesPerRank: entries, hidden }) } }, async (g) => {
            const tables = [0, 1].map((r) => tensor('bf16', [entries, hidden], new Uint16Array(entries * hidden).fill(r + 1)));
            await g.run(program('engram-leave.mjs'), { tables, n: 8192 });
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
            const rows = await g.engramFetch([Int32Array.of(0, entries), Int32Array.of(entries + 1, 1)]);
            expect(rows[0]!.data.subarray(0, hidden).every((v) => v === 1) && rows[0]!.data.subarray(hidden).every((v) => v === 2)).toBe(true);
            expect(rows[1]!.data.subarray(0, hidden).every((v) => v === 2) && rows[1]!.data.subarray(hidden).every((v) => v === 1)).toBe(true);
        });
    });

    test('a group destroyed while a program has fetches in flight tears down cleanly (the fetch thread is joined first)', async () => {
        const entries = 4096, hidden = 256;
        const g = await createGroup({ backend: 'host', ranks: 2, buffer: { ...base, cpuBytes: engramSizeHint({ entriesPerRank: entries, hidden }) } });
        const tables = [0, 1].map((r) => tensor('bf16', [entries, hidden], new Uint16Array(entries * hidden).fill(r + 1)));
        const run = g.run(program('engram-leave.mjs'), { tables, n: 8192, hold: true }).then(() => null, (e: unknown) => e);
        await expect.poll(() => g.snapshot().map((s) => s.state)).toEqual(['engram.fetching', 'engram.fetching']);
        await g.destroy();
        expect(await run).toMatchObject({ code: 'ABORTED' });
        expect(g.snapshot().map((s) => s.state)).toEqual(['destroyed', 'destroyed']);
    });
});
