/**
 * Elastic groups (API.md "Elastic groups"), host backend, the ranks of one process. The failure
 * paths run in a child process (test/fixtures/elastic-child.mjs: a native abort or a hang fails the
 * test, not the runner) at W = 4 and 8: dispatch/combine of the survivors equal bit for bit a healthy
 * group's on the masked inputs (the dead rank's experts -1, the dead rank sending nothing), and after
 * replaceRank a healthy group's on the unmasked ones; the other ops among the live ranks; a worker
 * that exits; an op in flight at the kill; a replacement killed while it joins; a rank whose peers' waits time out on it
 * (it leaves, not they); a survivor killed while a replacement joins; a kill with an AGRS session open; and kills at random points of a 1000-op loop. In process:
 * the machine's states (masking, remasking, rejoining) as transitions and in the trace export, the
 * refusals of the option and of replaceRank.
 */
import { describe, expect, test } from 'vitest';

import { createGroup, TimelineRecorder, toChromeTrace } from '../actors/index.js';
import { percentile, runCaseChild } from './helpers/children.js';
import { recordTransitions } from './helpers/group.js';

interface Rep { rep: number; ok: boolean; error?: string; left?: number | number[]; firstOp?: number | number[]; replace?: number; succeeded?: number; rejected?: number; kills?: number }

const runCase = (name: string, W: number, reps: number) => runCaseChild<Rep>('elastic-child.mjs', name, W, reps);
const flat = (reps: Rep[], k: 'left' | 'firstOp'): number[] => reps.flatMap((r) => (r[k] === undefined ? [] : ([] as number[]).concat(r[k]!)));

async function expectCase(name: string, W: number, reps: number): Promise<Rep[]> {
    const r = await runCase(name, W, reps);
    expect(r.signal, r.stderr).toBe(null);
    expect(r.exit, r.stderr).toBe(0);
    expect(r.ended, `the child ended early: ${r.stderr}`).toBe(true);
    expect(r.reps.filter((x) => !x.ok).map((x) => x.error)).toEqual([]);
    expect(r.reps).toHaveLength(reps);
    return r.reps;
}

const CASES = [
    'dispatch and combine mask a dead rank, then a replacement serves', 'two ranks leave and come back', 'the other ops among the live ranks',
    'a worker that exits leaves', 'an op in flight when a rank dies', 'a replacement that dies while joining',
    'a rank that does not answer in time leaves', 'a survivor that dies while a replacement joins', 'a session open when a rank dies',
];

describe.each(CASES)('%s', (name) => {
    test.each([4, 8])('W = %i, 3 times, in a child process', async (W) => {
        const reps = await expectCase(name, W, 3);
        const left = flat(reps, 'left'), first = flat(reps, 'firstOp');
        // API.md: rankLeft within 100 ms of the failure (host); the survivors serve again as soon.
        for (const ms of left) expect(ms).toBeLessThan(100);
        for (const ms of first) expect(ms).toBeLessThan(1000);
        if (left.length > 0) console.log(`${name}, W = ${W}: kill -> rankLeft p50 ${percentile(left, 50).toFixed(1)} ms` +
            (first.length > 0 ? `; kill -> first survivor op p50 ${percentile(first, 50).toFixed(1)} ms` : ''));
    }, 180_000);
});

describe('kills at random points of a 1000-op loop', () => {
    test.each([4, 8])('W = %i: never a wrong result, never a hang', async (W) => {
        const [r] = await expectCase('kill loop', W, 1);
        expect(r!.kills).toBeGreaterThan(3);
        expect(r!.succeeded! + r!.rejected!).toBe(1000);
        // An op is rejected only when a kill lands in it (or between a dispatch and its combine).
        expect(r!.rejected!).toBeLessThanOrEqual(2 * r!.kills!);
        const left = flat([r!], 'left'), first = flat([r!], 'firstOp');
        for (const ms of left) expect(ms).toBeLessThan(100);
        console.log(`kill loop, W = ${W}: ${r!.kills} kills, ${r!.rejected} ops rejected, ${r!.succeeded} checked; kill -> rankLeft p99 ${percentile(left, 99).toFixed(1)} ms, kill -> first survivor op p99 ${percentile(first, 99).toFixed(1)} ms`);
    }, 300_000);
});

