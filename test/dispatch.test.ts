/**
 * MoE dispatch on the host backend (API.md "Collective operations"), checked against a naive
 * reference (test/helpers/moe-reference.ts): experts owned in contiguous blocks, a token sent once
 * per destination rank, receive order by source rank then source token, local expert ids, aligned
 * tokensPerExpert; the notify counters in the receivers' workspaces, the CPU-sync timeout, cached
 * dispatch with a handle, input checks, and the same dispatch from a rank program.
 */
import { describe, expect, test } from 'vitest';
import { createGroup, type DispatchResult, type Group, type RankflowError, type TransitionEvent } from '../actors/index.js';
import { loadAddon } from '../actors/core/addon.js';
import { program, recordTransitions, withGroup } from './helpers/group.js';
import { tensor } from '../actors/core/tensor.js';
import {
    expertRows, prng, randomBf16, randomDispatchInput, randomRouting, referenceCombine, referenceDispatch, type MoeConfig, type RankRouting,
} from './helpers/moe-reference.js';

const buffer = (cfg: MoeConfig, maxTokensPerRank = 32, extra = {}) => ({
    maxTokensPerRank, hidden: cfg.hidden, topk: cfg.topk, numExperts: cfg.numExperts, ...extra,
});

function expectDispatched(out: DispatchResult[], inputs: RankRouting[], cfg: MoeConfig, alignment = 1): void {
    out.forEach((o, r) => {
        const want = referenceDispatch(inputs, cfg, r, alignment);
        expect(o.srcRank, `rank ${r} srcRank`).toEqual(want.srcRank);
        expect(o.srcToken, `rank ${r} srcToken`).toEqual(want.srcToken);
        expect(o.x.shape).toEqual([want.srcRank.length, cfg.hidden]);
        expect(o.x.dtype).toBe(inputs[0]!.x.dtype);
        expect(o.x.data, `rank ${r} x`).toEqual(want.x);
        expect(o.topkIdx, `rank ${r} topkIdx`).toEqual(want.topkIdx);
        expect(o.topkWeights, `rank ${r} topkWeights`).toEqual(want.topkWeights);
        expect(o.tokensPerExpert, `rank ${r} tokensPerExpert`).toEqual(want.tokensPerExpert);
        if (want.scales) expect(o.scales?.data, `rank ${r} scales`).toEqual(want.scales);
        else expect(o.scales).toBeUndefined();
    });
}

const randomInputs = (seed: number, cfg: MoeConfig, tokens: (r: number) => number, fp8 = false): RankRouting[] => {
    const rng = prng(seed);
    return Array.from({ length: cfg.worldSize }, (_, r) => randomDispatchInput(rng, tokens(r), cfg, fp8));
};

