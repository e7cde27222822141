// allReduce (API.md "All-reduce") on the host backend, in driver mode and in rank programs, against a
// reference summed plainly (test/helpers/agrs-reference.ts): rank order, fp32 accumulation
// (Math.fround after every add: exact for fp32, since double has more than twice float's precision),
// bf16 rounded to nearest even at the end. The data cancel (big values and the small ones they swallow), so a sum in any other order,
// or a slice summed twice, comes out different; every rank must get the same bits. Across simulated
// nodes, test/scaleout.test.ts runs it (runAgrsCases) against a one-node group.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { createGroup, floatToBf16, tensor, type Group, type Tensor } from '../actors/index.js';
import { referenceAllReduce } from './helpers/agrs-reference.js';
import type { TransitionEvent } from '../workers/protocol.js';
import { prng } from './helpers/moe-reference.js';

const BUFFER = { maxTokensPerRank: 4, hidden: 128, topk: 2, numExperts: 12, bytes: 4 << 20 };
const program = new URL('./fixtures/programs/all-reduce.mjs', import.meta.url);

/**
 * Rank g's n values (of W ranks). Every third element cancels: ranks k and k + 1 (k cycling) hold
 * 2^30 and -2^30, the others g + 1, which a partial sum of 2^30 swallows (half its ulp is 64): in rank
 * order only the small values after the pair survive, in reverse order only those before it. The rest
 * are random, of any magnitude.
 */
function values(g: number, n: number, seed: number, W: number): number[] {
  const rng = prng(seed * 131 + g);
  return Array.from({ length: n }, (_, i) => {
    if (i % 3 !== 0 || W < 3) return Math.fround((rng() - 0.5) * 2 ** Math.floor(rng() * 24));
    const k = (i / 3) % (W - 1);
    return g === k ? 2 ** 30 : g === k + 1 ? -(2 ** 30) : g + 1;
  });
}

type Part = Tensor<'fp32' | 'bf16'>;
function inputsOf(W: number, n: number, dtype: 'fp32' | 'bf16', seed: number): Part[] {
  return Array.from({ length: W }, (_, g) => {
    const v = values(g, n, seed, W);
    return dtype === 'fp32' ? tensor('fp32', [n], Float32Array.from(v)) : tensor('bf16', [n], Uint16Array.from(v, floatToBf16));
  });
}

/** The sums in the order `ranks` gives (rank order for the reference), as plain numbers (bf16: bits). */
const sums = (parts: Part[], ranks: number[]): number[] => Array.from(referenceAllReduce(parts, ranks).data);
const rankOrder = (W: number): number[] => Array.from({ length: W }, (_, q) => q);