const buffer = { maxTokensPerRank: 4, hidden: 64, topk: 2, numExperts: 8, cpuBytes: 2 << 20 };

describe('in process', () => {
    test('the ranks pass through masking and remasking when a peer leaves, and rejoining when it is replaced; the trace shows them', async () => {
        const recorder = new TimelineRecorder();
        const g = await createGroup({ backend: 'host', ranks: 4, buffer, elastic: true, observers: [recorder] });
        try {
            const t = recordTransitions(g);
            expect(g.state).toBe('ready');
            expect(g.liveRanks).toEqual([0, 1, 2, 3]);
            await g.ranks[1]!.terminate();
            expect(g.state).toBe('degraded');
            expect(g.liveRanks).toEqual([0, 2, 3]);
            await g.barrier();
            await g.replaceRank(1);
            await g.barrier();
            expect(g.state).toBe('ready');
            for (const r of [0, 2, 3]) {
                const path = t.paths(r);
                expect(path.slice(0, 3)).toEqual(['masking', 'remasking', 'ready']);
                expect(path).toContain('rejoining');
                expect(t.records(r).find((x) => x.to === 'masking')!.error).toMatchObject({ code: 'RANK_FAILED', rank: 1 });
            }
            // The replacement registers as a fresh rank does, then serves.
            expect(t.paths(1)).toEqual(expect.arrayContaining(['registerWindow', 'ready', 'barrier']));
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready', 'ready', 'ready']);
            const names = new Set(toChromeTrace(recorder.recording()).traceEvents.map((e) => (e as { name: string }).name));
            for (const s of ['masking', 'remasking', 'rejoining']) expect(names).toContain(s);
        } finally {
            await g.destroy();
        }
    });

    test("the inspector's /snapshot says the group is degraded, and which ranks serve", async () => {
        const g = await createGroup({ backend: 'host', ranks: 4, buffer, elastic: true, inspect: 'http://127.0.0.1:0' });
        try {
            const snapshot = async () => (await (await fetch(new URL('snapshot', g.inspectorUrl))).json()) as { state: string; liveRanks: number[] };
            expect(await snapshot()).toMatchObject({ state: 'ready', liveRanks: [0, 1, 2, 3] });
            await g.ranks[2]!.terminate();
            expect(await snapshot()).toMatchObject({ state: 'degraded', liveRanks: [0, 1, 3] });
            await g.replaceRank(2);
            expect(await snapshot()).toMatchObject({ state: 'ready', liveRanks: [0, 1, 2, 3] });
        } finally {
            await g.destroy();
        }
    });

    test('a group that is not elastic fails fast, as before: no rankLeft, every rank failed', async () => {
        const g = await createGroup({ backend: 'host', ranks: 2, buffer });
        try {
            let left = 0;
            g.on('rankLeft', () => left++);
            await g.ranks[1]!.terminate();
            await expect(g.barrier()).rejects.toMatchObject({ code: 'RANK_FAILED', rank: 1 });
            expect(left).toBe(0);
            expect(g.state).toBe('failed');
            await expect(g.replaceRank(1)).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/not elastic/) });
        } finally {
            await g.destroy();
        }
    });

    test('replaceRank refuses a rank that serves, or one outside the group, and changes nothing', async () => {
        const g = await createGroup({ backend: 'host', ranks: 2, buffer, elastic: true });
        try {
            await expect(g.replaceRank(0)).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^rank: 0 serves/) });
            await expect(g.replaceRank(5)).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^rank/) });
            expect(g.state).toBe('ready');
            await g.barrier();
        } finally {
            await g.destroy();
        }
    });

    test.each([
        [{ elastic: 'yes' }, /^elastic: must be a boolean/],
        [{ elastic: true, ranks: 4, ranksPerNode: 2 }, /^elastic: is supported within one node only/],
    ])('the option is refused where it is not implemented: %j', async (extra, message) => {
        await expect(createGroup({ backend: 'host', ranks: 2, buffer, ...extra } as never)).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(message) });
    });

    test('on cuda the option is taken: a machine without a GPU refuses the backend, not elastic', async () => {
        const made = await createGroup({ backend: 'cuda', ranks: 2, buffer, elastic: true }).then((g) => g.destroy(), (e: unknown) => e);
        if (made !== undefined) expect((made as Error).message).not.toMatch(/^elastic/);
    });
});
