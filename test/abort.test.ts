/**
 * AbortSignals: createGroup({ signal }) ends the creation (the wait for a world's other processes
 * included), tears down every rank it started (no worker thread, fd or mapping left, the
 * rendezvous port free again) and rejects with RankflowError code 'ABORTED' whose cause is the
 * signal's reason; group.run(url, args, { signal }) skips a queued run, and tells running programs
 * (rank.aborted, rank.signal, rank.anyAborted()), rejecting with ABORTED once they have ended.
 */
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { afterEach, beforeAll, describe, expect, test } from 'vitest';

import { createGroup, type Group, type GroupOptions, type RankflowError } from '../actors/index.js';
import { ensureCompiled, forkFixture, freePort, killAll, worldSources, type Child } from './helpers/children.js';
import { program, recordTransitions, withGroup } from './helpers/group.js';
import { expectReleased, resources, settledResources } from './fixtures/resources.js';

const buffer = { maxTokensPerRank: 4, hidden: 128, topk: 2, numExperts: 6 };
const children: Child[] = [];
afterEach(() => killAll(children));

beforeAll(async () => {
    // Whatever the runtime makes once (the addon, libuv's pool) is made before any baseline is taken.
    const g = await createGroup({ backend: 'host', ranks: 2, buffer });
    await g.destroy();
});

async function aborted(p: Promise<unknown>): Promise<RankflowError> {
    const e = await p.then(() => new Error('resolved'), (err: unknown) => err);
    expect(e).toMatchObject({ name: 'RankflowError', code: 'ABORTED' });
    return e as RankflowError;
}

const portIsFree = (port: number): Promise<boolean> => new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
});


/** An established TCP connection whose local end is this port (read from /proc/net/tcp): someone connected to the listener there. */
function connectedTo(port: number): boolean {
    const hex = port.toString(16).toUpperCase().padStart(4, '0');
    return ['/proc/net/tcp', '/proc/net/tcp6'].some((f) => {
        try {
            return readFileSync(f, 'utf8').split('\n').slice(1).some((l) => {
                const [, local, , state] = l.trim().split(/\s+/);
                return state === '01' && local?.endsWith(`:${hex}`);
            });
        } catch {
            return false;
        }
    });
}

