// Dispatch and combine on the CUDA backend (2 GPUs), each case compared bit for bit with a host group
// given the same inputs: the host executor is the reference. Driver mode (host tensors staged through
// device memory) and a rank program with device-resident tensors.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';

import { createGroup, requireTwoGpus, tensor } from './helpers.mjs';
import { MOE_BUFFER, biasInput, combineInput, moeInput } from './moe-inputs.mjs';

let cuda;
let host;
before(async () => {
  requireTwoGpus();
  cuda = await createGroup({ backend: 'cuda', ranks: 2, buffer: MOE_BUFFER });
  host = await createGroup({ backend: 'host', ranks: 2, buffer: MOE_BUFFER });
});
after(async () => {
  await cuda?.destroy();
  await host?.destroy();
});

const { hidden, topk } = MOE_BUFFER;
const bytes = (a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
const same = (got, want, what) => {
  assert.equal(got.length, want.length, `${what}: length`);
  assert.ok(bytes(got).equals(bytes(want)), `${what}: bytes differ`);
};

function inputs(seed, tokens, opts = {}) {
  return tokens.map((T, r) => {
    const i = moeInput(seed, r, T, opts);
    return {
      x: tensor(opts.fp8 ? 'fp8e4m3' : 'bf16', [T, hidden], i.x),
      ...(opts.fp8 ? { scales: tensor('fp32', [T, hidden / 128], i.scales) } : {}),
      topkIdx: i.topkIdx,
      topkWeights: i.topkWeights,
      ...(opts.expertAlignment ? { expertAlignment: opts.expertAlignment } : {}),
    };
  });
}

function sameDispatch(got, want, label) {
  want.forEach((w, r) => {
    const g = got[r];
    const at = `${label}, rank ${r}`;
    assert.deepEqual(g.x.shape, w.x.shape, `${at}: x.shape`);
    assert.equal(g.x.dtype, w.x.dtype);
    same(g.x.data, w.x.data, `${at}: x`);
    if (w.scales) same(g.scales.data, w.scales.data, `${at}: scales`);
    else assert.equal(g.scales, undefined);
    same(g.topkIdx, w.topkIdx, `${at}: topkIdx`);
    same(g.topkWeights, w.topkWeights, `${at}: topkWeights`);
    same(g.srcRank, w.srcRank, `${at}: srcRank`);
    same(g.srcToken, w.srcToken, `${at}: srcToken`);
    assert.deepEqual(g.tokensPerExpert, w.tokensPerExpert, `${at}: tokensPerExpert`);
  });
}

/** The same dispatch on both groups; returns [cuda, host] results after checking them equal. */
async function bothDispatch(ins, label) {
  const [c, h] = [await cuda.dispatch(ins), await host.dispatch(ins)];
  sameDispatch(c, h, label);
  return [c, h];
}

async function bothCombine(c, h, seed, { biases = 0, weights = true } = {}, label = '') {
  const mk = (res) => res.map((d, r) => {
    const ci = combineInput(seed, r, d.x.shape[0]);
    const T = d.handle.numTokens;
    const bias = [biasInput(seed, r, T), biasInput(seed + 1, r, T)].slice(0, biases).map((b) => tensor('bf16', [T, hidden], b));
    return { x: tensor('bf16', [d.x.shape[0], hidden], ci.x), handle: d.handle, ...(weights ? { topkWeights: ci.w } : {}), ...(biases ? { bias } : {}) };
  });
  const [gc, gh] = [await cuda.combine(mk(c)), await host.combine(mk(h))];
  gh.forEach((w, r) => {
    same(gc[r].x.data, w.x.data, `${label} combine x, rank ${r}`);
    same(gc[r].topkWeights, w.topkWeights, `${label} combine weights, rank ${r}`);
  });
}

describe('dispatch on cuda equals the host executor', () => {
  test('bf16, top-8 of 256 with -1 slots; then combine with 0/1/2 biases, with and without weights', async () => {
    const [c, h] = await bothDispatch(inputs(1, [100, 77]), 'bf16');
    assert.ok(c[0].x.shape[0] > 0 && c[1].x.shape[0] > 0);
    for (const biases of [0, 1, 2])
      for (const weights of [true, false]) await bothCombine(c, h, 10 + biases, { biases, weights }, `${biases} biases, weights ${weights}`);
  });

  test('fp8e4m3 with per-128 scales', async () => {
    const [c, h] = await bothDispatch(inputs(2, [64, 128], { fp8: true }), 'fp8');
    await bothCombine(c, h, 20, { biases: 1 }, 'after fp8');
  });

  test('a rank with zero tokens', async () => {
    const [c, h] = await bothDispatch(inputs(3, [0, 50]), 'zero-token rank');
    assert.equal(c[0].handle.numTokens, 0);
    await bothCombine(c, h, 30, { biases: 2 }, 'zero-token rank');
  });

  test('every token to one expert (rank 0 receives everything, rank 1 nothing)', async () => {
    const [c, h] = await bothDispatch(inputs(4, [40, 60], { routing: 'one' }), 'one expert');
    assert.equal(c[0].x.shape[0], 100);
    assert.equal(c[1].x.shape[0], 0);
    await bothCombine(c, h, 40, {}, 'one expert');
  });

  test('every slot -1: nothing moves', async () => {
    const [c, h] = await bothDispatch(inputs(5, [30, 20], { routing: 'none' }), 'all -1');
    assert.deepEqual(c.map((d) => d.x.shape[0]), [0, 0]);
    await bothCombine(c, h, 50, { biases: 1 }, 'all -1');
  });

  test('expertAlignment rounds tokensPerExpert up', async () => {
    const [c] = await bothDispatch(inputs(6, [90, 70], { expertAlignment: 16 }), 'alignment 16');
    assert.ok(c[0].tokensPerExpert.every((n) => n % 16 === 0));
  });

  test('cached mode: the handle routing with new x, with and without new weights', async () => {
    const [c, h] = await bothDispatch(inputs(7, [80, 96]), 'first');
    const again = (res, withWeights) => inputs(8, [80, 96]).map((i, r) => ({
      x: i.x, handle: res[r].handle, ...(withWeights ? { topkWeights: i.topkWeights } : {}),
    }));
    for (const withWeights of [false, true]) {
      const [kc, kh] = [await cuda.dispatch(again(c, withWeights)), await host.dispatch(again(h, withWeights))];
      sameDispatch(kc, kh, `cached, weights ${withWeights}`);
      await bothCombine(kc, kh, 70, { biases: 1 }, 'cached');
    }
  });

  test('dispatch goes notify -> cpuSync -> data on every rank', async () => {
    const seen = [];
    const onT = (t) => seen.push(`${t.rank}:${t.to}`);
    cuda.on('transition', onT);
    try {
      await cuda.dispatch(inputs(9, [10, 10]));
    } finally {
      cuda.off('transition', onT);
    }
    for (const r of [0, 1]) {
      const mine = seen.filter((s) => s.startsWith(`${r}:`)).map((s) => s.slice(2));
      const at = (p) => mine.findIndex((s) => s.includes(p));
      assert.ok(at('notify') >= 0 && at('notify') < at('cpuSync') && at('cpuSync') < at('data'), `rank ${r}: ${mine.join(' ')}`);
    }
  });
});

describe('rank programs with device-resident tensors', () => {
  test('dispatch (CPU sync, outputs in the buffer, cached) and combine equal the host group', async () => {
    const seed = 11;
    const tokens = [100, 77];
    const res = await cuda.run(new URL('./programs/moe-device.mjs', import.meta.url), { seed, tokens });
    const ins = inputs(seed, tokens);
    const h = await host.dispatch(ins);
    res.forEach((o, r) => {
      assert.equal(o.isDevice, true);
      const w = h[r];
      const R = w.x.shape[0];
      assert.equal(o.numRecv, R);
      same(o.x, w.x.data, `program x, rank ${r}`);
      same(o.topkIdx, w.topkIdx, `program topkIdx, rank ${r}`);
      same(o.topkWeights, w.topkWeights, `program topkWeights, rank ${r}`);
      same(o.srcRank, w.srcRank, `program srcRank, rank ${r}`);
      same(o.srcToken, w.srcToken, `program srcToken, rank ${r}`);
      assert.deepEqual(o.tokensPerExpert, w.tokensPerExpert);
      assert.equal(o.inBuffer.numRecv, null);
      assert.equal(o.inBuffer.rows, 2 * MOE_BUFFER.maxTokensPerRank);
      same(o.inBuffer.x, w.x.data, `in-buffer x, rank ${r}`);
      same(o.inBuffer.srcToken, w.srcToken, `in-buffer srcToken, rank ${r}`);
      assert.equal(o.combineFromBufferRefused, 'EINVAL');
      assert.ok(o.timedMs > 0);
    });
    const hc = await host.combine(h.map((d, r) => {
      const ci = combineInput(seed, r, d.x.shape[0]);
      const T = tokens[r];
      return { x: tensor('bf16', [d.x.shape[0], hidden], ci.x), handle: d.handle, topkWeights: ci.w, bias: [tensor('bf16', [T, hidden], biasInput(seed, r, T))] };
    }));
    res.forEach((o, r) => {
      same(o.combineX, hc[r].x.data, `program combine x, rank ${r}`);
      same(o.combineW, hc[r].topkWeights, `program combine weights, rank ${r}`);
    });
    const hk = await host.dispatch(inputs(seed + 1, tokens).map((i, r) => ({ x: i.x, handle: h[r].handle })));
    res.forEach((o, r) => {
      assert.equal(o.cached.numRecv, hk[r].x.shape[0]);
      same(o.cached.x, hk[r].x.data, `program cached x, rank ${r}`);
      same(o.cached.topkWeights, hk[r].topkWeights, `program cached weights, rank ${r}`);
    });
  });
});
