// allReduce on cuda, 2, 3 and 4 ranks sharing GPU 0 (the kernel keeps 2 x 4 loads in flight at 2
// ranks, 4 x 2 from 3: kernels/session.cu), byte for byte against a host group given the same
// inputs (the host executor: the same rank order and fp32 accumulation) and against the sums computed
// plainly (test/helpers/agrs-reference.ts). The data cancel (2^30 and -2^30 on two ranks, small values the partial sums swallow),
// so a sum in another order differs. Driver mode stages host tensors through the window; rank
// programs' device tensors are read and written where they lie, in place too, and captured in a graph.
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';

import { bytesOfTensor, cudaAndHost, floatToBf16, layouts, MiB, range, requireGpu, tensor } from './helpers.mjs';
import { referenceAllReduce } from '../../dist/test/helpers/agrs-reference.js';

// 12 experts: a whole number per rank at 2, 3 and 4 ranks.
const BUFFER = { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 12, bytes: 16 * MiB };
const program = new URL('./programs/all-reduce.mjs', import.meta.url);

before(() => requireGpu());

/** Rank g's n values of W ranks: every third element cancels between ranks k, k + 1; the rest vary by seed. */
function inputs(W, dtype, n, seed) {
  return range(W).map((g) => {
    const v = Array.from({ length: n }, (_, i) => {
      if (i % 3 === 0 && W > 2) {
        const k = (i / 3) % (W - 1);
        return g === k ? 2 ** 30 : g === k + 1 ? -(2 ** 30) : g + 1;
      }
      return Math.fround(Math.sin(i * 12.9898 + g * 78.233 + seed) * 2 ** ((i * 7 + g + seed) % 24));
    });
    return dtype === 'fp32' ? tensor('fp32', [n], Float32Array.from(v)) : tensor('bf16', [n], Uint16Array.from(v, floatToBf16));
  });
}

/** The rank-order sums, as bytes. */
const reference = (parts) => Buffer.from(bytesOfTensor(referenceAllReduce(parts)));

const CASES = [['fp32', 37], ['fp32', 4099], ['fp32', 300_001], ['bf16', 5], ['bf16', 65_536], ['bf16', 1_000_003]];

for (const layout of layouts([2, 3, 4])) {
  const W = layout.ranks;
  describe(`allReduce, ${layout.name}`, () => {
    let gpu, host;
    cudaAndHost(layout, BUFFER, (c, h) => ((gpu = c), (host = h)));

    for (const [dtype, n] of CASES) {
      test(`driver mode, ${dtype} x ${n}: the host group's bytes and the plain sums on every rank`, async () => {
        const parts = inputs(W, dtype, n, n);
        const want = reference(parts);
        const got = await gpu.allReduce(parts);
        const oracle = await host.allReduce(parts);
        for (let r = 0; r < W; r++) {
          assert.ok(Buffer.from(bytesOfTensor(got[r])).equals(want), `rank ${r}: not the rank-order sums`);
          assert.ok(Buffer.from(bytesOfTensor(oracle[r])).equals(want), `host rank ${r}: not the rank-order sums`);
        }
      });
    }

    for (const [dtype, n] of [['fp32', 4099], ['bf16', 1_000_003]]) {
      test(`device tensors in a rank program, ${dtype} x ${n}: new, in place, and captured then replayed with new inputs`, async () => {
        const first = inputs(W, dtype, n, 1);
        const replays = [inputs(W, dtype, n, 2), inputs(W, dtype, n, 3), inputs(W, dtype, n, 4)];
        const answers = await gpu.run(program, { inputs: first, replays });
        const want = reference(first);
        for (const [r, a] of answers.entries()) {
          assert.ok(Buffer.from(a.out).equals(want), `rank ${r}: allReduce into a new tensor`);
          assert.ok(Buffer.from(a.inPlace).equals(want), `rank ${r}: allReduce in place`);
          assert.equal(a.same, true, 'in place returns the input tensor');
          assert.equal(a.ops, 2, 'the graph holds both captured allReduces');
          replays.forEach((next, k) => {
            const w = reference(next);
            assert.ok(Buffer.from(a.replayed[k]).equals(w), `rank ${r}: replay ${k}`);
            assert.ok(Buffer.from(a.inPlaceReplayed[k]).equals(w), `rank ${r}: in-place replay ${k}`);
          });
        }
      });
    }

    test('a rank passing another length: EINVAL on every rank (found on the GPU), then the next allReduce is right', async () => {
      const parts = inputs(W, 'fp32', 64, 9);
      const programs = new URL('../fixtures/programs/all-reduce.mjs', import.meta.url);
      const answers = await gpu.run(programs, { inputs: parts, refuse: { rank: 1, n: 60 } });
      const want = reference(parts);
      for (const [r, a] of answers.entries()) {
        assert.equal(a.error?.code, 'EINVAL', `rank ${r}: ${JSON.stringify(a.error)}`);
        assert.match(a.error.message, /^input: rank \d+ reduces another element count or dtype than rank \d+/);
        assert.ok(Buffer.from(new Float32Array(a.after).buffer).equals(want), `rank ${r}: the allReduce after`);
        assert.equal(a.state, 'ready');
      }
    });
  });
}
