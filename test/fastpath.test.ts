// The fast path runs a multi-phase op (a barrier with its CPU-sync round; on cuda also a device-tensor
// dispatch) as ONE native job whose phases the rank machine observes as they finish: the machine still
// passes through every phase state, in order, and every transition reaches the main thread before the
// op's result does.
import { afterEach, describe, expect, test } from 'vitest';

import { createGroup, type Group } from '../actors/index.js';
import { program, recordTransitions } from './helpers/group.js';

const buffer = { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 6 };
let live: Group | null = null;
afterEach(async () => {
    await live?.destroy();
    live = null;
});

describe('a barrier with CPU sync in one native job', () => {
    test('driver mode: every rank passes barrier.device -> barrier.cpuSync -> ready before the barrier resolves', async () => {
        const g = (live = await createGroup({ ranks: 3, backend: 'host', buffer }));
        const rec = recordTransitions(g);
        await g.barrier({ withCpuSync: true });
        for (let r = 0; r < 3; r++) expect(rec.paths(r)).toEqual(['barrier.device', 'barrier.cpuSync', 'ready']);
    });

    test('rank program: each of 20 barriers passes device -> cpuSync -> ready, all seen before the program returns', async () => {
        const g = (live = await createGroup({ ranks: 2, backend: 'host', buffer }));
        const rec = recordTransitions(g);
        expect(await g.run(program('barriers.mjs'), { n: 20, withCpuSync: true })).toEqual([0, 1]);
        const once = ['barrier.device', 'barrier.cpuSync', 'ready'];
        for (let r = 0; r < 2; r++) expect(rec.paths(r)).toEqual(Array.from({ length: 20 }, () => once).flat());
    });

    test('without CPU sync a barrier is a single phase: barrier.device -> ready', async () => {
        const g = (live = await createGroup({ ranks: 2, backend: 'host', buffer }));
        const rec = recordTransitions(g);
        await g.run(program('barriers.mjs'), { n: 3, withCpuSync: false });
        for (let r = 0; r < 2; r++) expect(rec.paths(r)).toEqual(Array.from({ length: 3 }, () => ['barrier.device', 'ready']).flat());
    });
});
