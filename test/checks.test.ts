/**
 * Calls the group refuses: each answer is a RankflowError with a code and the argument named, and
 * nothing changes (no transition, seq as before, every rank still ready, the next call exact).
 * Options that are not objects (barrier(42), openSession([])...), probes (info, readWindow,
 * writePeer) with ranks and offsets that are NaN, negative, fractional or out of range (for every
 * memory kind: offsets stop at the symmetric segment), calls after destroy, engram calls out of turn.
 */
import { describe, expect, test } from 'vitest';
import { createGroup, tensor, type Group, type RankflowError } from '../actors/index.js';
import { program, recordTransitions, withGroup } from './helpers/group.js';

const buffer = { maxTokensPerRank: 4, hidden: 128, topk: 2, numExperts: 8 };

async function refused(p: Promise<unknown>): Promise<RankflowError> {
    const e = await p.then(() => new Error('resolved'), (err: unknown) => err);
    expect(e).toMatchObject({ name: 'RankflowError' });
    return e as RankflowError;
}

/** Runs `fn`, which must be refused, and checks that nothing moved and the next barrier is exact. */
async function unchanged(g: Group, fn: () => Promise<RankflowError>): Promise<RankflowError> {
    const before = g.snapshot();
    const rec = recordTransitions(g);
    const e = await fn();
    expect(rec.events).toEqual([]);
    expect(g.snapshot()).toEqual(before);
    expect(before.every((s) => s.state === 'ready')).toBe(true);
    await g.barrier();
    expect(g.snapshot().map((s) => s.seq)).toEqual(before.map((s) => s.seq + 1));
    return e;
}

describe('options that are not objects', () => {
    test.each([['42', 42], ["'x'", 'x'], ['true', true], ['[]', []], ['null', null], ['0n', 0n]])('barrier(%s) is EINVAL naming options; nothing moves', async (_, opts) => {
        await withGroup({ ranks: 2, buffer }, async (g) => {
            const e = await unchanged(g, () => refused(g.barrier(opts as never)));
            expect(e).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^options: must be an object \{ withCpuSync\? \}/) });
        });
    });

    test('barrier(), barrier(undefined), barrier({}) and barrier({ withCpuSync: true }) are barriers; withCpuSync must be a boolean', async () => {
        await withGroup({ ranks: 2, buffer }, async (g) => {
            await g.barrier();
            await g.barrier(undefined);
            await g.barrier({});
            await g.barrier({ withCpuSync: true });
            expect(g.snapshot().map((s) => s.seq)).toEqual([4, 4]);
            const e = await unchanged(g, () => refused(g.barrier({ withCpuSync: 1 as never })));
            expect(e.message).toMatch(/^withCpuSync: must be a boolean/);
        });
    });

    test('openSession and createGroup refuse options that are not objects; run a moduleUrl that is not one', async () => {
        await withGroup({ ranks: 2, buffer }, async (g) => {
            for (const opts of [42, 'x', [], null]) {
                expect((await unchanged(g, () => refused(g.openSession(opts as never)))).message).toMatch(/^options: must be an object \{ maxBytes, maxAllGathers \}/);
            }
            expect((await unchanged(g, () => refused(g.run(42 as never)))).message).toMatch(/^moduleUrl: must be a URL or an absolute path/);
        });
        for (const timeouts of [[], 5, null]) {
            await expect(createGroup({ backend: 'host', ranks: 2, buffer, timeouts: timeouts as never })).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^timeouts: must be an object/) });
        }
        await expect(createGroup([] as never)).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^options: /) });
        await expect(createGroup({ backend: 'host', ranks: 2, buffer: [] as never })).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^buffer: /) });
    });
});

