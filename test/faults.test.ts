/**
 * Faults (API.md): a rank that crashes, or a peer that never arrives. Pending and later collectives
 * reject on every surviving rank with RANK_FAILED (or a timeout code) naming the rank, the group
 * says so through 'failed' events and snapshot(), and destroy() still completes, leaving no worker,
 * fd or mapping behind.
 */
import { afterEach, beforeAll, describe, expect, test } from 'vitest';

import { createGroup, RankflowError, tensor, type Group } from '../actors/index.js';
import { resources, settledResources, type Resources, expectReleased } from './fixtures/resources.js';

const buffer = { maxTokensPerRank: 8, hidden: 64, topk: 2, numExperts: 8 };
const LATE_BARRIER = new URL('./fixtures/programs/late-barrier.mjs', import.meta.url);
const CPU_SYNC_BARRIER = new URL('./fixtures/programs/cpu-sync-barrier.mjs', import.meta.url);

/** Collects the group's 'failed' events, in order. */
function failures(group: Group): Array<{ rank: number; error: RankflowError }> {
    const seen: Array<{ rank: number; error: RankflowError }> = [];
    group.on('failed', (f) => seen.push(f));
    return seen;
}

async function rejection(p: Promise<unknown>): Promise<RankflowError> {
    const outcome = await p.then(() => null, (e: unknown) => e);
    expect(outcome).toBeInstanceOf(RankflowError);
    return outcome as RankflowError;
}

/** Waits for what the workers report asynchronously (the test's own timeout bounds it). */
async function until(condition: () => boolean): Promise<void> {
    while (!condition()) await new Promise((resolve) => setTimeout(resolve, 10));
}

let baseline: Resources;
let group: Group | undefined;

beforeAll(async () => {
    // One group first, so that what a process sets up once (libuv's pool, the addon) is in the baseline.
    const warm = await createGroup({ ranks: 2, backend: 'host', buffer });
    await warm.barrier();
    await warm.destroy();
    baseline = await settledResources(resources());
});

afterEach(async () => {
    await group?.destroy();
    group = undefined;
});

describe('rank.terminate()', () => {
    // Default timeouts (100 s device, 300 s CPU) against a 30 s test: the survivors must not be
    // waiting for a timeout to learn that rank 1 is gone.
    test('while peers wait in a barrier for it: they fail with RANK_FAILED naming it, and so does a collective queued behind', async () => {
        const g = (group = await createGroup({ ranks: 4, backend: 'host', buffer }));
        const failed = failures(g);
        const entered = new Set<number>();
        g.on('transition', (t) => { if (t.to === 'barrier') entered.add(t.rank); });
        const run = g.run(LATE_BARRIER, { late: 1, ms: 60_000 });
        const queued = g.barrier();
        await until(() => entered.size === 3);
        expect([...entered].sort()).toEqual([0, 2, 3]);

        await g.ranks[1]!.terminate();

        const e = await rejection(run);
        expect(e.code).toBe('RANK_FAILED');
        expect(e.rank).toBe(1);
        expect(e.message).toMatch(/^rank 1 /);
        const q = await rejection(queued);
        expect(q).toMatchObject({ code: 'RANK_FAILED', rank: 1 });
        expect(failed.map((f) => f.rank).sort()).toEqual([0, 1, 2, 3]);
        for (const f of failed) expect(f.error).toMatchObject({ code: 'RANK_FAILED', rank: 1 });
        expect(g.snapshot().map((s) => [s.state, s.error?.code, s.error?.rank])).toEqual([
            ['failed', 'RANK_FAILED', 1], ['failed', 'RANK_FAILED', 1], ['failed', 'RANK_FAILED', 1], ['failed', 'RANK_FAILED', 1],
        ]);
        expect(g.snapshot().filter((s) => s.rank !== 1).map((s) => s.error?.state)).toEqual(['barrier', 'barrier', 'barrier']);
    }, 30_000);

    test('before a collective: every later collective rejects with RANK_FAILED naming the rank', async () => {
        const g = (group = await createGroup({ ranks: 4, backend: 'host', buffer }));
        const failed = failures(g);
        await g.ranks[2]!.terminate();
        expect(failed[0]).toMatchObject({ rank: 2, error: { code: 'RANK_FAILED', rank: 2 } });
        expect(g.ranks[2]!.state).toBe('failed');

        const x = tensor('fp32', [2, 4]);
        for (const call of [
            () => g.barrier(),
            () => g.barrier({ withCpuSync: true }),
            () => g.allGather([x, x, x, x]),
            () => g.run(LATE_BARRIER, { late: -1, ms: 0 }),
        ]) {
            const e = await rejection(call());
            expect(e).toMatchObject({ code: 'RANK_FAILED', rank: 2 });
            expect(e.message).toContain('rank 2');
        }
        await expect(g.openSession({ maxBytes: 64, maxAllGathers: 1 })).rejects.toMatchObject({ code: 'RANK_FAILED', rank: 2 });
    }, 30_000);

    test('the survivors learn of the crash too: each fails with RANK_FAILED naming the rank', async () => {
        const g = (group = await createGroup({ ranks: 4, backend: 'host', buffer }));
        const failed = failures(g);
        await g.ranks[0]!.terminate();
        await until(() => failed.length === 4);
        expect(failed.map((f) => f.rank).sort()).toEqual([0, 1, 2, 3]);
        expect(g.snapshot().map((s) => s.state)).toEqual(['failed', 'failed', 'failed', 'failed']);
        for (const s of g.snapshot().slice(1)) expect(s.error).toMatchObject({ code: 'RANK_FAILED', rank: 0, state: 'ready' });
    }, 30_000);

    test('destroy() after a crash ends every rank destroyed and leaves no worker, fd or mapping behind', async () => {
        const g = await createGroup({ ranks: 4, backend: 'host', buffer });
        expect(resources().memfdMappings).toBeGreaterThan(baseline.memfdMappings);
        const run = g.run(LATE_BARRIER, { late: 3, ms: 60_000 });
        await g.ranks[3]!.terminate();
        await rejection(run);
        await g.destroy();
        expect(g.snapshot().map((s) => s.state)).toEqual(['destroyed', 'destroyed', 'destroyed', 'destroyed']);
        expectReleased(await settledResources(baseline), baseline);
    }, 30_000);

    test('a survivor tears down through its machine: failed, destroying, destroyed', async () => {
        const g = await createGroup({ ranks: 2, backend: 'host', buffer });
        const path: string[] = [];
        g.on('transition', (t) => { if (t.rank === 0) path.push(`${t.to} (${t.event})`); });
        await g.ranks[1]!.terminate();
        await until(() => g.ranks[0]!.state === 'failed');
        await g.destroy();
        expect(path).toEqual(['failed (PEER_FAILED)', 'destroying (DESTROY)', 'destroyed (DONE)']);
        expectReleased(await settledResources(baseline), baseline);
    }, 30_000);
});

