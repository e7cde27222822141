/**
 * AGRS stress on the host backend: seeded random interleavings of openSession / allGather /
 * reduceScatter / close inside sessions and barrier / dispatch + combine / allGather / ppExchange
 * outside them, on 2..8 ranks. Every result is checked exactly against the plain references, the
 * session limit (maxAllGathers) is hit on purpose now and then, and every rank ends where the
 * sequence says (ready or session.open). Bounded: a fixed number of steps per world size.
 */
import { describe, expect, test } from 'vitest';
import { type Group, type RankflowError, type Session, type Tensor } from '../actors/index.js';
import { withGroup } from './helpers/group.js';
import { randomTensor, referenceAllGather, referenceReduceScatter } from './helpers/agrs-reference.js';
import {
    expertRows, prng, randInt, randomDispatchInput, referenceCombine, referenceDispatch, type MoeConfig,
} from './helpers/moe-reference.js';
import { tensor } from '../actors/index.js';

const STEPS = 50;

async function runSequence(g: Group, seed: number, log: string[]): Promise<void> {
    const W = g.size;
    const rng = prng(seed);
    const cfg: MoeConfig = { worldSize: W, hidden: g.buffer.hidden, topk: g.buffer.topk, numExperts: g.buffer.numExperts };
    let session: Session | null = null;
    let used = 0;
    let limit = 0;
    for (let step = 0; step < STEPS; step++) {
        const pick = rng();
        if (session) {
            if (pick < 0.35) {
                const dtype = (['fp32', 'bf16', 'int32'] as const)[randInt(rng, 3)]!;
                const shape = [1 + randInt(rng, 4), 1 + randInt(rng, 8)];
                const inputs = Array.from({ length: W }, () => randomTensor(rng, dtype, shape));
                log.push(`allGather ${dtype} [${inputs[0]!.shape}]`);
                if (used === limit) {
                    expect(((await session.allGather(inputs).catch((e: unknown) => e)) as RankflowError).code).toBe('EINVAL');
                } else {
                    used++;
                    const want = referenceAllGather(inputs);
                    expect(await session.allGather(inputs)).toEqual(Array.from({ length: W }, () => want));
                }
            } else if (pick < 0.7) {
                const dtype = (['fp32', 'bf16'] as const)[randInt(rng, 2)]!;
                const shape = [W * (1 + randInt(rng, 3)), 1 + randInt(rng, 6)];
                const inputs = Array.from({ length: W }, () => randomTensor(rng, dtype, shape) as Tensor<'fp32' | 'bf16'>);
                log.push(`reduceScatter ${dtype} [${inputs[0]!.shape}]`);
                if (used === limit) {
                    expect(((await session.reduceScatter(inputs).catch((e: unknown) => e)) as RankflowError).code).toBe('EINVAL');
                } else {
                    used++;
                    const out = await session.reduceScatter(inputs);
                    out.forEach((o, r) => expect(o).toEqual(referenceReduceScatter(inputs, r)));
                }
            } else {
                log.push('close');
                await session.close();
                session = null;
            }
            expect(g.snapshot().map((s) => s.state)).toEqual(Array.from({ length: W }, () => (session ? 'session.open' : 'ready')));
            continue;
        }
        if (pick < 0.3) {
            limit = 1 + randInt(rng, 4);
            used = 0;
            log.push(`open maxAllGathers=${limit}`);
            session = await g.openSession({ maxBytes: 512, maxAllGathers: limit });
        } else if (pick < 0.45) {
            const withCpuSync = rng() < 0.5;
            log.push(`barrier ${withCpuSync ? 'with' : 'without'} CPU sync`);
            await g.barrier({ withCpuSync });
        } else if (pick < 0.7) {
            const inputs = Array.from({ length: W }, () => randomDispatchInput(rng, randInt(rng, g.buffer.maxTokensPerRank + 1), cfg));
            log.push(`dispatch + combine [${inputs.map((d) => d.x.shape[0])}]`);
            const out = await g.dispatch(inputs);
            out.forEach((o, r) => {
                const want = referenceDispatch(inputs, cfg, r);
                expect(o.srcRank).toEqual(want.srcRank);
                expect(o.srcToken).toEqual(want.srcToken);
                expect(o.x.data).toEqual(want.x);
                expect(o.topkIdx).toEqual(want.topkIdx);
            });
            const x = out.map((o, r) => tensor('bf16', o.x.shape, expertRows(o.x.data as Uint16Array, r)));
            const back = await g.combine(out.map((o, r) => ({ x: x[r]!, handle: o.handle })));
            const returned = out.map((o, r) => ({ srcRank: o.srcRank, srcToken: o.srcToken, x: x[r]!.data, topkWeights: o.topkWeights }));
            back.forEach((b, r) => expect(b.x.data).toEqual(referenceCombine(returned, r, inputs[r]!.x.shape[0]!, cfg.hidden, cfg.topk).x));
        } else if (pick < 0.85) {
            const n = 1 + randInt(rng, 16);
            const inputs = Array.from({ length: W }, () => randomTensor(rng, 'int32', [n]));
            log.push(`allGather (outside) [${n}]`);
            const want = referenceAllGather(inputs);
            expect(await g.allGather(inputs)).toEqual(Array.from({ length: W }, () => want));
        } else {
            const inputs = Array.from({ length: W }, () => randomTensor(rng, 'fp32', [5]));
            log.push('ppExchange');
            const out = await g.ppExchange(inputs);
            out.forEach((o, r) => expect(o).toEqual(inputs[(r - 1 + W) % W]));
        }
        expect(g.snapshot().map((s) => s.state)).toEqual(Array.from({ length: W }, () => (session ? 'session.open' : 'ready')));
    }
    if (session) await session.close();
}

describe('AGRS stress: random interleavings checked against references', () => {
    test.each([2, 3, 4, 5, 6, 7, 8])('%i ranks, seeded sequence', async (W) => {
        const log: string[] = [];
        await withGroup({ ranks: W, buffer: { maxTokensPerRank: 12, hidden: 64, topk: 3, numExperts: 3 * W } }, async (g) => {
            try {
                await runSequence(g, 1000 + W, log);
            } catch (e) {
                throw new Error(`step ${log.length}: ${log.at(-1)} failed (sequence so far: ${log.join('; ')}): ${String(e)}`, { cause: e });
            }
        });
    });
});
