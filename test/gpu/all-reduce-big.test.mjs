// allReduce at 2 ranks sharing GPU 0 at sizes where every thread of the W = 2 grid runs several loop
// steps (test/gpu/all-reduce.test.mjs's largest cases run one step at 2 ranks), with odd tails after
// the last whole vector. Device tensors in a rank program (programs/all-reduce.mjs: new, in place,
// captured and replayed), byte for byte against the rank-order sums.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';

import { MiB, cudaGroup, floatToBf16, layouts, range, requireGpu, tensor, bytesOfTensor } from './helpers.mjs';
import { referenceAllReduce } from '../../dist/test/helpers/agrs-reference.js';

const BUFFER = { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 12, bytes: 40 * MiB };  // allReduce stages 2 x its bytes: 2 x 16.8 MB at most here
const program = new URL('./programs/all-reduce.mjs', import.meta.url);

before(() => requireGpu());

function inputs(W, dtype, n, seed) {
  return range(W).map((g) => {
    const v = new Float32Array(n);
    for (let i = 0; i < n; i++) v[i] = Math.fround(Math.sin(i * 12.9898 + g * 78.233 + seed) * 2 ** ((i * 7 + g + seed) % 24));
    return dtype === 'fp32' ? tensor('fp32', [n], v) : tensor('bf16', [n], Uint16Array.from(v, floatToBf16));
  });
}
const reference = (parts) => Buffer.from(bytesOfTensor(referenceAllReduce(parts)));

// At 2 ranks (66 blocks of 512 threads, 4 vectors each per step: 135168 vectors a step):
// bf16 8388613: 524289 vectors a rank, 3.9 steps; fp32 3000017: 375003 vectors, 2.8 steps; bf16
// 4194311: 262145 vectors, 1.9 steps; and odd tails after the last whole vector.
const CASES = [['bf16', 8_388_613], ['fp32', 3_000_017], ['bf16', 4_194_311]];

for (const layout of layouts([2])) {
  if (layout.distinct) continue;
  describe(`allReduce at larger sizes, ${layout.name}`, () => {
    let gpu;
    before(async () => {
      gpu = await cudaGroup(layout, { buffer: BUFFER });
    });
    after(async () => {
      await gpu?.destroy();
    });
    for (const [dtype, n] of CASES) {
      test(`device tensors in a rank program, ${dtype} x ${n}: new, in place, captured and replayed`, async () => {
        const W = layout.ranks;
        const first = inputs(W, dtype, n, 1);
        const replays = [inputs(W, dtype, n, 2)];
        const answers = await gpu.run(program, { inputs: first, replays });
        const want = reference(first);
        const w2 = reference(replays[0]);
        for (const [r, a] of answers.entries()) {
          assert.ok(Buffer.from(a.out).equals(want), `rank ${r}: allReduce into a new tensor`);
          assert.ok(Buffer.from(a.inPlace).equals(want), `rank ${r}: allReduce in place`);
          assert.ok(Buffer.from(a.replayed[0]).equals(w2), `rank ${r}: replay`);
          assert.ok(Buffer.from(a.inPlaceReplayed[0]).equals(w2), `rank ${r}: in-place replay`);
        }
      });
    }
  });
}
