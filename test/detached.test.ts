/**
 * Inputs whose memory is detached (transferred to another thread, or a view of a closed AGRS session)
 * are refused with EINVAL naming the argument and saying so, in driver mode and in rank programs,
 * never with a TypeError of the runtime's own checks; a closed session's view has no offset in
 * another session (STATE: the next session reuses that memory).
 */
import { expect, test } from 'vitest';

import { createGroup, tensor } from '../actors/index.js';
import { program } from './helpers/group.js';

const detached = <A extends ArrayBufferView>(a: A): A => (structuredClone(a, { transfer: [a.buffer as ArrayBuffer] }), a);
const DETACHED = /its memory is detached/;

test('driver mode: detached indices, rows and weights are EINVAL naming them', async () => {
    const g = await createGroup({ backend: 'host', ranks: 2, buffer: { maxTokensPerRank: 4, hidden: 64, topk: 2, numExperts: 4, cpuBytes: 2 << 20 } });
    try {
        await g.engramWrite([tensor('fp32', [2, 8]), tensor('fp32', [2, 8])]);
        await expect(g.engramFetch([detached(Int32Array.of(0)), Int32Array.of(0)])).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^indices\[0\]: its memory is detached/) });
        // tensor() refuses such data itself; a plain object reaches the op's own check
        expect(() => tensor('fp32', [2], detached(new Float32Array(2)))).toThrow(/^data: has 0 elements; shape \[2\] needs 2 \(its memory is detached/);
        const stale = { dtype: 'fp32' as const, shape: [2], data: detached(new Float32Array(2)) };
        await expect(g.allGather([stale, tensor('fp32', [2])])).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^tensors\[0\]\.data: .*detached/) });
        const d = (w: Float32Array) => ({ x: tensor('bf16', [1, 64]), topkIdx: Int32Array.of(0, 1), topkWeights: w });
        await expect(g.dispatch([d(detached(new Float32Array(2))), d(new Float32Array(2))])).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^inputs\[0\]\.topkWeights: its memory is detached/) });
        expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
    } finally {
        await g.destroy();
    }
});

test("rank programs: the same refusals; a session tensor of dtype 'constructor' or '__proto__' is EINVAL; offsetOf of a closed session's view is STATE", async () => {
    const g = await createGroup({ backend: 'host', ranks: 2, buffer: { maxTokensPerRank: 4, hidden: 64, topk: 2, numExperts: 4, cpuBytes: 2 << 20 } });
    try {
        await g.engramWrite([tensor('fp32', [2, 8]), tensor('fp32', [2, 8])]);
        for (const a of await g.run<Record<string, { name?: string; code?: string; message?: string }>>(program('detached-inputs.mjs'))) {
            for (const op of ['engramFetch', 'engramFetchAsync', 'allGather', 'dispatch', 'ppExchange', 'hostTensor'])
                expect(a[op], op).toMatchObject({ name: 'RankflowError', code: 'EINVAL', message: expect.stringMatching(DETACHED) });
            expect(a.otherSessionView).toMatchObject({ code: 'STATE', message: expect.stringMatching(/another AGRS session's buffer/) });
            expect(a.sessionDtype).toMatchObject({ code: 'EINVAL', message: 'dtype: refused' });
        }
        expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
    } finally {
        await g.destroy();
    }
});