describe('probes: info, readWindow, writePeer', () => {
    test.each([['99', 99], ['2', 2], ['-1', -1], ['1.5', 1.5], ['NaN', NaN], ["'0'", '0'], ['undefined', undefined]])('info(%s) is EINVAL naming rank', async (_, r) => {
        await withGroup({ ranks: 2, buffer }, async (g) => {
            const e = await unchanged(g, () => refused(g.info(r as never)));
            expect(e).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^rank: must be an integer in \[0, 1\]/) });
        });
    });

    test('after destroy every probe is STATE, not a crash or RANK_FAILED', async () => {
        const g = await createGroup({ backend: 'host', ranks: 2, buffer });
        await g.destroy();
        for (const p of [g.info(0), g.info(1), g.readWindow(0, 0, 4), g.writePeer(0, 1, 0, new Uint8Array(4))]) {
            expect(await refused(p)).toMatchObject({ code: 'STATE', message: 'the group is destroyed' });
        }
        expect(await refused(g.barrier())).toMatchObject({ code: 'STATE' });
    });

    test.each([
        ['GPU-only (cpuBytes 0)', {}, 'gpu'],
        ['hybrid (cpuBytes)', { cpuBytes: 1 << 20 }, 'hybrid'],
        ['elastic (cpuBytes, hybrid: false)', { cpuBytes: 1 << 20, hybrid: false }, 'elastic'],
    ])('%s: offsets run to the end of the symmetric segment and no further', async (_, extra, kind) => {
        await withGroup({ ranks: 2, buffer: { ...buffer, ...extra } }, async (g) => {
            const info = await g.info(0);
            expect(info.memoryKind).toBe(kind);
            const sym = info.symmetricBytes;
            // A host segment sits right after the symmetric one in the window: an offset past sym would reach it.
            if (kind !== 'gpu') expect(info.stride).toBeGreaterThan(sym);
            const last = Uint8Array.of(1, 2, 3, 4);
            await g.writePeer(0, 1, sym - 4, last);
            expect(Array.from(await g.readWindow(1, sym - 4, 4))).toEqual([1, 2, 3, 4]);
            expect((await g.readWindow(1, sym, 0)).length).toBe(0);
            const bad: Array<[() => Promise<unknown>, RegExp]> = [
                [() => g.readWindow(0, NaN, 4), /^offset: must be an integer in \[0, \d+\] \(got NaN\)/],
                [() => g.readWindow(0, -1, 4), /^offset: /],
                [() => g.readWindow(0, 1.5, 4), /^offset: /],
                [() => g.readWindow(0, sym + 1, 0), /^offset: /],
                [() => g.readWindow(0, sym - 3, 4), /^length: must be an integer in \[0, 3\]/],
                [() => g.readWindow(0, 0, -1), /^length: /],
                [() => g.readWindow(0, 0, Infinity), /^length: /],
                [() => g.readWindow(2, 0, 4), /^rank: /],
                [() => g.readWindow(-1, 0, 4), /^rank: /],
                [() => g.writePeer(0, 1, NaN, last), /^offset: /],
                [() => g.writePeer(0, 1, -4, last), /^offset: /],
                [() => g.writePeer(0, 1, 0.5, last), /^offset: /],
                [() => g.writePeer(0, 1, sym - 3, last), /^offset: must be an integer in \[0, \d+\] \(got \d+\)/],
                [() => g.writePeer(0, 1, sym, last), /^offset: /],
                ...(kind === 'gpu' ? [] : [[() => g.writePeer(0, 1, info.stride - 4, last), /^offset: /] as [() => Promise<unknown>, RegExp]]),
                [() => g.writePeer(0, 2, 0, last), /^to: /],
                [() => g.writePeer(0, 1.5, 0, last), /^to: /],
                [() => g.writePeer(2, 1, 0, last), /^from: /],
                [() => g.writePeer(0, 1, 0, [1, 2] as never), /^bytes: must be a Uint8Array/],
                [() => g.writePeer(0, 1, 0, new Uint8Array(sym + 1)), /^(offset|bytes): /],
            ];
            for (const [call, message] of bad) {
                const e = await unchanged(g, () => refused(call()));
                expect(e).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(message) });
            }
            // nothing was written by the refused calls: the last bytes are still the ones written first
            expect(Array.from(await g.readWindow(1, sym - 4, 4))).toEqual([1, 2, 3, 4]);
        });
    });
});