describe('dispatch: what each rank receives', () => {
    const cfg: MoeConfig = { worldSize: 4, hidden: 256, topk: 4, numExperts: 16 };

    test('bf16: rows of the tokens with an expert in the rank block, ordered by source rank then source token', async () => {
        const inputs = randomInputs(1, cfg, (r) => 20 + r);
        await withGroup({ ranks: 4, buffer: buffer(cfg) }, async (g) => {
            expectDispatched(await g.dispatch(inputs), inputs, cfg);
        });
    });

    test('fp8e4m3 with per-128 fp32 scales: bits and scales travel with their token, in the same order', async () => {
        const fcfg = { ...cfg, hidden: 384 };
        const inputs = randomInputs(2, fcfg, (r) => 17 + 3 * r, true);
        await withGroup({ ranks: 4, buffer: buffer(fcfg, 32, { fp8Dispatch: true }) }, async (g) => {
            const out = await g.dispatch(inputs);
            expectDispatched(out, inputs, fcfg);
            expect(out[0]!.scales!.shape).toEqual([out[0]!.x.shape[0], 3]);
        });
    });

    test('bf16 dispatch on an fp8-capable buffer returns no scales', async () => {
        const inputs = randomInputs(3, cfg, () => 9);
        await withGroup({ ranks: 4, buffer: buffer(cfg, 32, { fp8Dispatch: true }) }, async (g) => {
            expectDispatched(await g.dispatch(inputs), inputs, cfg);
        });
    });

    test('top-16 routing with -1 slots: each token still arrives once per destination rank', async () => {
        const kcfg: MoeConfig = { worldSize: 4, hidden: 128, topk: 16, numExperts: 64 };
        const inputs = randomInputs(4, kcfg, () => 24);
        await withGroup({ ranks: 4, buffer: buffer(kcfg) }, async (g) => {
            const out = await g.dispatch(inputs);
            expectDispatched(out, inputs, kcfg);
            for (const o of out) expect(new Set(o.srcRank.map((p, i) => p * 1000 + o.srcToken[i]!)).size).toBe(o.srcRank.length);
        });
    });

    test('tokensPerExpert is padded to a multiple of expertAlignment (numRecv is not)', async () => {
        const inputs = randomInputs(5, cfg, () => 13).map((d) => ({ ...d, expertAlignment: 8 }));
        await withGroup({ ranks: 4, buffer: buffer(cfg) }, async (g) => {
            const out = await g.dispatch(inputs);
            expectDispatched(out, inputs, cfg, 8);
            for (const o of out) for (const n of o.tokensPerExpert) expect(n % 8).toBe(0);
            const unpadded = referenceDispatch(inputs, cfg, 0).srcRank.length;
            expect(out[0]!.x.shape[0]).toBe(unpadded);
        });
    });

    test.each([1, 2, 3, 8])('world size %i: the same reference holds', async (W) => {
        const wcfg: MoeConfig = { worldSize: W, hidden: 128, topk: Math.min(4, 2 * W), numExperts: 2 * W };
        const inputs = randomInputs(10 + W, wcfg, (r) => 5 + ((r * 7) % 11));
        await withGroup({ ranks: W, buffer: buffer(wcfg, 16) }, async (g) => {
            expectDispatched(await g.dispatch(inputs), inputs, wcfg);
        });
    });

    test('the handle names its group, rank, numTokens and numRecv, and carries the same seq on every rank', async () => {
        const inputs = randomInputs(6, cfg, (r) => 3 + r);
        await withGroup({ ranks: 4, buffer: buffer(cfg) }, async (g) => {
            const out = await g.dispatch(inputs);
            out.forEach((o, r) => {
                expect(o.handle).toMatchObject({ group: g.id, rank: r, numTokens: 3 + r, numRecv: o.x.shape[0] });
                expect(o.handle.seq).toBe(out[0]!.handle.seq);
            });
        });
    });
});

