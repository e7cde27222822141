/**
 * Soak, bounded for the test suite (the full run is `npm run soak`, bench/soak.ts): groups created
 * and destroyed many times leave no fd, mapping or thread behind; a group keeps no collective's
 * output alive; and collectives fired together on one group run one after the other, never
 * interleaved.
 */
import v8 from 'node:v8';
import vm from 'node:vm';
import { describe, expect, test } from 'vitest';

import { createGroup, tensor, type Tensor, type TransitionEvent } from '../actors/index.js';
import { resources, settledResources, expectReleased } from './fixtures/resources.js';

const buffer = { maxTokensPerRank: 8, hidden: 64, topk: 2, numExperts: 8 };

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

describe('soak', () => {
    test('200 create/destroy cycles leave the fds, memfd mappings and threads of the process as they were', async () => {
        const warm = await createGroup({ ranks: 2, backend: 'host', buffer });
        await warm.destroy();
        const before = await settledResources(resources());
        for (let i = 0; i < 200; i++) {
            const g = await createGroup({ ranks: 2, backend: 'host', buffer });
            if (i % 10 === 0) await g.barrier();
            await g.destroy();
        }
        expectReleased(await settledResources(before), before);
    }, 180_000);  // a leak test, not a timing one: 200 cycles take 20-45 s on a loaded 2-core machine

    test('a group keeps no collective output alive once the caller drops it', async () => {
        const g = await createGroup({ ranks: 2, backend: 'host', buffer });
        const input = [tensor('fp32', [1024]), tensor('fp32', [1024])];
        let refs: Array<WeakRef<Tensor>> = [];
        for (let i = 0; i < 20; i++) refs.push(...(await g.allGather(input)).map((t) => new WeakRef(t)));
        await g.barrier();  // the queue moves past the last allGather
        // deref() keeps a target alive until the current job ends: collect in a job of its own
        const alive = (): number => refs.filter((r) => r.deref() !== undefined).length;
        for (let i = 0; i < 5; i++) {
            await new Promise((resolve) => setTimeout(resolve, 20));
            gc();
            await new Promise((resolve) => setTimeout(resolve, 20));
            if (alive() <= 2) break;
        }
        // 40 outputs made; the newest call's (2) may still sit in a stack slot or message of the last turn
        expect(alive()).toBeLessThanOrEqual(2);
        refs = [];
        await g.destroy();
    });

    test('50 collectives fired without awaiting are queued: right results, and each rank runs them one after another', async () => {
        const g = await createGroup({ ranks: 3, backend: 'host', buffer: { ...buffer, numExperts: 6 } });
        const transitions: TransitionEvent[] = [];
        g.on('transition', (t) => transitions.push(t));
        const seq0 = g.snapshot().map((s) => s.seq);
        const inputs = Array.from({ length: 50 }, (_, i) => [0, 1, 2].map((r) => tensor('int32', [2], Int32Array.of(i, r))));
        const calls = inputs.map((ts, i) => (i % 5 === 4 ? g.barrier({ withCpuSync: i % 2 === 0 }) : g.allGather(ts)));
        const results = await Promise.all(calls);
        results.forEach((out, i) => {
            if (i % 5 === 4) return expect(out).toBeUndefined();
            // g[r] = the concatenation of every rank's tensor in rank order, the ones of call i
            for (const t of out as Tensor[]) expect([...t.data]).toEqual([i, 0, i, 1, i, 2]);
        });
        for (let r = 0; r < 3; r++) {
            const mine = transitions.filter((t) => t.rank === r);
            const starts = mine.filter((t) => t.from === 'ready');
            expect(starts.map((t) => t.seq)).toEqual(inputs.map((_, i) => seq0[r]! + i + 1));
            expect(starts.map((t) => t.to)).toEqual(inputs.map((_, i) => (i % 5 === 4 ? 'barrier' : 'allGathering')));
            // between two starts the rank went back to ready: a start, its sub-states, ready, the next start
            const path = mine.map((t) => t.to);
            expect(path.filter((s) => s === 'ready')).toHaveLength(50);
            expect(mine.every((t, k) => k === 0 || (t.seq ?? 0) >= (mine[k - 1]!.seq ?? 0))).toBe(true);
            expect(mine.every((t, k) => t.from !== 'ready' || k === 0 || mine[k - 1]!.to === 'ready')).toBe(true);
        }
        await g.destroy();
    });
});
