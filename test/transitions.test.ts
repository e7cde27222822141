// An operation is one synchronous native call and one pass of the rank machine: one transition into
// the op's state and one out of it, whose record names the phases the call went through; every
// transition still reaches the main thread, before the op's result does.
import { afterEach, describe, expect, test } from 'vitest';

import { createGroup, type Group } from '../actors/index.js';
import { program, recordTransitions } from './helpers/group.js';

const buffer = { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 6 };
let live: Group | null = null;
afterEach(async () => {
    await live?.destroy();
    live = null;
});

describe('one transition in and one out per op', () => {
    test('driver mode: a barrier with CPU sync is barrier -> ready on every rank, its record naming both rounds', async () => {
        const g = (live = await createGroup({ ranks: 3, backend: 'host', buffer }));
        const rec = recordTransitions(g);
        await g.barrier({ withCpuSync: true });
        for (let r = 0; r < 3; r++) {
            expect(rec.paths(r)).toEqual(['barrier', 'ready']);
            expect(rec.records(r)[1]).toMatchObject({ from: 'barrier', to: 'ready', op: 'barrier', phases: ['device', 'cpuSync'] });
        }
    });

    test('rank program: each of 20 barriers is seen as barrier -> ready before the program returns', async () => {
        const g = (live = await createGroup({ ranks: 2, backend: 'host', buffer }));
        const rec = recordTransitions(g);
        expect(await g.run(program('barriers.mjs'), { n: 20, withCpuSync: true })).toEqual([0, 1]);
        for (let r = 0; r < 2; r++) {
            expect(rec.paths(r)).toEqual(Array.from({ length: 20 }, () => ['barrier', 'ready']).flat());
            const seqs = rec.records(r).filter((t) => t.to === 'barrier').map((t) => t.seq);
            expect(seqs).toEqual(Array.from({ length: 20 }, (_, i) => seqs[0]! + i));
        }
    });

    test('without CPU sync a barrier has one phase: device', async () => {
        const g = (live = await createGroup({ ranks: 2, backend: 'host', buffer }));
        const rec = recordTransitions(g);
        await g.run(program('barriers.mjs'), { n: 3, withCpuSync: false });
        for (let r = 0; r < 2; r++) {
            expect(rec.paths(r)).toEqual(Array.from({ length: 3 }, () => ['barrier', 'ready']).flat());
            expect(rec.records(r).filter((t) => t.to === 'ready').map((t) => t.phases)).toEqual([['device'], ['device'], ['device']]);
        }
    });
});

describe('the memoised machine path (hot ops skip the xstate actor, not the machine)', () => {
    test('every op of a long program still reaches group.on(transition) in order, with its seq; then the machine refuses a dispatch inside a session and later ops agree with it', async () => {
        const g = (live = await createGroup({ ranks: 2, backend: 'host', buffer: { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 4 } }));
        const rec = recordTransitions(g);
        const n = 300;
        const out = await g.run<{ refused: string | null; seq: number }>(program('hot-loop.mjs'), { n, hidden: 128, topk: 2 });
        for (let r = 0; r < 2; r++) {
            expect(out[r]!.refused).toBe('STATE');
            // A dispatch may show its CPU-sync wait (dispatching.cpuSync) when its peer is late: not counted here.
            const recs = rec.records(r).filter((t) => t.to !== 'dispatching.cpuSync');
            const want: string[] = [];
            for (let i = 0; i < n; i++) want.push('barrier', 'ready', 'dispatching.running', 'ready', 'combining', 'ready');
            want.push('session.opening', 'session.open', 'session.gathering', 'session.open', 'session.closing', 'ready');
            for (let i = 0; i < n; i++) want.push('barrier', 'ready');
            expect(recs.map((t) => t.to)).toEqual(want);
            // seq counts every collective the machine began, as the machine does (the refused dispatch none)
            const seqs = recs.filter((t) => t.to !== 'ready' && t.to !== 'session.open').map((t) => t.seq);
            expect(seqs).toEqual(Array.from({ length: 3 * n + 3 + n }, (_, i) => seqs[0]! + i));
            expect(out[r]!.seq).toBe(seqs.at(-1));
            expect(recs.find((t) => t.from.startsWith('dispatching'))).toMatchObject({ op: 'dispatch', phases: ['notify', 'cpuSync', 'data'] });
            expect(recs.every((t, i) => i === 0 || t.at >= recs[i - 1]!.at)).toBe(true);
        }
        expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
        // The machine (its actor, brought up to date) still decides what is next: destroy goes through it.
        await g.destroy();
        live = null;
        for (let r = 0; r < 2; r++) expect(rec.paths(r).slice(-2)).toEqual(['destroying', 'destroyed']);
    });

    test('with inspect, every event reaches the xstate actor: the inspection stream has each BARRIER and DONE', async () => {
        const events: string[] = [];
        const g = (live = await createGroup({
            ranks: 2, backend: 'host', buffer,
            inspect: (rec) => { if (rec.type === '@xstate.event' && rec.rank === 0) events.push((rec.event as { type: string }).type); },
        }));
        await g.run(program('barriers.mjs'), { n: 50, withCpuSync: false });
        await new Promise((r) => setTimeout(r, 50));
        expect(events.filter((e) => e === 'BARRIER').length).toBe(50);
        expect(events.filter((e) => e === 'DONE').length).toBeGreaterThanOrEqual(51);  // register's DONE too
    });
});