describe.each([2, 3, 4])('allReduce in driver mode, %i ranks on host', (W) => {
  let group: Group;
  beforeAll(async () => {
    group = await createGroup({ ranks: W, backend: 'host', buffer: BUFFER });
  });
  afterAll(() => group.destroy());

  it.each([
    ['fp32', 37], ['fp32', 4099], ['bf16', 5], ['bf16', 20_011], ['fp32', 0],
  ] as const)('%s, %i elements: every rank gets the rank-order sums, bit for bit', async (dtype, n) => {
    const parts = inputsOf(W, n, dtype, n);
    const want = sums(parts, rankOrder(W));
    if (n > 8 && W > 2) expect(sums(parts, rankOrder(W).reverse())).not.toEqual(want);  // the data expose the order (two addends commute)
    const got = await group.allReduce(parts, { op: 'sum' });
    expect(got).toHaveLength(W);
    for (const t of got) {
      expect(t).toMatchObject({ dtype, shape: [n] });
      expect(Array.from(t.data)).toEqual(want);
    }
    expect(group.snapshot().map((s) => s.state)).toEqual(Array(W).fill('ready'));
  });

  it('keeps a multi-dimensional shape', async () => {
    const parts = inputsOf(W, 24, 'fp32', 7).map((t): Part => ({ ...t, shape: [2, 3, 4] }));
    const got = await group.allReduce(parts);
    for (const t of got) expect(t.shape).toEqual([2, 3, 4]);
    expect(Array.from(got[W - 1]!.data)).toEqual(sums(parts, rankOrder(W)));
  });

  it('refuses unequal shapes, other dtypes and other reductions with EINVAL naming them, and stays ready', async () => {
    const parts = inputsOf(W, 16, 'fp32', 1);
    const short: Part[] = [...parts.slice(0, W - 1), tensor('fp32', [15], parts[W - 1]!.data.slice(0, 15) as Float32Array)];
    await expect(group.allReduce(short)).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(new RegExp(`^parts\\[${W - 1}\\]\\.shape: is \\[15\\] but rank 0 has \\[16\\]`)) });
    const mixed = [...parts.slice(0, W - 1), inputsOf(W, 16, 'bf16', 1)[W - 1]!];
    await expect(group.allReduce(mixed)).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/\.dtype: is bf16 but rank 0 has fp32/) });
    const ints = parts.map(() => tensor('int32', [4], new Int32Array(4)));
    await expect(group.allReduce(ints as never)).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^parts\[0\]\.dtype: must be .*fp32.*bf16/) });
    await expect(group.allReduce(parts, { op: 'max' as 'sum' })).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^op: must be 'sum'/) });
    await expect(group.allReduce(parts, { opp: 'sum' } as never)).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^options\.opp: is not an option/) });
    await expect(group.allReduce(parts.slice(1))).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^parts: has \d+ entries/) });
    expect(group.snapshot().map((s) => s.state)).toEqual(Array(W).fill('ready'));
    expect(Array.from((await group.allReduce(parts))[0]!.data)).toEqual(sums(parts, rankOrder(W)));
  });

  it('refuses a part larger than the buffer allows with EINVAL naming buffer.bytes', async () => {
    const n = 2 ** 20;  // 4 MiB of fp32: the staged input and the sums need twice that
    const parts: Part[] = Array.from({ length: W }, () => tensor('fp32', [n], new Float32Array(n)));
    await expect(group.allReduce(parts)).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^allReduce of 4194304 bytes per rank needs \d+ buffer bytes; the buffer has \d+ \(raise buffer\.bytes\)/) });
    await group.barrier();
  });

  it('shows the op as a transition through allReducing, one seq on every rank', async () => {
    const seen: TransitionEvent[] = [];
    const listener = (t: TransitionEvent): void => void seen.push(t);
    group.on('transition', listener);
    await group.allReduce(inputsOf(W, 8, 'fp32', 3));
    group.off('transition', listener);
    for (let r = 0; r < W; r++) {
      const mine = seen.filter((t) => t.rank === r);
      expect(mine.map((t) => [t.from, t.to, t.op])).toEqual([['ready', 'allReducing', 'allReduce'], ['allReducing', 'ready', 'allReduce']]);
    }
    expect(new Set(seen.map((t) => t.seq)).size).toBe(1);
  });
});

describe.each([2, 4])('rank.allReduce in rank programs, %i ranks on host', (W) => {
  let group: Group;
  beforeAll(async () => {
    group = await createGroup({ ranks: W, backend: 'host', buffer: BUFFER });
  });
  afterAll(() => group.destroy());

  it.each([['fp32', 1001], ['bf16', 4096]] as const)('%s, %i elements: a new tensor and in place, the same bits on every rank', async (dtype, n) => {
    const inputs = inputsOf(W, n, dtype, 11);
    const want = sums(inputs, rankOrder(W));
    const answers = await group.run<{ out: number[]; inPlace: number[]; same: boolean }>(program, { inputs });
    for (const a of answers) expect(a).toEqual({ out: want, inPlace: want, same: true });
  });

  it('a rank passing another length: EINVAL on every rank naming it, nothing moved, and the next allReduce is right', async () => {
    const inputs = inputsOf(W, 64, 'fp32', 5);
    const answers = await group.run<{ error?: { code: string; message: string }; after: number[]; state: string }>(program, { inputs, refuse: { rank: 1, n: 60 } });
    answers.forEach((a, r) => {
      const other = r === 1 ? '\\d+' : '1';
      expect(a.error, `rank ${r}`).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(new RegExp(`^input: rank ${other} reduces another element count or dtype than rank ${r}`)) });
      expect(a.after).toEqual(sums(inputs, rankOrder(W)));
      expect(a.state).toBe('ready');
    });
  });
});