describe('engram out of turn', () => {
    const withHost = { ...buffer, cpuBytes: 1 << 20 };

    test('engramFetch while an AGRS session is open is STATE naming the session (written table or not); nothing moves', async () => {
        await withGroup({ ranks: 2, buffer: withHost }, async (g) => {
            const ids = [Int32Array.of(0), Int32Array.of(1)];
            let s = await g.openSession({ maxBytes: 64, maxAllGathers: 1 });
            const rec = recordTransitions(g);
            const before = g.snapshot();
            let e = await refused(g.engramFetch(ids));
            expect(e).toMatchObject({ code: 'STATE', message: expect.stringMatching(/^an AGRS session is open: close\(\) it first/) });
            expect(e.message).not.toMatch(/before engramWrite/);
            expect(rec.events).toEqual([]);
            expect(g.snapshot()).toEqual(before);
            await s.close();
            const tables = [0, 1].map((r) => tensor('fp32', [2, 8], Float32Array.from({ length: 16 }, (_, i) => r * 100 + i)));
            await g.engramWrite(tables);
            s = await g.openSession({ maxBytes: 64, maxAllGathers: 1 });
            e = await refused(g.engramFetch(ids));
            expect(e.message).toMatch(/^an AGRS session is open/);
            await s.close();
            const got = await g.engramFetch([Int32Array.of(3, 0), Int32Array.of(1)]);
            expect(Array.from(got[0]!.data)).toEqual([...tables[1]!.data.subarray(8, 16), ...tables[0]!.data.subarray(0, 8)]);
            expect(Array.from(got[1]!.data)).toEqual(Array.from(tables[0]!.data.subarray(8, 16)));
        });
    });

    test('engramFetch before any engramWrite is STATE in driver mode and in rank programs, and the ranks stay ready', async () => {
        await withGroup({ ranks: 2, buffer: withHost }, async (g) => {
            const e = await unchanged(g, () => refused(g.engramFetch([Int32Array.of(0), Int32Array.of(0)])));
            expect(e).toMatchObject({ code: 'STATE', message: 'engramFetch before engramWrite: no table is stored' });
            const before = g.snapshot();
            const answers = await g.run<{ code?: string; message?: string }>(program('engram-unless.mjs'), { call: 'fetchFirst' });
            for (const a of answers) expect(a).toMatchObject({ code: 'STATE', message: 'engramFetch before engramWrite: no table is stored' });
            expect(g.snapshot()).toEqual(before);
        });
    });

    test('a table a rank program wrote is fetched in driver mode', async () => {
        await withGroup({ ranks: 2, buffer: withHost }, async (g) => {
            expect(await g.run(program('engram-unless.mjs'), { call: 'write', entries: 4, hidden: 8 })).toEqual([{ ok: true }, { ok: true }]);
            const got = await g.engramFetch([Int32Array.of(5), Int32Array.of(0, 7)]);
            // entry 5: rank 1, row 1; entry 7: rank 1, row 3; values rank * 1000 + element index
            expect(Array.from(got[0]!.data)).toEqual(Array.from({ length: 8 }, (_, i) => 1000 + 8 + i));
            expect(Array.from(got[1]!.data)).toEqual([...Array.from({ length: 8 }, (_, i) => i), ...Array.from({ length: 8 }, (_, i) => 1000 + 24 + i)]);
            await expect(g.engramFetch([Int32Array.of(8), Int32Array.of(0)])).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^indices\[0\]\[0\]: 8 is outside \[0, 8\)/) });
        });
    });

    test('engramWrite of rows with no element is EINVAL naming the shape, before any rank moves', async () => {
        await withGroup({ ranks: 2, buffer: withHost }, async (g) => {
            const empty = [0, 1].map(() => tensor('fp32', [4, 0]));
            expect((await unchanged(g, () => refused(g.engramWrite(empty)))).message).toMatch(/^storages\[0\]\.shape\[1\]: must be positive/);
        });
    });
});

describe('an op the native side refuses in a rank program', () => {
    test('gives its sequence number back: seq as before on every rank, the next collective the same number everywhere', async () => {
        await withGroup({ ranks: 2, buffer }, async (g) => {
            await g.barrier();
            const before = g.snapshot().map((s) => s.seq);
            const answers = await g.run<{ code?: string; message?: string }>(program('engram-unless.mjs'), { call: 'ppTooBig' });
            for (const a of answers) expect(a.code).toBe('EINVAL');
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
            expect(g.snapshot().map((s) => s.seq)).toEqual(before);
            const out = await g.dispatch([0, 1].map(() => ({ x: tensor('bf16', [1, 128]), topkIdx: Int32Array.of(0, 5), topkWeights: Float32Array.of(1, 1) })));
            expect(out.map((o) => o.handle.seq)).toEqual([before[0]! + 1, before[0]! + 1]);
        });
    });
});
