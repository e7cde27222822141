/**
 * Sequence numbers are 64-bit natively and exact JS numbers up to 2^53 (RANKFLOW_TEST_FIRST_SEQ, a
 * test-only hook, starts a group's sequence elsewhere than 0). Across 2^32 and near the largest start
 * allowed (2^53 - 2^32) barriers, allGather, dispatch + combine (cached too), sessions and rank programs
 * give the exact results and the same sequence number on every rank, in the snapshot, the transitions,
 * the handles and the native side. Start values past the limit are EINVAL.
 */
import { afterEach, describe, expect, test } from 'vitest';
import { createGroup, tensor, type Group } from '../actors/index.js';
import { program, recordTransitions } from './helpers/group.js';
import { expertRows, prng, randomDispatchInput, referenceCombine, referenceDispatch, type MoeConfig } from './helpers/moe-reference.js';
import { randomTensor, referenceAllGather, referenceReduceScatter } from './helpers/agrs-reference.js';

const MAX_FIRST_SEQ = 2 ** 53 - 2 ** 32;
const cfg: MoeConfig = { worldSize: 3, hidden: 128, topk: 2, numExperts: 6 };
const buffer = { maxTokensPerRank: 8, hidden: cfg.hidden, topk: cfg.topk, numExperts: cfg.numExperts };

const saved = process.env.RANKFLOW_TEST_FIRST_SEQ;
afterEach(() => {
    if (saved === undefined) delete process.env.RANKFLOW_TEST_FIRST_SEQ;
    else process.env.RANKFLOW_TEST_FIRST_SEQ = saved;
});

async function groupFrom(first: number | string): Promise<Group> {
    process.env.RANKFLOW_TEST_FIRST_SEQ = String(first);
    return createGroup({ backend: 'host', ranks: cfg.worldSize, buffer });
}

/** Every rank at seq `want`, in the snapshot and natively (whose count includes the registration). */
async function expectSeq(g: Group, want: number): Promise<void> {
    expect(g.snapshot().map((s) => s.seq)).toEqual([want, want, want]);
    for (let r = 0; r < 3; r++) expect((await g.info(r)).seq).toBe(want + 1);
}

describe.each([
    ['across 2^32', 2 ** 32 - 3],
    ['near the largest start (2^53 - 2^32)', MAX_FIRST_SEQ - 3],
])('%s', (_, first) => {
    test('barriers, allGather, dispatch + combine (cached too), a session and a rank program: exact, one seq per collective', async () => {
        const g = await groupFrom(first);
        try {
            const rec = recordTransitions(g);
            await expectSeq(g, first);
            let seq = first;
            await g.barrier();
            await g.barrier({ withCpuSync: true });
            seq += 2;
            await expectSeq(g, seq);  // 2^32 - 1 on the first run

            const rng = prng(7);
            const parts = [0, 1, 2].map(() => randomTensor(rng, 'int32', [5, 3]));
            const want = referenceAllGather(parts);
            expect(await g.allGather(parts)).toEqual([want, want, want]);
            seq += 1;  // 2^32

            const inputs = [0, 1, 2].map((r) => randomDispatchInput(rng, 4 + r, cfg));
            const out = await g.dispatch(inputs);
            seq += 1;
            out.forEach((o, r) => {
                const ref = referenceDispatch(inputs, cfg, r);
                expect(o.x.data).toEqual(ref.x);
                expect([o.srcRank, o.srcToken, o.tokensPerExpert]).toEqual([ref.srcRank, ref.srcToken, ref.tokensPerExpert]);
                expect(o.handle.seq).toBe(seq);
            });
            const ys = out.map((o, r) => tensor('bf16', o.x.shape, expertRows(o.x.data as Uint16Array, r)));
            const returned = out.map((o, r) => ({ srcRank: o.srcRank, srcToken: o.srcToken, x: ys[r]!.data, topkWeights: o.topkWeights }));
            const checkCombine = (back: Array<{ x: { data: Uint16Array }; topkWeights: Float32Array }>) => back.forEach((b, r) => {
                const ref = referenceCombine(returned, r, inputs[r]!.x.shape[0]!, cfg.hidden, cfg.topk);
                expect(b.x.data).toEqual(ref.x);
                expect(b.topkWeights).toEqual(ref.topkWeights);
            });
            checkCombine(await g.combine(out.map((o, r) => ({ x: ys[r]!, handle: o.handle }))));
            seq += 1;
            // cached: the handle of the dispatch two collectives ago
            const again = await g.dispatch(inputs.map((d, r) => ({ x: d.x, handle: out[r]!.handle })));
            seq += 1;
            again.forEach((o, r) => {
                expect(o.x.data).toEqual(out[r]!.x.data);
                expect(o.handle.seq).toBe(seq);
            });
            checkCombine(await g.combine(again.map((o, r) => ({ x: ys[r]!, handle: o.handle }))));
            seq += 1;
            await expectSeq(g, seq);

            const s = await g.openSession({ maxBytes: 1024, maxAllGathers: 2 });
            const grads = [0, 1, 2].map(() => randomTensor(rng, 'fp32', [6, 2]));
            const rs = await s.reduceScatter(grads);
            rs.forEach((t, r) => expect(t).toEqual(referenceReduceScatter(grads, r)));
            expect(await s.allGather(parts)).toEqual([want, want, want]);
            await s.close();
            seq += 4;
            await expectSeq(g, seq);

            expect(await g.run(program('barriers.mjs'), { n: 3 })).toEqual([0, 1, 2]);
            seq += 3;
            await expectSeq(g, seq);

            // every transition carried the same seq on every rank for the same collective, and seqs only grew by one
            for (let r = 0; r < 3; r++) {
                const seqs = [...new Set(rec.records(r).map((t) => t.seq!))];
                expect(seqs).toEqual(Array.from({ length: seq - first }, (_, i) => first + 1 + i));
            }
        } finally {
            await g.destroy();
        }
    });
});

