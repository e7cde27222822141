// AGRS with the data kept in the symmetric buffer, and async session collectives and engram fetches,
// on cuda (2 and 4 ranks sharing GPU 0, and one rank per GPU where there are two): session tensors
// and results are device views whose addresses lie in the rank's window (an in-place allGather's
// result region holds the tensor itself as the rank's slot: zero copy); every result equals the plain
// reference computed here and, byte for byte, a host group running the same program. Sizes cover
// the peer-pointer kernels (16-byte multiples) and the copy engines (sizes that are not).
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';

import { cudaAndHost, engramSizeHint, layouts, MiB, range, requireGpu, tensor, toBf16 } from './helpers.mjs';
import { randomTensor, referenceAllGather, referenceReduceScatter } from '../../dist/test/helpers/agrs-reference.js';
import { prng, randInt } from '../../dist/test/helpers/moe-reference.js';

before(() => requireGpu());

const ENGRAM = { entries: 2048, hidden: 128 };
const BUFFER = {
  maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 4, bytes: 160 * MiB,
  cpuBytes: engramSizeHint({ entriesPerRank: ENGRAM.entries, hidden: ENGRAM.hidden }),
};
const bytesOf = (t) => Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);

function sameTensor(got, want, what) {
  assert.equal(got.dtype, want.dtype, `${what}: dtype`);
  assert.deepEqual(got.shape, want.shape, `${what}: shape`);
  assert.ok(bytesOf(got).equals(bytesOf(want)), `${what}: bytes differ`);
}

function cases(W, seed) {
  const rng = prng(seed);
  const ag = (dtype, shape, inPlace, async) => ({ op: 'ag', inPlace, async, inputs: range(W).map(() => randomTensor(rng, dtype, shape)) });
  const rs = (dtype, shape, inPlace, async) => ({ op: 'rs', inPlace, async, inputs: range(W).map(() => randomTensor(rng, dtype, shape)) });
  return [
    ag('bf16', [256, 128], true, true),         // 64 KiB per rank: peer-pointer kernel
    ag('fp32', [3, 5], true, true),             // 60 bytes: not a 16-byte multiple -> copy engine
    ag('int32', [300_001], true, false),        // ~1.2 MiB, unaligned -> copy engine; sync in place: a view
    ag('fp32', [1024], false, true),            // a device tensor of its own, copied in
    rs('fp32', [W * 4096], true, true),
    rs('bf16', [W * 1001], true, true),         // n % 8 != 0: the scalar reduce
    rs('bf16', [W * 65_536], false, true),
    rs('fp32', [W * 16, 3], false, false),      // ordinary and sync: copied out as before
    ag('bf16', [1], true, true),
  ];
}

const reference = (c, r) => (c.op === 'ag' ? referenceAllGather(c.inputs) : referenceReduceScatter(c.inputs, r));

for (const layout of layouts([2, 4])) {
  const W = layout.ranks;
  describe(`AGRS views and async ops on cuda: ${layout.name}`, () => {
    let gpu, host;
    cudaAndHost(layout, BUFFER, (c, h) => ((gpu = c), (host = h)));

    test('session tensors and results lie in the rank\'s window (in place: the tensor is its slot); results equal the reference and the host group', async () => {
      const cs = cases(W, 40 + W);
      const args = { cases: cs, maxBytes: 2 * MiB, maxAllGathers: 2 * cs.length, order: range(cs.length).reverse() };
      const [got, oracle] = await Promise.all([gpu.run(new URL('./programs/agrs-views.mjs', import.meta.url), args), host.run(new URL('./programs/agrs-views.mjs', import.meta.url), args)]);
      for (const r of range(W)) {
        const bad = got[r].checks.filter((c) => !c.ok);
        assert.deepEqual(bad, [], `rank ${r}: zero-copy checks (${got[r].checks.length} made)`);
        assert.ok(got[r].checks.some((c) => c.what === 'slot'), `rank ${r}: the slot check ran`);
        assert.equal(got[r].revoked, true, `rank ${r}: views refuse their address after close (STATE)`);
        assert.equal(got[r].end, 'ready');
        cs.forEach((c, i) => {
          const what = `rank ${r} case ${i} (${c.op}${c.inPlace ? ' in place' : ''}${c.async ? ' async' : ''})`;
          sameTensor(got[r].out[i], reference(c, r), `${what} vs reference`);
          sameTensor(got[r].out[i], oracle[r].out[i], `${what} vs host group`);
        });
      }
    });

    test('two engram fetches in flight across a barrier: engram.fetching meanwhile, device rows equal the reference', async () => {
      const rng = prng(70 + W);
      const { entries, hidden } = ENGRAM;
      const tables = range(W).map(() => tensor('bf16', [entries, hidden], toBf16(Array.from({ length: entries * hidden }, () => randInt(rng, 1 << 12) / 16 - 100))));
      const ids = range(W).map(() => [0, 1].map((k) => Int32Array.from({ length: 3000 + 77 * k }, () => randInt(rng, W * entries))));
      const res = await gpu.run(new URL('./programs/engram-async.mjs', import.meta.url), { tables, ids });
      for (const r of range(W)) {
        assert.equal(res[r].device, true, `rank ${r}: rows in a device tensor`);
        assert.equal(res[r].during, 'engram.fetching');
        assert.equal(res[r].after, 'ready');
        for (const [k, name] of [[0, 'a'], [1, 'b']]) {
          const want = new Uint16Array(ids[r][k].length * hidden);
          ids[r][k].forEach((g, i) => want.set(tables[Math.floor(g / entries)].data.subarray((g % entries) * hidden, (g % entries + 1) * hidden), i * hidden));
          sameTensor(res[r][name], tensor('bf16', [ids[r][k].length, hidden], want), `rank ${r} fetch ${name}`);
        }
      }
    });
  });
}
