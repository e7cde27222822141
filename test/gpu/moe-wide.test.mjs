// Rows of the issue-36 bench's width (hidden 7168): the kernels' paths for rows of many 32-vector
// groups (rf_combine_local's group ranges, the data kernel's steps) and fp8 scales of 16-byte vectors
// (56 per token: the data kernel copies them with the row), each op bit for bit against the host group
// given the same inputs (driver mode). Fresh and cached dispatch, bf16 and fp8; combine with 0 and 1
// biases, with and without weights; 1, 2 and 4 ranks sharing GPU 0. And at 1 rank a combine of rows
// of the values 0 + b does not give back as b (-0, NaN) among those it does (inf, subnormals), against
// a reference computed here: rf_combine_local stores the rows that hold neither as they came.
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';

import { createGroup, cudaAndHost, layouts, requireGpu, tensor } from './helpers.mjs';
import { MOE_BUFFER, biasInput, combineInput, lcg, moeInput } from './moe-inputs.mjs';

// This file's own process: moe-inputs reads the shape from MOE_BUFFER when called.
Object.assign(MOE_BUFFER, { hidden: 7168, maxTokensPerRank: 160, bytes: 256 << 20 });
const { hidden } = MOE_BUFFER;

before(() => requireGpu());

const bytes = (a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
const same = (got, want, what) => {
  assert.equal(got.length, want.length, `${what}: length`);
  assert.ok(bytes(got).equals(bytes(want)), `${what}: bytes differ`);
};
const TOKENS = { 1: [150], 2: [150, 77], 4: [150, 77, 0, 129] };

function inputs(seed, tokens, fp8) {
  return tokens.map((T, r) => {
    const i = moeInput(seed, r, T, { fp8 });
    return {
      x: tensor(fp8 ? 'fp8e4m3' : 'bf16', [T, hidden], i.x),
      ...(fp8 ? { scales: tensor('fp32', [T, hidden / 128], i.scales) } : {}),
      topkIdx: i.topkIdx,
      topkWeights: i.topkWeights,
    };
  });
}

function sameDispatch(got, want, label) {
  want.forEach((w, r) => {
    const g = got[r];
    const at = `${label}, rank ${r}`;
    assert.deepEqual(g.x.shape, w.x.shape, `${at}: x.shape`);
    same(g.x.data, w.x.data, `${at}: x`);
    if (w.scales) same(g.scales.data, w.scales.data, `${at}: scales`);
    same(g.topkIdx, w.topkIdx, `${at}: topkIdx`);
    same(g.topkWeights, w.topkWeights, `${at}: topkWeights`);
    same(g.srcRank, w.srcRank, `${at}: srcRank`);
    same(g.srcToken, w.srcToken, `${at}: srcToken`);
  });
}

for (const layout of layouts([1, 2, 4])) {
  const W = layout.ranks;
  const tokens = TOKENS[W];
  describe(`hidden ${hidden}: dispatch and combine on cuda equal the host executor: ${layout.name}`, () => {
    let cuda;
    let host;
    cudaAndHost(layout, MOE_BUFFER, (c, h) => ((cuda = c), (host = h)));

    for (const fp8 of [false, true]) {
      test(`${fp8 ? 'fp8 + scales' : 'bf16'}: dispatch, cached dispatch, combine`, async () => {
        const seed = fp8 ? 7 : 3;
        const ins = inputs(seed, tokens, fp8);
        const [c, h] = [await cuda.dispatch(ins), await host.dispatch(ins)];
        sameDispatch(c, h, 'fresh');
        assert.ok(c.some((d) => d.x.shape[0] > 0));
        const again = (res) => tokens.map((T, r) => {
          const i = moeInput(seed + 100, r, T, { fp8 });
          return { x: tensor(fp8 ? 'fp8e4m3' : 'bf16', [T, hidden], i.x), ...(fp8 ? { scales: tensor('fp32', [T, hidden / 128], i.scales) } : {}), handle: res[r].handle };
        });
        const [ck, hk] = [await cuda.dispatch(again(c)), await host.dispatch(again(h))];
        sameDispatch(ck, hk, 'cached');
        for (const biases of [0, 1])
          for (const weights of [true, false]) {
            const mk = (res) => res.map((d, r) => {
              const ci = combineInput(seed + biases, r, d.x.shape[0]);
              const T = d.handle.numTokens;
              return {
                x: tensor('bf16', [d.x.shape[0], hidden], ci.x),
                handle: d.handle,
                ...(weights ? { topkWeights: ci.w } : {}),
                ...(biases ? { bias: [tensor('bf16', [T, hidden], biasInput(seed, r, T))] } : {}),
              };
            });
            const [gc, gh] = [await cuda.combine(mk(ck)), await host.combine(mk(hk))];
            gh.forEach((w, r) => {
              same(gc[r].x.data, w.x.data, `${biases} biases, weights ${weights}: combine x, rank ${r}`);
              same(gc[r].topkWeights, w.topkWeights, `${biases} biases, weights ${weights}: combine weights, rank ${r}`);
            });
          }
      });
    }
  });
}

// bf16 bits: -0, +0, +-inf, the smallest subnormals, the largest finite, NaNs (quiet, signed, signalling).
const SPECIAL = [0x8000, 0x0000, 0x7f80, 0xff80, 0x0001, 0x807f, 0x7f7f, 0x7fc0, 0xffc1, 0x7f81];
const isNaN16 = (h) => (h & 0x7fff) > 0x7f80;

/** Rows of ordinary values with one element in 16 special (at random lanes), and one row all -0. */
function specialRows(rows) {
  const rng = lcg(4242);
  const x = new Uint16Array(rows * hidden);
  for (let i = 0; i < x.length; i++)
    x[i] = rng() < 1 / 16 ? SPECIAL[Math.floor(rng() * SPECIAL.length)] : (Math.floor(rng() * 0x3e00) + 0x0100) | (rng() < 0.5 ? 0x8000 : 0);
  if (rows > 3) x.fill(0x8000, 3 * hidden, 4 * hidden);
  return x;
}

test('1 rank, no bias: combine gives each token 0 + its row rounded, -0 as +0 and NaN as NaN, on cuda and host', async () => {
  const T = 150;
  const ins = inputs(11, [T], false);
  const groups = [];
  try {
    for (const backend of ['cuda', 'host']) groups.push(await createGroup({ backend, ranks: 1, ...(backend === 'cuda' ? { devices: [0] } : {}), buffer: MOE_BUFFER }));
    for (const g of groups) {
      const [d] = await g.dispatch(ins);
      const rows = d.x.shape[0];
      const x = specialRows(rows);
      const [c] = await g.combine([{ x: tensor('bf16', [rows, hidden], x), handle: d.handle }]);
      const want = new Uint16Array(T * hidden);  // a token that came to no rank: zeros
      for (let j = 0; j < rows; j++)
        for (let i = 0; i < hidden; i++) {
          const h = x[j * hidden + i];
          want[d.srcToken[j] * hidden + i] = h === 0x8000 ? 0 : h;
        }
      const got = c.x.data;
      let nans = 0;
      for (let i = 0; i < want.length; i++) {
        if (isNaN16(want[i])) {
          nans++;
          assert.ok(isNaN16(got[i]), `${g.backend}: element ${i}: NaN 0x${want[i].toString(16)} became 0x${got[i].toString(16)}`);
        } else assert.equal(got[i], want[i], `${g.backend}: element ${i} (token ${Math.floor(i / hidden)})`);
      }
      assert.ok(nans > 1000 && rows > 3, `the data has NaNs (${nans}) and the all -0 row`);
    }
  } finally {
    for (const g of groups) await g.destroy();
  }
});
