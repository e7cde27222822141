/**
 * A dispatch handle is the object a dispatch returned: a forged one ({ ...h, id: 999 }) or a copy
 * (spread, structuredClone, JSON) is refused with EINVAL naming inputs[r].handle (input.handle in a
 * rank program) before any rank moves: no transition, seq unchanged, and the real handle still works.
 */
import { describe, expect, test } from 'vitest';
import { tensor, type DispatchHandle, type RankflowError } from '../actors/index.js';
import { program, recordTransitions, withGroup } from './helpers/group.js';
import { expertRows, prng, randomDispatchInput, referenceCombine, referenceDispatch, type MoeConfig } from './helpers/moe-reference.js';

const cfg: MoeConfig = { worldSize: 3, hidden: 128, topk: 2, numExperts: 6 };
const buffer = { maxTokensPerRank: 8, hidden: cfg.hidden, topk: cfg.topk, numExperts: cfg.numExperts };
const fakes: Array<[string, (h: DispatchHandle) => DispatchHandle]> = [
    ['{ ...h, id: 999 }', (h) => ({ ...h, id: 999 })],
    ['{ ...h }', (h) => ({ ...h })],
    ['structuredClone(h)', (h) => structuredClone(h)],
    ['JSON round trip', (h) => JSON.parse(JSON.stringify(h)) as DispatchHandle],
    ['a frozen copy', (h) => Object.freeze({ ...h })],
];

describe('driver mode', () => {
    test.each(fakes)('%s on one rank: dispatch and combine are EINVAL naming inputs[r].handle; nothing moves', async (_, fake) => {
        const rng = prng(5);
        const inputs = [0, 1, 2].map((r) => randomDispatchInput(rng, 3 + r, cfg));
        await withGroup({ ranks: 3, buffer }, async (g) => {
            const out = await g.dispatch(inputs);
            const ys = out.map((o, r) => tensor('bf16', o.x.shape, expertRows(o.x.data as Uint16Array, r)));
            for (const r of [0, 2]) {
                const before = g.snapshot();
                const rec = recordTransitions(g);
                const handles = out.map((o, q) => (q === r ? fake(o.handle) : o.handle));
                const d = (await g.dispatch(inputs.map((i, q) => ({ x: i.x, handle: handles[q]! }))).catch((e: unknown) => e)) as RankflowError;
                const c = (await g.combine(out.map((o, q) => ({ x: ys[q]!, handle: handles[q]! }))).catch((e: unknown) => e)) as RankflowError;
                for (const e of [d, c]) {
                    expect(e).toMatchObject({ name: 'RankflowError', code: 'EINVAL' });
                    expect(e.message).toMatch(new RegExp(`^inputs\\[${r}\\]\\.handle: is not a handle a dispatch of rank ${r} returned \\(a copy or a made-up object\\)`));
                }
                expect(rec.events).toEqual([]);
                expect(g.snapshot()).toEqual(before);
            }
            // the real handles: a cached dispatch and a combine, exact
            const again = await g.dispatch(inputs.map((i, r) => ({ x: i.x, handle: out[r]!.handle })));
            again.forEach((o, r) => expect(o.x.data).toEqual(referenceDispatch(inputs, cfg, r).x));
            const returned = again.map((o, r) => ({ srcRank: o.srcRank, srcToken: o.srcToken, x: ys[r]!.data, topkWeights: o.topkWeights }));
            const back = await g.combine(again.map((o, r) => ({ x: ys[r]!, handle: o.handle })));
            back.forEach((b, r) => expect(b.x.data).toEqual(referenceCombine(returned, r, inputs[r]!.x.shape[0]!, cfg.hidden, cfg.topk).x));
        });
    });
});

describe('rank programs', () => {
    test('forged and copied handles are EINVAL naming input.handle, the rank unmoved; the real handle combines exactly', async () => {
        const rng = prng(6);
        const inputs = [0, 1, 2].map((r) => randomDispatchInput(rng, 4 + r, cfg));
        await withGroup({ ranks: 3, buffer }, async (g) => {
            const rec = recordTransitions(g);
            const start = g.snapshot().map((s) => s.seq);
            type Answer = { ok?: true; code?: string; message?: string; seqMoved?: boolean };
            type Result = { answers: Record<string, Answer>; recv: { srcRank: Int32Array; srcToken: Int32Array; x: Uint16Array; topkWeights: Float32Array }; combined: Uint16Array };
            const results = await g.run<Result>(program('forged-handle.mjs'), { inputs });
            results.forEach((res, r) => {
                const names = Object.keys(res.answers);
                expect(names).toHaveLength(10);
                for (const name of names) {
                    expect(res.answers[name], `rank ${r} ${name}`).toEqual({
                        code: 'EINVAL', seqMoved: false,
                        message: expect.stringMatching(new RegExp(`^input\\.handle: is not a handle a dispatch of rank ${r} returned \\(a copy or a made-up object\\)`)),
                    });
                }
                expect(res.recv.x).toEqual(referenceDispatch(inputs, cfg, r).x);
            });
            // each rank: one dispatch and one combine, nothing for the refused calls
            for (let r = 0; r < 3; r++) {
                expect(rec.paths(r).filter((p) => p !== 'dispatching.cpuSync')).toEqual(['dispatching.running', 'ready', 'combining', 'ready']);
                expect([...new Set(rec.records(r).map((t) => t.seq))]).toEqual([start[r]! + 1, start[r]! + 2]);
            }
            // the combine of the real handle: every rank returned its received rows as they came
            const returned = results.map((res) => ({ srcRank: res.recv.srcRank, srcToken: res.recv.srcToken, x: res.recv.x, topkWeights: res.recv.topkWeights }));
            results.forEach((res, r) => expect(res.combined).toEqual(referenceCombine(returned, r, inputs[r]!.x.shape[0]!, cfg.hidden, cfg.topk).x));
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready', 'ready']);
        });
    });
});