describe('createGroup({ signal })', () => {
    test('an aborted signal is ABORTED at once, with its reason as the cause; nothing starts', async () => {
        const before = resources();
        const reason = new Error('not today');
        const e = await aborted(createGroup({ backend: 'host', ranks: 2, buffer, signal: AbortSignal.abort(reason) }));
        expect(e.message).toBe('createGroup: aborted (Error: not today)');
        expect(e.cause).toBe(reason);
        expect(resources().threads).toBe(before.threads);
    });

    test('a signal that is not an AbortSignal is EINVAL naming signal', async () => {
        await expect(createGroup({ backend: 'host', ranks: 2, buffer, signal: {} as never })).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^signal: must be an AbortSignal/) });
    });

    test.each([
        ['the leader (rankOffset 0), waiting for a process that never comes', 0],
        ['a follower (rankOffset 1), retrying a leader that never listens', 1],
    ])('%s: ABORTED soon after the abort; every rank torn down, no thread, fd or mapping left, the port free', async (_, rankOffset) => {
        const port = await freePort();
        const before = resources();
        const ac = new AbortController();
        const opts: GroupOptions = {
            backend: 'host', ranks: 2, buffer: { ...buffer, numExperts: 12, cpuBytes: 1 << 20 }, timeouts: { cpuSeconds: 30 },
            world: { size: 4, rankOffset: rankOffset * 2, rendezvous: `tcp://127.0.0.1:${port}` }, signal: ac.signal,
        };
        const creating = createGroup(opts);
        await new Promise((r) => setTimeout(r, 400));  // the process waits for its world (its ranks start once it has met)
        const t0 = Date.now();
        ac.abort();
        const e = await aborted(creating);
        expect(Date.now() - t0).toBeLessThan(2000);
        expect(e.message).toMatch(/^createGroup: aborted \(AbortError: /);
        expect((e.cause as Error).name).toBe('AbortError');
        expectReleased(await settledResources(before), before);
        expect(await portIsFree(port)).toBe(true);
    });

    test('AbortSignal.timeout: ABORTED with the TimeoutError as the cause', async () => {
        const port = await freePort();
        const e = await aborted(createGroup({
            backend: 'host', ranks: 1, buffer, world: { size: 2, rankOffset: 0, rendezvous: `tcp://127.0.0.1:${port}` }, signal: AbortSignal.timeout(300),
        }));
        expect((e.cause as Error).name).toBe('TimeoutError');
    });

    test('a leader that aborts tells the process that joined it: that one fails with RANK_FAILED naming rank 0, at once', async () => {
        ensureCompiled('dist/actors/world/join.js', [...worldSources, 'actors/group.ts', 'actors/ranks.ts', 'actors/startup.ts', 'actors/options.ts', 'actors/core/abort.ts']);
        const url = `tcp://127.0.0.1:${await freePort()}`;
        const ac = new AbortController();
        const childBuffer = { maxTokensPerRank: 16, hidden: 128, topk: 2, numExperts: 8, cpuBytes: 0 };  // world-child's
        const creating = createGroup({ backend: 'host', ranks: 2, buffer: childBuffer, world: { size: 4, rankOffset: 0, rendezvous: url }, timeouts: { cpuSeconds: 30 }, signal: ac.signal });
        const child = forkFixture('world-child', { url, worldSize: 4, rankOffset: 2, ranks: 1, cpuSeconds: 30 });
        children.push(child);
        // the child has connected (then it authenticates and joins within a few round trips); rank 3 never comes
        const port = Number(new URL(url).port);
        while (!connectedTo(port)) await new Promise((r) => setTimeout(r, 50));
        await new Promise((r) => setTimeout(r, 500));
        const t0 = Date.now();
        ac.abort();
        await aborted(creating);
        const m = await child.next('error', 5000);
        expect(Date.now() - t0).toBeLessThan(3000);
        expect(m).toMatchObject({ code: 'RANK_FAILED', message: expect.stringMatching(/the leader \(rank 0's process, pid \d+\) gave up: its createGroup was aborted/) });
    });

    test('a follower that joined and aborts says bye: the leader names it as having given up; nothing of it is left here', async () => {
        ensureCompiled('dist/actors/world/join.js', [...worldSources, 'actors/group.ts', 'actors/ranks.ts', 'actors/startup.ts', 'actors/options.ts', 'actors/core/abort.ts']);
        const port = await freePort();
        const url = `tcp://127.0.0.1:${port}`;
        const leader = forkFixture('world-child', { url, worldSize: 4, rankOffset: 0, ranks: 1, cpuSeconds: 6 });
        children.push(leader);
        const before = resources();
        const ac = new AbortController();
        const childBuffer = { maxTokensPerRank: 16, hidden: 128, topk: 2, numExperts: 8, cpuBytes: 0 };
        const creating = createGroup({ backend: 'host', ranks: 2, buffer: childBuffer, world: { size: 4, rankOffset: 1, rendezvous: url }, timeouts: { cpuSeconds: 30 }, signal: ac.signal });
        while (!connectedTo(port)) await new Promise((r) => setTimeout(r, 50));  // this process reached the leader
        await new Promise((r) => setTimeout(r, 500));  // and joined (a few round trips); rank 3 never comes
        ac.abort();
        await aborted(creating);
        expectReleased(await settledResources(before), before);
        const m = await leader.next('error', 10_000);
        expect(m).toMatchObject({ code: 'TIMEOUT_CPU', message: expect.stringMatching(/left before the table: ranks \[1, 3\).*it gave up/) });
    });

    test('an abort after the group is ready changes nothing', async () => {
        const ac = new AbortController();
        const g = await createGroup({ backend: 'host', ranks: 2, buffer, signal: ac.signal });
        try {
            ac.abort();
            await g.barrier();
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
        } finally {
            await g.destroy();
        }
    });
});

describe('group.run(url, args, { signal })', () => {
    test('options that are not an object, or a signal that is not an AbortSignal, are EINVAL naming them; nothing moves', async () => {
        await withGroup({ ranks: 2, buffer }, async (g: Group) => {
            const rec = recordTransitions(g);
            for (const opts of [42, 'x', [], null]) {
                await expect(g.run(program('until-aborted.mjs'), { mode: 'count' }, opts as never)).rejects.toMatchObject({
                    code: 'EINVAL', message: expect.stringMatching(/^options: must be an object \{ signal\? \}/),
                });
            }
            await expect(g.run(program('until-aborted.mjs'), { mode: 'count' }, { signal: 'x' as never })).rejects.toMatchObject({
                code: 'EINVAL', message: expect.stringMatching(/^options\.signal: must be an AbortSignal/),
            });
            expect(rec.events).toEqual([]);
            expect(await g.run(program('until-aborted.mjs'), { mode: 'count' }, {})).toEqual([1, 1]);
        });
    });

    test('aborted before its turn: ABORTED at once, and its programs never run', async () => {
        await withGroup({ ranks: 2, buffer }, async (g: Group) => {
            const first = g.run(program('until-aborted.mjs'), { mode: 'sleep', ms: 300 });
            const ac = new AbortController();
            const queued = g.run(program('until-aborted.mjs'), { mode: 'count' }, { signal: ac.signal });
            ac.abort('changed my mind');
            const e = await aborted(queued);
            expect(e.message).toBe('group.run: aborted (changed my mind)');
            expect(await first).toEqual([1, 1]);
            // the queued run never ran: the next one is the workers' second
            expect(await g.run(program('until-aborted.mjs'), { mode: 'count' })).toEqual([2, 2]);
            await aborted(g.run(program('until-aborted.mjs'), { mode: 'count' }, { signal: AbortSignal.abort() }));
            expect(await g.run(program('until-aborted.mjs'), { mode: 'count' })).toEqual([3, 3]);
        });
    });

    test('aborted while running: rank.anyAborted() stops every rank after the same collective; ABORTED; the ranks ready and in step', async () => {
        await withGroup({ ranks: 3, buffer }, async (g: Group) => {
            const ac = new AbortController();
            const rec = recordTransitions(g);
            const running = g.run<{ n: number }>(program('until-aborted.mjs'), { mode: 'agree' }, { signal: ac.signal });
            await new Promise((r) => setTimeout(r, 300));
            ac.abort();
            await aborted(running);
            const seqs = g.snapshot().map((s) => s.seq);
            expect(new Set(seqs).size).toBe(1);
            expect(seqs[0]).toBeGreaterThan(2);  // it had been running: barriers and anyAborted gathers
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready', 'ready']);
            for (let r = 0; r < 3; r++) expect(rec.paths(r).at(-1)).toBe('ready');
            await g.barrier();
            expect(g.snapshot().map((s) => s.seq)).toEqual(seqs.map((s) => s + 1));
        });
    });

    test('aborted while running: rank.signal ends an awaited timer at once', async () => {
        await withGroup({ ranks: 2, buffer }, async (g: Group) => {
            const ac = new AbortController();
            const running = g.run(program('until-aborted.mjs'), { mode: 'signal', ms: 30_000 }, { signal: ac.signal });
            await new Promise((r) => setTimeout(r, 300));
            const t0 = Date.now();
            ac.abort();
            await aborted(running);
            expect(Date.now() - t0).toBeLessThan(1000);
            expect(await g.run(program('until-aborted.mjs'), { mode: 'count' })).toEqual([1, 1]);
        });
    });

    test('a run that ends before any abort resolves as usual', async () => {
        await withGroup({ ranks: 2, buffer }, async (g: Group) => {
            const ac = new AbortController();
            expect(await g.run(program('until-aborted.mjs'), { mode: 'count' }, { signal: ac.signal })).toEqual([1, 1]);
            ac.abort();
            await g.barrier();
        });
    });
});