describe('RANKFLOW_TEST_FIRST_SEQ', () => {
    test.each([String(MAX_FIRST_SEQ + 1), String(2 ** 53), '18446744073709551615', '-1', '1.5', '1e9', 'abc', '0x10'])('%s is EINVAL naming it, before any rank starts', async (v) => {
        process.env.RANKFLOW_TEST_FIRST_SEQ = v;
        await expect(createGroup({ backend: 'host', ranks: 2, buffer: { ...buffer, numExperts: 6 } })).rejects.toMatchObject({
            code: 'EINVAL', message: expect.stringMatching(/^RANKFLOW_TEST_FIRST_SEQ: must be a decimal integer in \[0, 9007194959773696\]/),
        });
    });

    test('unset or empty, a group starts at 0', async () => {
        process.env.RANKFLOW_TEST_FIRST_SEQ = '';
        const g = await createGroup({ backend: 'host', ranks: 3, buffer });
        try {
            await expectSeq(g, 0);
        } finally {
            await g.destroy();
        }
    });
});

describe('an op refused after it took its number (ranks replaying handles of different dispatches)', () => {
    test('every rank keeps the number the native side took: machine and native counts agree, and the next collectives match', async () => {
        process.env.RANKFLOW_TEST_FIRST_SEQ = '';
        const g = await createGroup({ backend: 'host', ranks: 2, buffer });
        try {
            const [r0, r1] = await g.run<{ mixed: { code?: string } }>(program('mixed-handles.mjs'), { odd: 0, hidden: cfg.hidden, topk: cfg.topk, experts: cfg.numExperts, tokens: 4 });
            expect([r0!.mixed.code, r1!.mixed.code]).toEqual(['EINVAL', 'EINVAL']);
            // a, b, the refused one (its enter signals went out: it took #3), again: 4 collectives.
            const seqs = async (want: number) => {
                expect(g.snapshot().map((x) => x.seq)).toEqual([want, want]);
                for (let r = 0; r < 2; r++) expect((await g.info(r)).seq).toBe(want + 1);
            };
            await seqs(4);
            await g.barrier();
            await seqs(5);
            const out = await g.dispatch([0, 1].map(() => ({ x: tensor('bf16', [1, cfg.hidden]), topkIdx: Int32Array.of(0, 5), topkWeights: Float32Array.of(1, 1) })));
            expect(out.map((o) => o.handle.seq)).toEqual([6, 6]);
        } finally {
            await g.destroy();
        }
    });
});
