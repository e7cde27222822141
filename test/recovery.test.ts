/**
 * What a run leaves behind is cleaned up when it ends (API.md "Faults"): a program that returns with
 * fetches and a session allGather in flight and its session open leaves its ranks ready, in step;
 * the next run finds those leftovers refused (their ops were waited for at the run's end), the old
 * session closed, and everything else working as in a new group. A view of a closed session has no
 * offset in a new one.
 */
import { expect, test } from 'vitest';

import { createGroup } from '../actors/index.js';
import { program, recordTransitions } from './helpers/group.js';

test('leftovers of a run: waited for at its end, the ranks ready; the next run gets STATE for them and a working rank', async () => {
    const g = await createGroup({ backend: 'host', ranks: 3, buffer: { maxTokensPerRank: 4, hidden: 64, topk: 2, numExperts: 6, cpuBytes: 2 << 20 } });
    try {
        const rec = recordTransitions(g);
        expect(await g.run(program('leftovers.mjs'), { phase: 'fetch' })).toEqual(['left', 'left', 'left']);
        expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready', 'ready']);
        expect(await g.run(program('leftovers.mjs'), { phase: 'leave' })).toEqual(['left', 'left', 'left']);
        expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready', 'ready']);
        for (let r = 0; r < 3; r++) expect(rec.paths(r).slice(-2)).toEqual(['recovering', 'ready']);
        expect(new Set(g.snapshot().map((s) => s.seq)).size).toBe(1);
        const after = await g.run<Record<string, unknown>>(program('leftovers.mjs'), { phase: 'after' });
        for (const a of after) {
            expect(a).toMatchObject({ fetchWait: 'STATE', gatherWait: 'STATE', oldTensor: 'STATE', oldClose: 'STATE', engramWrite: 'ok', oldOffset: 'STATE', newOffset: 'ok' });
            expect(a.gathered).toEqual([0, 1, 10, 11, 20, 21]);
        }
        await g.barrier();
    } finally {
        await g.destroy();
    }
});