describe('a peer that never arrives (host backend timeouts: every host wait is a CPU wait)', () => {
    test('its peers fail with TIMEOUT_CPU naming the phase and the missing peer; the peer fails with RANK_FAILED naming a rank that timed out', async () => {
        const g = (group = await createGroup({ ranks: 4, backend: 'host', buffer, timeouts: { cpuSeconds: 1 } }));
        const failed = failures(g);
        // rank 3 never enters the barrier: its program never returns
        const e = await rejection(g.run(LATE_BARRIER, { late: 3, ms: null }));
        expect(e.code).toBe('TIMEOUT_CPU');
        expect(e.phase).toBe('barrier');
        expect(e.rank).toBe(3);
        expect(e.message).toMatch(/^wait of rank [0-2] in barrier timed out after 1 s on counter barrier\[from rank 3\]/);

        await until(() => failed.length === 4);
        const snap = g.snapshot();
        const timedOut = snap.filter((s) => s.error?.code === 'TIMEOUT_CPU').map((s) => s.rank);
        expect(timedOut.length).toBeGreaterThan(0);
        for (const s of snap.slice(0, 3)) {
            expect(s.state).toBe('failed');
            if (s.error!.code === 'TIMEOUT_CPU') {
                expect(s.error).toMatchObject({ rank: 3, phase: 'barrier', state: 'barrier' });
                expect(s.error!.message).toContain(`of rank ${s.rank} in barrier`);
            } else {
                // a waiter told by a peer that timed out before it did
                expect(s.error!.code).toBe('RANK_FAILED');
                expect(timedOut).toContain(s.error!.rank);
            }
        }
        // The rank that never came: failed because of a rank that timed out, whose message names it.
        const late = snap[3]!;
        expect(late.state).toBe('failed');
        expect(late.error!.code).toBe('RANK_FAILED');
        expect(timedOut).toContain(late.error!.rank);
        expect(late.error!.message).toMatch(new RegExp(`^rank ${late.error!.rank} failed: wait .*\\[from rank 3\\]`));
        await g.destroy();
        expect(g.snapshot().map((s) => s.state)).toEqual(['destroyed', 'destroyed', 'destroyed', 'destroyed']);
    }, 30_000);

    test('CPU-sync phase: the waiting ranks fail with TIMEOUT_CPU naming the CPU round and the missing peer', async () => {
        const g = (group = await createGroup({ ranks: 2, backend: 'host', buffer, timeouts: { cpuSeconds: 1 } }));
        const failed = failures(g);
        // rank 1 takes the device barrier and leaves; rank 0 waits for it in the CPU round of the same collective
        const e = await rejection(g.run(CPU_SYNC_BARRIER, { late: 1 }));
        expect(e).toMatchObject({ code: 'TIMEOUT_CPU', rank: 1, phase: 'barrier (CPU sync)' });
        expect(e.message).toMatch(/^CPU-sync wait of rank 0 in barrier \(CPU sync\) timed out after 1 s on counter cpu_barrier\[from rank 1\]/);
        await until(() => failed.length === 2);
        expect(g.snapshot().map((s) => [s.state, s.error?.code, s.error?.rank, s.error?.state])).toEqual([
            ['failed', 'TIMEOUT_CPU', 1, 'barrier'],
            ['failed', 'RANK_FAILED', 0, 'ready'],
        ]);
    }, 30_000);
});
