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