describe('dispatch: edge cases of routing', () => {
    const cfg: MoeConfig = { worldSize: 4, hidden: 128, topk: 4, numExperts: 8 };

    test('ranks with zero tokens send nothing and still receive', async () => {
        const inputs = randomInputs(20, cfg, (r) => (r % 2 === 0 ? 0 : 12));
        await withGroup({ ranks: 4, buffer: buffer(cfg) }, async (g) => {
            const out = await g.dispatch(inputs);
            expectDispatched(out, inputs, cfg);
            expect(out.every((o) => o.srcRank.every((p) => p % 2 === 1))).toBe(true);
        });
    });

    test('all tokens to one expert: its owner receives every token, the others nothing', async () => {
        const rng = prng(21);
        const inputs: RankRouting[] = Array.from({ length: 4 }, () => {
            const topkIdx = new Int32Array(10 * 4).fill(-1);
            for (let t = 0; t < 10; t++) topkIdx[t * 4 + (t % 4)] = 5; // expert 5: rank 2 (owns 4..5)
            return { x: randomBf16(rng, 10, 128), topkIdx, topkWeights: new Float32Array(40).fill(0.5) };
        });
        await withGroup({ ranks: 4, buffer: buffer(cfg) }, async (g) => {
            const out = await g.dispatch(inputs);
            expectDispatched(out, inputs, cfg);
            expect(out.map((o) => o.x.shape[0])).toEqual([0, 0, 40, 0]);
            expect(out[2]!.tokensPerExpert).toEqual([0, 40]);
        });
    });

    test('every slot -1: nobody receives anything, tokensPerExpert is all zeros', async () => {
        const rng = prng(22);
        const inputs: RankRouting[] = Array.from({ length: 4 }, () => ({
            x: randomBf16(rng, 7, 128), topkIdx: new Int32Array(28).fill(-1), topkWeights: new Float32Array(28),
        }));
        await withGroup({ ranks: 4, buffer: buffer(cfg) }, async (g) => {
            const out = await g.dispatch(inputs);
            expectDispatched(out, inputs, cfg);
            for (const o of out) {
                expect(o.x.shape).toEqual([0, 128]);
                expect(o.tokensPerExpert).toEqual([0, 0]);
            }
        });
    });

    test('maxTokensPerRank exceeded: EINVAL naming the argument, and no rank moves', async () => {
        const inputs = randomInputs(23, cfg, (r) => (r === 1 ? 33 : 4));
        await withGroup({ ranks: 4, buffer: buffer(cfg, 32) }, async (g) => {
            const rec = recordTransitions(g);
            const err = (await g.dispatch(inputs).catch((e: unknown) => e)) as RankflowError;
            expect(err.code).toBe('EINVAL');
            expect(err.message).toMatch(/inputs\[1\]\.x\.shape\[0\].*33 tokens exceed buffer\.maxTokensPerRank \(32\)/);
            expect(rec.events).toEqual([]);
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready', 'ready', 'ready']);
            // ... and the group still works
            const ok = inputs.map((d, r) => (r === 1 ? randomInputs(24, cfg, () => 4)[1]! : d));
            expectDispatched(await g.dispatch(ok), ok, cfg);
        });
    });

    test('a buffer.bytes below sizeHint: dispatch is EINVAL pointing at sizeHint, and the ranks stay ready', async () => {
        const big: MoeConfig = { worldSize: 2, hidden: 2048, topk: 2, numExperts: 4 };
        await withGroup({ ranks: 2, buffer: buffer(big, 512, { bytes: 4 << 20 }) }, async (g) => {
            const inputs = randomInputs(25, big, () => 4);
            const err = (await g.dispatch(inputs).catch((e: unknown) => e)) as RankflowError;
            expect(err.code).toBe('EINVAL');
            expect(err.message).toMatch(/dispatch needs a buffer of \d+ bytes .*\(use sizeHint\(\)/);
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
        });
    });

    test('numExperts not divisible by the world size: createGroup fails with EINVAL', async () => {
        const err = (await createGroup({ ranks: 3, backend: 'host', buffer: { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 8 } })
            .catch((e: unknown) => e)) as RankflowError;
        expect(err.code).toBe('EINVAL');
        expect(err.message).toMatch(/buffer\.numExperts.*\(8\) must be divisible by the world size \(3\)/);
    });
});

describe('dispatch: notify counters, CPU sync and phases', () => {
    const cfg: MoeConfig = { worldSize: 3, hidden: 128, topk: 4, numExperts: 6 };

    /** Rank r's workspace slot at `offset` (one 64-byte slot per peer): its sequence number and payload words. */
    async function slot(g: Group, r: number, offset: number): Promise<{ seq: number; payload: number }> {
        const bytes = await g.readWindow(r, offset, 16);
        const v = new DataView(bytes.buffer, bytes.byteOffset, 16);
        return { seq: Number(v.getBigUint64(0, true)), payload: Number(v.getBigUint64(8, true)) };
    }

    test('notify writes each count with the op seq into each receiver: per source rank, and per source and local expert', async () => {
        const inputs = randomInputs(30, cfg, (r) => 10 + r);
        const layout = loadAddon().layout(buffer(cfg), 3).workspace;
        await withGroup({ ranks: 3, buffer: buffer(cfg) }, async (g) => {
            await g.dispatch(inputs);
            for (let r = 0; r < 3; r++) {
                const seq = (await g.info(r)).seq; // the dispatch was the last collective
                const got = referenceDispatch(inputs, cfg, r);
                for (let p = 0; p < 3; p++) {
                    const fromP = got.srcRank.filter((s) => s === p).length;
                    expect(await slot(g, r, layout.rankCount + p * layout.slotBytes), `rank ${r} rank_count[${p}]`).toEqual({ seq, payload: fromP });
                    for (let e = 0; e < 2; e++) {
                        let n = 0;
                        got.srcRank.forEach((s, i) => { if (s === p && [0, 1, 2, 3].some((k) => got.topkIdx[i * 4 + k] === e)) n++; });
                        const at = layout.expertCount + (p * 2 + e) * layout.slotBytes;
                        expect(await slot(g, r, at), `rank ${r} expert_count[${p}][${e}]`).toEqual({ seq, payload: n });
                    }
                }
            }
        });
    });

    test('every rank goes into dispatching and out of it once, the record naming its phases notify, cpuSync, data', async () => {
        const inputs = randomInputs(31, cfg, () => 6);
        await withGroup({ ranks: 3, buffer: buffer(cfg) }, async (g) => {
            const seen: TransitionEvent[] = [];
            g.on('transition', (t) => seen.push(t));
            await g.dispatch(inputs);
            for (let r = 0; r < 3; r++) {
                const mine = seen.filter((t) => t.rank === r);
                expect(mine[0]).toMatchObject({ from: 'ready', to: 'dispatching.running', op: 'dispatch' });
                // the CPU-sync wait is a state only while it happens (a peer that was slower than the spin)
                expect(mine.slice(1, -1).map((t) => t.to).every((to) => to === 'dispatching.cpuSync')).toBe(true);
                expect(mine[mine.length - 1]).toMatchObject({ to: 'ready', op: 'dispatch', phases: ['notify', 'cpuSync', 'data'] });
            }
        });
    });

    test('CPU sync: a rank whose program returns instead of dispatching: its peers are released from the CPU sync at once, the run rejects with STATE naming it, the group is ready', async () => {
        const inputs = randomInputs(32, cfg, () => 4);
        const g = await createGroup({ ranks: 3, backend: 'host', buffer: buffer(cfg) });
        try {
            const rec = recordTransitions(g);
            const err = (await g.run(program('dispatch-unless.mjs'), { skip: 2, inputs }).catch((e: unknown) => e)) as RankflowError;
            expect(err).toMatchObject({ code: 'STATE', rank: 2, message: expect.stringMatching(/rank 2's program returned after collective #\d+ while its peers went on/) });
            // each waiting rank was released in its CPU sync (or at the start, when the release came first)
            for (const r of [0, 1]) expect(rec.paths(r).at(-3)).toBe('released');
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready', 'ready']);
            // the group goes on: the same dispatch on every rank is exact
            expectDispatched(await g.dispatch(inputs), inputs, cfg);
        } finally {
            await g.destroy();
        }
        expect(g.snapshot().map((s) => s.state)).toEqual(['destroyed', 'destroyed', 'destroyed']);
    });
});

describe('dispatch: cached mode (handle, no topkIdx)', () => {
    const cfg: MoeConfig = { worldSize: 4, hidden: 128, topk: 4, numExperts: 8 };

    test('gives the same output as the dispatch that made the handle, weights included', async () => {
        const inputs = randomInputs(40, cfg, (r) => 8 + 2 * r);
        await withGroup({ ranks: 4, buffer: buffer(cfg, 32) }, async (g) => {
            const first = await g.dispatch(inputs);
            const again = await g.dispatch(inputs.map((d, r) => ({ x: d.x, handle: first[r]!.handle })));
            again.forEach((o, r) => {
                const { handle: h1, ...a } = first[r]!;
                const { handle: h2, ...b } = o;
                expect(b).toEqual(a);
                expect(h2.numRecv).toBe(h1.numRecv);
                expect(h2.seq).toBeGreaterThan(h1.seq);
            });
        });
    });

    test('with new x and new weights it routes them the old way', async () => {
        const inputs = randomInputs(41, cfg, () => 9);
        const rng = prng(42);
        await withGroup({ ranks: 4, buffer: buffer(cfg, 32) }, async (g) => {
            const first = await g.dispatch(inputs);
            const fresh = inputs.map((d) => ({ ...d, x: randomBf16(rng, 9, 128), topkWeights: randomRouting(rng, 9, cfg, 4).topkWeights }));
            const again = await g.dispatch(fresh.map((d, r) => ({ x: d.x, topkWeights: d.topkWeights, handle: first[r]!.handle })));
            expectDispatched(again, fresh, cfg);
        });
    });

    test('skips the notify counters (they keep the first dispatch seq) and the CPU sync: only its data phase runs', async () => {
        const inputs = randomInputs(43, cfg, () => 5);
        const layout = loadAddon().layout(buffer(cfg), 4).workspace;
        await withGroup({ ranks: 4, buffer: buffer(cfg, 32) }, async (g) => {
            const first = await g.dispatch(inputs);
            const seqFirst = (await g.info(0)).seq;
            const rec = recordTransitions(g);
            await g.dispatch(inputs.map((d, r) => ({ x: d.x, handle: first[r]!.handle })));
            expect((await g.info(0)).seq).toBe(seqFirst + 1);
            for (let p = 0; p < 4; p++) {
                const bytes = await g.readWindow(0, layout.rankCount + p * layout.slotBytes, 8);
                expect(Number(new DataView(bytes.buffer, bytes.byteOffset).getBigUint64(0, true))).toBe(seqFirst);
            }
            for (let r = 0; r < 4; r++) expect(rec.paths(r)).toEqual(['dispatching.running', 'ready']);
            for (let r = 0; r < 4; r++) expect(rec.records(r).at(-1)?.phases).toEqual(['data']);
        });
    });

    test('a handle from another rank is refused with EINVAL before any rank moves', async () => {
        const inputs = randomInputs(44, cfg, () => 5);
        await withGroup({ ranks: 4, buffer: buffer(cfg, 32) }, async (g) => {
            const first = await g.dispatch(inputs);
            const err = (await g.dispatch(inputs.map((d, r) => ({ x: d.x, handle: first[(r + 1) % 4]!.handle }))).catch((e: unknown) => e)) as RankflowError;
            expect(err.code).toBe('EINVAL');
            expect(err.message).toMatch(/inputs\[0\]\.handle: belongs to rank 1, not rank 0/);
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready', 'ready', 'ready']);
        });
    });
});

describe('dispatch: handles in use stay valid', () => {
    const cfg: MoeConfig = { worldSize: 2, hidden: 128, topk: 2, numExperts: 4 };

    test('a handle every step replays lives through 300 dispatches; one left unused expires after 256 newer ones (EINVAL naming it, no rank moves)', async () => {
        const inputs = randomInputs(45, cfg, (r) => 4 + r);
        await withGroup({ ranks: 2, buffer: buffer(cfg, 16) }, async (g) => {
            const layer = await g.dispatch(inputs);
            const unused = await g.dispatch(inputs);
            let last: DispatchResult[] = layer;
            for (let step = 0; step < 300; step++) {
                last = await g.dispatch(inputs.map((d, r) => ({ x: d.x, handle: layer[r]!.handle })));
                await g.combine(last.map((o) => ({ x: o.x, handle: o.handle })));
            }
            expectDispatched(last, inputs, cfg);
            const err = (await g.dispatch(inputs.map((d, r) => ({ x: d.x, handle: unused[r]!.handle }))).catch((e: unknown) => e)) as RankflowError;
            expect(err.code).toBe('EINVAL');
            expect(err.message).toMatch(/inputs\[0\]\.handle: .*expired \(a rank keeps the 256 most recently used handles\)/);
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
        });
    });
});

describe('dispatch: a new handle takes over an expired one', () => {
    const cfg: MoeConfig = { worldSize: 2, hidden: 128, topk: 2, numExperts: 4 };

    // With 256 handles live, a rank moves each new handle into the expiring one's entry and reuses its
    // layout (native/src/runtime/context.cc add_layout). Five routings with different token counts take
    // turns, two handles per step: the handle that expires is ~128 steps old, and 5 divides none of
    // 127-129, so it always had another routing. A reused layout that kept anything of its last handle
    // (counts, rows, routing) gives the wrong rows, counts or sums here.
    test('routings that change every step, past 256 handles, each keep their own rows, counts and combine', async () => {
        const sets = [0, 1, 2, 3, 4].map((s) => randomInputs(46 + s, cfg, (r) => 3 + 2 * s + r));
        await withGroup({ ranks: 2, buffer: buffer(cfg, 16) }, async (g) => {
            let prev: { out: DispatchResult[]; set: number } | undefined;
            for (let step = 0; step < 200; step++) {  // 2 handles per step: every handle after step 127 is a reused one
                const set = step % sets.length;
                const fresh = await g.dispatch(sets[set]!);
                expectDispatched(fresh, sets[set]!, cfg);
                if (prev) {
                    const from = prev.out, inputs = sets[prev.set]!;
                    const cached = await g.dispatch(inputs.map((d, r) => ({ x: d.x, handle: from[r]!.handle })));
                    expectDispatched(cached, inputs, cfg);
                    const x = cached.map((o, r) => tensor('bf16', o.x.shape, expertRows(o.x.data as Uint16Array, r)));
                    const back = await g.combine(cached.map((o, r) => ({ x: x[r]!, handle: o.handle })));
                    const returned = cached.map((o, r) => ({ srcRank: o.srcRank, srcToken: o.srcToken, x: x[r]!.data, topkWeights: o.topkWeights }));
                    back.forEach((b, r) => {
                        const want = referenceCombine(returned, r, inputs[r]!.x.shape[0]!, cfg.hidden, cfg.topk);
                        expect(b.x.data, `step ${step} rank ${r} combined x`).toEqual(want.x);
                        expect(b.topkWeights, `step ${step} rank ${r} combined weights`).toEqual(want.topkWeights);
                    });
                }
                prev = { out: fresh, set };
            }
        });
    });
});

describe('dispatch in a rank program', () => {
    test('rank.dispatch inside the workers gives what driver-mode dispatch gives', async () => {
        const cfg: MoeConfig = { worldSize: 4, hidden: 256, topk: 4, numExperts: 16 };
        const inputs = randomInputs(50, cfg, (r) => 6 + 3 * r);
        await withGroup({ ranks: 4, buffer: buffer(cfg) }, async (g) => {
            const fromProgram = await g.run<{ dispatched: Record<string, unknown> }>(program('moe.mjs'), { inputs });
            const driver = await g.dispatch(inputs);
            fromProgram.forEach((p, r) => {
                const d = driver[r]!;
                expect(p.dispatched).toEqual({
                    x: d.x.data, topkIdx: d.topkIdx, topkWeights: d.topkWeights, srcRank: d.srcRank, srcToken: d.srcToken,
                    tokensPerExpert: d.tokensPerExpert,
                });
            });
        });
    });
});
