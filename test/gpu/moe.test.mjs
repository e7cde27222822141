// Dispatch and combine on the CUDA backend, each case compared bit for bit with a host group given the
// same inputs (the host executor is the reference), in every layout the machine has: 2 and 4 ranks
// sharing GPU 0, and one rank per GPU where there are two. Driver mode (host tensors staged through
// device memory) and rank programs with device-resident tensors; the kernels complete while other
// work holds most SMs; mismatched handles and bad expert ids come back as EINVAL. Above 1024 tokens
// the notify kernel runs as a grid of blocks: the same checks at up to 3000 tokens per rank. Cached
// dispatches of cached handles keep each handle's weights for its combine, at 1, 2 and 4 ranks.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';

import { createGroup, cudaAndHost, layouts, recordPaths, requireGpu, tensor } from './helpers.mjs';
import { MOE_BUFFER, biasInput, combineInput, digest, moeInput } from './moe-inputs.mjs';

before(() => requireGpu());

const { hidden, topk } = MOE_BUFFER;
const bytes = (a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
const same = (got, want, what) => {
  assert.equal(got.length, want.length, `${what}: length`);
  assert.ok(bytes(got).equals(bytes(want)), `${what}: bytes differ`);
};
const TOKENS = { 2: [100, 77], 4: [100, 77, 0, 128] };

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

for (const layout of layouts([2, 4])) {
  const W = layout.ranks;
  const tokens = TOKENS[W];
  const program = (name) => new URL(`./programs/${name}`, import.meta.url);

  describe(`dispatch and combine on cuda equal the host executor: ${layout.name}`, () => {
    let cuda;
    let host;
    cudaAndHost(layout, MOE_BUFFER, (c, h) => ((cuda = c), (host = h)));

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

    test('bf16, top-8 of 256 with -1 slots; then combine with 0/1/2 biases, with and without weights', async () => {
      const [c, h] = await bothDispatch(inputs(1, tokens), 'bf16');
      assert.ok(c.some((d) => d.x.shape[0] > 0));
      for (const biases of [0, 1, 2])
        for (const weights of [true, false]) await bothCombine(c, h, 10 + biases, { biases, weights }, `${biases} biases, weights ${weights}`);
    });

    test('fp8e4m3 with per-128 scales', async () => {
      const [c, h] = await bothDispatch(inputs(2, tokens.map((t) => Math.min(t, 64)), { fp8: true }), 'fp8');
      await bothCombine(c, h, 20, { biases: 1 }, 'after fp8');
    });

    test('a rank with zero tokens', async () => {
      const [c, h] = await bothDispatch(inputs(3, [0, ...tokens.slice(1)]), 'zero-token rank');
      assert.equal(c[0].handle.numTokens, 0);
      await bothCombine(c, h, 30, { biases: 2 }, 'zero-token rank');
    });

    test('every token to one expert (rank 0 receives everything, the others nothing)', async () => {
      const [c, h] = await bothDispatch(inputs(4, tokens, { routing: 'one' }), 'one expert');
      assert.equal(c[0].x.shape[0], tokens.reduce((a, b) => a + b, 0));
      for (let r = 1; r < W; r++) assert.equal(c[r].x.shape[0], 0);
      await bothCombine(c, h, 40, {}, 'one expert');
    });

    test('every slot -1: nothing moves', async () => {
      const [c, h] = await bothDispatch(inputs(5, tokens, { routing: 'none' }), 'all -1');
      assert.deepEqual(c.map((d) => d.x.shape[0]), Array(W).fill(0));
      await bothCombine(c, h, 50, { biases: 1 }, 'all -1');
    });

    test('expertAlignment rounds tokensPerExpert up', async () => {
      const [c] = await bothDispatch(inputs(6, tokens, { expertAlignment: 16 }), 'alignment 16');
      assert.ok(c.every((d) => d.tokensPerExpert.every((n) => n % 16 === 0)));
    });

    test('cached mode: the handle routing with new x, with and without new weights', async () => {
      const [c, h] = await bothDispatch(inputs(7, tokens), 'first');
      const again = (res, withWeights) => inputs(8, tokens).map((i, r) => ({
        x: i.x, handle: res[r].handle, ...(withWeights ? { topkWeights: i.topkWeights } : {}),
      }));
      for (const withWeights of [false, true]) {
        const [kc, kh] = [await cuda.dispatch(again(c, withWeights)), await host.dispatch(again(h, withWeights))];
        sameDispatch(kc, kh, `cached, weights ${withWeights}`);
        await bothCombine(kc, kh, 70, { biases: 1 }, 'cached');
      }
    });

    // 2 handles per step, so the handle that expires is ~128 steps old; 5 routings in turn, and 5 divides
    // none of 127-129: the layout and device blocks a new handle takes over always had another routing.
    test('past 256 handles each new one takes over an expired one: five routings in turn, no CPU sync and cached, keep their own rows and combine', async () => {
      const seed = 60, steps = 150, rows = W * MOE_BUFFER.maxTokensPerRank;
      const tokensOf = [0, 1, 2, 3, 4].map((s) => Array.from({ length: W }, (_, r) => 20 + 13 * s + 7 * r));
      const rowsOf = (d) => [digest(d.x.data), digest(d.topkIdx), digest(d.topkWeights), digest(d.srcRank), digest(d.srcToken)];
      const want = [];
      for (const [s, tokens] of tokensOf.entries()) {
        const h = await host.dispatch(inputs(seed + s, tokens));
        const hk = await host.dispatch(tokens.map((T, r) => ({ x: tensor('bf16', [T, hidden], moeInput(seed + 100 + s, r, T).x), handle: h[r].handle })));
        const hc = await host.combine(hk.map((d, r) => ({ x: tensor('bf16', [d.x.shape[0], hidden], combineInput(seed + s, r, d.x.shape[0]).x), handle: d.handle })));
        want.push({ recv: h.map((d) => d.x.shape[0]), fresh: h.map(rowsOf), cached: hk.map(rowsOf), combine: hc.map((c) => [digest(c.x.data), digest(c.topkWeights)]) });
      }
      const got = await cuda.run(program('moe-reuse.mjs'), { seed, tokens: tokensOf, recv: want.map((w) => w.recv), rows, steps });
      got.forEach((o, r) => {
        assert.equal(o.steps.length, steps);
        assert.equal(o.fusedDispatches, steps, `rank ${r}: every dispatch without a CPU sync ran as one kernel`);
        o.steps.forEach((st, step) => {
          const w = want[st.set], at = `rank ${r}, step ${step} (routing ${st.set})`;
          assert.deepEqual(st.fresh, w.fresh[r], `${at}: no CPU sync: x, topkIdx, topkWeights, srcRank, srcToken`);
          assert.deepEqual(st.cached, w.cached[r], `${at}: cached: x, topkIdx, topkWeights, srcRank, srcToken`);
          assert.deepEqual(st.combine, w.combine[r], `${at}: combine x, weights`);
        });
      });
    });

    test('one transition into dispatching and one out per rank, the record naming notify, cpuSync, data', async () => {
      const seen = [];
      const onT = (t) => seen.push(t);
      cuda.on('transition', onT);
      try {
        await cuda.dispatch(inputs(9, tokens.map(() => 10)));
      } finally {
        cuda.off('transition', onT);
      }
      for (let r = 0; r < W; r++) {
        const mine = seen.filter((t) => t.rank === r);
        assert.equal(mine[0].to, 'dispatching.running');
        assert.deepEqual(mine.at(-1).phases, ['notify', 'cpuSync', 'data'], `rank ${r}: ${mine.map((t) => t.to).join(' ')}`);
      }
    });

    test('rank programs with device tensors: dispatch (CPU sync, outputs in the buffer, cached) and combine equal the host group', async () => {
      const seed = 11;
      const res = await cuda.run(program('moe-device.mjs'), { seed, tokens });
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
        assert.equal(o.inBuffer.rows, W * MOE_BUFFER.maxTokensPerRank);
        same(o.inBuffer.x, w.x.data, `in-buffer x, rank ${r}`);
        same(o.inBuffer.srcToken, w.srcToken, `in-buffer srcToken, rank ${r}`);
        same(o.inBuffer.srcRank, w.srcRank, `in-buffer srcRank, rank ${r}`);
        assert.equal(o.inBuffer.sameViews, true);
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
        assert.equal(o.outIsMine, true, 'options.out: the result is the caller\'s tensors');
        same(o.combineOutX, hc[r].x.data, `program combine into options.out x, rank ${r}`);
        same(o.combineOutW, hc[r].topkWeights, `program combine into options.out weights, rank ${r}`);
        assert.equal(o.outShapeRefused, 'EINVAL');
      });
      const hk = await host.dispatch(inputs(seed + 1, tokens).map((i, r) => ({ x: i.x, handle: h[r].handle })));
      res.forEach((o, r) => {
        assert.equal(o.cached.numRecv, hk[r].x.shape[0]);
        same(o.cached.x, hk[r].x.data, `program cached x, rank ${r}`);
        same(o.cached.topkWeights, hk[r].topkWeights, `program cached weights, rank ${r}`);
      });
    });

    test('rank.timeOps: ops are untimed by default (lastOpDeviceMs is STATE), timed after timeOps(true), untimed after timeOps(false)', async () => {
      const res = await cuda.run(program('op-timing.mjs'), { seed: 23, tokens });
      res.forEach((o, r) => {
        assert.equal(o.before.code, 'STATE', `rank ${r}: ${JSON.stringify(o.before)}`);
        assert.match(o.before.message, /timeOps\(true\)/);
        assert.equal(o.badArg.code, 'EINVAL');
        assert.equal(o.armed.code, 'STATE', 'nothing ran since timeOps(true)');
        for (const [what, wall] of [['dispatched', o.dispatchWallMs], ['combined', o.combineWallMs]]) {
          assert.ok(o[what].ms > 0 && o[what].ms <= wall, `rank ${r} ${what}: ${o[what].ms} ms of device time in ${wall} ms of wall time`);
        }
        assert.equal(o.after.code, 'STATE');
      });
    });

    test('captured graphs of cached dispatch, combine and barrier replay exact, every replay new collectives seen as transitions', async () => {
      const seed = 12;
      const replays = 5;
      const paths = recordPaths(cuda);
      const res = await cuda.run(program('moe-graph.mjs'), { seed, tokens, replays });
      const h = await host.dispatch(inputs(seed, tokens));
      const hk = await host.dispatch(inputs(seed + 1, tokens).map((i, r) => ({ x: i.x, handle: h[r].handle })));
      const hc = await host.combine(hk.map((d, r) => ({ x: tensor('bf16', [d.x.shape[0], hidden], combineInput(seed, r, d.x.shape[0]).x), handle: d.handle })));
      res.forEach((o, r) => {
        assert.deepEqual(o.ops, [1, 3]);
        assert.equal(o.seqAfter - o.seqBefore, 4 * replays, 'each replay takes its graph\'s sequence numbers');
        assert.equal(o.replayed.length, replays);
        for (let i = 0; i < o.replayed.length; i++) {
          same(o.replayed[i].x, hk[r].x.data, `replay ${i} dispatch x, rank ${r}`);
          same(o.replayed[i].combineX, hc[r].x.data, `replay ${i} combine x, rank ${r}`);
        }
        same(o.after.x, hk[r].x.data, `a plain cached dispatch after the replays, rank ${r}`);
        assert.equal(paths[r].filter((p) => p === 'replaying').length, 2 * replays, `rank ${r}: ${paths[r].join(' ')}`);
      });
    });

    test('a dispatch and a combine complete, exact, while a kernel on another stream holds all but 8 SMs: fast with grids that fit, later but never hung with the default', async () => {
      const seed = 13;
      const busyMs = 3000;
      const busy = await createGroup({ backend: 'cuda', ranks: W, devices: layout.devices, buffer: MOE_BUFFER, timeouts: { gpuSeconds: 2 } });
      let res;
      try {
        res = await busy.run(program('moe-busy.mjs'), { seed, tokens, busyMs });
      } finally {
        await busy.destroy();
      }
      const h = await host.dispatch(inputs(seed, tokens));
      const hc = await host.combine(h.map((d, r) => ({ x: tensor('bf16', [d.x.shape[0], hidden], combineInput(seed, r, d.x.shape[0]).x), handle: d.handle })));
      res.forEach((o, r) => {
        for (const k of ['fitted', 'plain']) {
          same(o[k].x, h[r].x.data, `${k}: dispatch under load x, rank ${r}`);
          same(o[k].combineX, hc[r].x.data, `${k}: combine under load x, rank ${r}`);
        }
        assert.ok(o.fitted.ms < busyMs / 3, `rank ${r}: ${o.fitted.ms.toFixed(0)} ms with numSms ${o.numSms}: the ops waited for the busy kernel`);
      });
      console.log(`${layout.name}: ${res[0].busySms} of ${res[0].sms} SMs held for ${busyMs} ms; dispatch + combine with numSms ${res[0].numSms}: ` +
        `${res.map((o) => o.fitted.ms.toFixed(1)).join(', ')} ms; with the default grids: ${res.map((o) => o.plain.ms.toFixed(0)).join(', ')} ms`);
    });

    test('ranks replaying handles of different dispatches: EINVAL naming inputs.handle on every rank, never silent; the group goes on', async () => {
      const res = await cuda.run(program('moe-mismatch.mjs'), { seed: 14, tokens });
      for (const o of res) {
        assert.equal(o.code, 'EINVAL', JSON.stringify(o));
        assert.match(o.message, /inputs\.handle: rank \d+ replays another dispatch's handle/);
      }
      await cuda.barrier();
      const [c, hh] = await bothDispatch(inputs(15, tokens), 'after the mismatch');
      await bothCombine(c, hh, 16, {}, 'after the mismatch');
    });

    test('a cached dispatch with outputs of numRecv rows from a handle made without CPU sync: EINVAL naming inputs.handle before anything moved; the group goes on', async () => {
      const res = await cuda.run(program('moe-nosync-handle.mjs'), { seed: 19, tokens });
      for (const o of res) {
        assert.equal(o.error?.code, 'EINVAL', JSON.stringify(o));
        assert.match(o.error.message, /inputs\.handle: its dispatch ran without a CPU sync/);
        assert.equal(o.numRecv, null);
        assert.equal(o.againNumRecv, null);
      }
      const [c, hh] = await bothDispatch(inputs(20, tokens), 'after the refused handle');
      await bothCombine(c, hh, 21, {}, 'after the refused handle');
    });

    test('device tensors of more tokens than buffer.maxTokensPerRank: EINVAL on every rank from the runtime, nothing entered; the group goes on', async () => {
      const res = await cuda.run(program('moe-too-many.mjs'), { tokens: MOE_BUFFER.maxTokensPerRank + 1 });
      for (const r of res) {
        for (const o of r.refusals) {
          assert.equal(o.code, 'EINVAL', JSON.stringify(res));
          assert.match(o.message, /input\.x has 129 tokens \(rows\), above buffer\.maxTokensPerRank \(128\)/);
        }
      }
      await cuda.barrier();
      const [c, hh] = await bothDispatch(inputs(19, tokens), 'after the refused counts');
      await bothCombine(c, hh, 20, {}, 'after the refused counts');
    });

    test('an expert id out of range in a device tensor: the kernel reports it, the dispatch is EINVAL naming topkIdx; the group goes on', async () => {
      const res = await cuda.run(program('moe-bad-id.mjs'), { tokens });
      assert.ok(res.some((o) => o.code === 'EINVAL' && /topkIdx\[\d+\]: 999 is outside \[0, 256\)/.test(o.message)), JSON.stringify(res));
      await cuda.barrier();
      const [c, hh] = await bothDispatch(inputs(17, tokens), 'after the bad id');
      await bothCombine(c, hh, 18, {}, 'after the bad id');
    });
  });
}

// Above 1024 tokens a rank's notify kernel is a grid of blocks meeting at a barrier (kernels/dispatch.cu):
// runs of tokens that split unevenly over the blocks, a rank with none, and bad ids in later blocks.
const BIG_BUFFER = { ...MOE_BUFFER, maxTokensPerRank: 3000 };
const BIG_TOKENS = { 2: [3000, 1777], 4: [3000, 1777, 0, 1025] };

for (const layout of layouts([2, 4])) {
  const W = layout.ranks;
  const tokens = BIG_TOKENS[W];
  const program = (name) => new URL(`./programs/${name}`, import.meta.url);

  describe(`a multi-block dispatch notify equals the host executor: ${layout.name}`, () => {
    let cuda;
    let host;
    cudaAndHost(layout, BIG_BUFFER, (c, h) => ((cuda = c), (host = h)));

    test(`bf16 top-8 of 256 at ${tokens.join('/')} tokens, then cached with new weights, then combine`, async () => {
      const ins = inputs(31, tokens);
      const [c, h] = [await cuda.dispatch(ins), await host.dispatch(ins)];
      sameDispatch(c, h, 'multi-block');
      const again = (res) => inputs(32, tokens).map((i, r) => ({ x: i.x, handle: res[r].handle, topkWeights: i.topkWeights }));
      const [kc, kh] = [await cuda.dispatch(again(c)), await host.dispatch(again(h))];
      sameDispatch(kc, kh, 'multi-block, cached');
      const mk = (res) => res.map((d, r) => ({ x: tensor('bf16', [d.x.shape[0], hidden], combineInput(33, r, d.x.shape[0]).x), handle: d.handle }));
      const [gc, gh] = [await cuda.combine(mk(kc)), await host.combine(mk(kh))];
      gh.forEach((w, r) => {
        same(gc[r].x.data, w.x.data, `multi-block combine x, rank ${r}`);
        same(gc[r].topkWeights, w.topkWeights, `multi-block combine weights, rank ${r}`);
      });
    });

    test('every token to one expert: rank 0 receives everything', async () => {
      const ins = inputs(34, tokens, { routing: 'one' });
      const [c, h] = [await cuda.dispatch(ins), await host.dispatch(ins)];
      sameDispatch(c, h, 'multi-block, one expert');
      assert.equal(c[0].x.shape[0], tokens.reduce((a, b) => a + b, 0));
    });

    test('bad expert ids in two later blocks of rank 0: the first slot is the one reported; the group goes on', async () => {
      const res = await cuda.run(program('moe-bad-id.mjs'), { tokens, bad: [[23201, -7], [12002, 999]] });
      assert.ok(res.some((o) => o.code === 'EINVAL' && /topkIdx\[12002\]: 999 is outside \[0, 256\)/.test(o.message)), JSON.stringify(res));
      await cuda.barrier();
      const ins = inputs(35, tokens);
      sameDispatch(await cuda.dispatch(ins), await host.dispatch(ins), 'multi-block, after the bad ids');
    });

    test('the same bad ids in a dispatch without a CPU sync (one kernel): the first slot is reported at the next wait; the group goes on', async () => {
      const res = await cuda.run(program('moe-bad-id.mjs'), { tokens, bad: [[23201, -7], [12002, 999]], noSync: true });
      assert.ok(res.every((o) => o.fused === 1), `every rank's dispatch ran fused: ${JSON.stringify(res)}`);
      assert.ok(/topkIdx\[12002\]: 999 is outside \[0, 256\)/.test(res[0].message ?? ''), JSON.stringify(res));
      assert.equal(res[0].code, 'EINVAL', JSON.stringify(res));
      await cuda.barrier();
      const ins = inputs(36, tokens);
      sameDispatch(await cuda.dispatch(ins), await host.dispatch(ins), 'fused, after the bad ids');
    });
  });
}

// Without a CPU sync a dispatch is one kernel (rf_dispatch_fused, kernels/dispatch.cu): the notify's
// routing and counts, then each block copies the tokens it routed while block 0 finishes the state.
// Its outputs and the combine through its handle equal the host group's, at one block and many, with
// grids that leave blocks without tokens, fp8 with scales, and all tokens to one expert; with
// RANKFLOW_FUSED_DISPATCH=0 the same op runs as its two kernels and gives the same bytes.
const FUSED_BUFFER = { ...MOE_BUFFER, maxTokensPerRank: 3000 };
const FUSED_CASES = {
  // One rank: its own rows' state goes with the rows, and with the outputs in the buffer the data kernel ends after them.
  1: [{ tokens: [3000] }, { tokens: [100], numSms: 1 }, { tokens: [2999], fp8: true, numSms: 7 }, { tokens: [100], routing: 'one' }],
  2: [{ tokens: [3000, 1777] }, { tokens: [100, 77], numSms: 1 }, { tokens: [3000, 129], fp8: true, numSms: 7 }, { tokens: [100, 77], routing: 'one' }],
  4: [{ tokens: [3000, 1777, 0, 1025] }, { tokens: [100, 77, 0, 128], numSms: 1 }, { tokens: [1025, 3, 2999, 64], fp8: true, numSms: 7 }, { tokens: [0, 0, 0, 5] }],
};

for (const layout of layouts([1, 2, 4])) {
  const W = layout.ranks;
  const program = new URL('./programs/moe-fused.mjs', import.meta.url);

  describe(`a dispatch without a CPU sync runs as one kernel and equals the host executor: ${layout.name}`, () => {
    let fused;
    let split;
    let host;
    before(async () => {
      fused = await createGroup({ backend: 'cuda', ranks: W, devices: layout.devices, buffer: FUSED_BUFFER });
      const saved = process.env.RANKFLOW_FUSED_DISPATCH;
      process.env.RANKFLOW_FUSED_DISPATCH = '0';
      try {
        split = await createGroup({ backend: 'cuda', ranks: W, devices: layout.devices, buffer: FUSED_BUFFER });
      } finally {
        if (saved === undefined) delete process.env.RANKFLOW_FUSED_DISPATCH;
        else process.env.RANKFLOW_FUSED_DISPATCH = saved;
      }
      host = await createGroup({ backend: 'host', ranks: W, buffer: FUSED_BUFFER });
    });
    after(async () => {
      await fused?.destroy();
      await split?.destroy();
      await host?.destroy();
    });

    FUSED_CASES[W].forEach((k, i) => {
      const seed = 41 + i;
      const what = `${k.tokens.join('/')} tokens${k.fp8 ? ', fp8 + scales' : ''}${k.numSms ? `, numSms ${k.numSms}` : ''}${k.routing ? `, routing ${k.routing}` : ''}`;
      test(what, async () => {
        const ins = inputs(seed, k.tokens, { fp8: k.fp8, routing: k.routing });
        const h = await host.dispatch(ins);
        const hc = await host.combine(h.map((d, r) => {
          const R = d.x.shape[0], T = k.tokens[r], ci = combineInput(seed, r, R);
          return { x: tensor('bf16', [R, hidden], ci.x), handle: d.handle, topkWeights: ci.w, bias: [tensor('bf16', [T, hidden], biasInput(seed, r, T))] };
        }));
        const hp = await host.combine(h.map((d, r) => ({ x: tensor('bf16', [d.x.shape[0], hidden], combineInput(seed, r, d.x.shape[0]).x), handle: d.handle })));
        const args = { seed, tokens: k.tokens, recv: h.map((d) => d.x.shape[0]), rows: W * FUSED_BUFFER.maxTokensPerRank, numSms: k.numSms, fp8: k.fp8, routing: k.routing };
        // An op of no tokens on every rank first (fused as well): the count below is of this case's dispatch.
        const was = (await fused.run(program, { ...args, tokens: k.tokens.map(() => 0), recv: k.tokens.map(() => 0) })).map((o) => o.fusedDispatches);
        const got = await fused.run(program, args);
        const ref = await split.run(program, args);
        got.forEach((o, r) => {
          const w = h[r], at = `${what}, rank ${r}`;
          assert.equal(o.numRecv, null);
          same(o.x, w.x.data, `${at}: x`);
          if (k.fp8) same(o.scales, w.scales.data, `${at}: scales`);
          same(o.topkIdx, w.topkIdx, `${at}: topkIdx`);
          same(o.topkWeights, w.topkWeights, `${at}: topkWeights`);
          same(o.srcRank, w.srcRank, `${at}: srcRank`);
          same(o.srcToken, w.srcToken, `${at}: srcToken`);
          same(o.combineX, hc[r].x.data, `${at}: combine x`);
          same(o.combineW, hc[r].topkWeights, `${at}: combine weights`);
          for (const f of ['x', 'topkIdx', 'topkWeights', 'srcRank', 'srcToken']) same(o.cached[f], o[f], `${at}: cached dispatch, ${f}`);
          if (k.fp8) same(o.cached.scales, o.scales, `${at}: cached dispatch, scales`);
          same(o.plainX, hp[r].x.data, `${at}: combine without weights or bias, x`);
          same(o.plainW, hp[r].topkWeights, `${at}: combine without weights or bias, weights`);
          assert.equal(o.fusedDispatches, was[r] + 1, `${at}: one fused dispatch`);
          for (const f of ['x', 'topkIdx', 'topkWeights', 'srcRank', 'srcToken', 'combineX', 'combineW', 'plainX', 'plainW']) same(ref[r][f], o[f], `${at}: ${f}, two kernels`);
          assert.equal(ref[r].fusedDispatches, 0, `${at}: RANKFLOW_FUSED_DISPATCH=0 runs two kernels`);
        });
      });
    });
  });
}

// Chains of cached dispatches (kernels/dispatch.cu, keep_state / keep_weights): one that sends its
// origin's weights shares the origin's receive state and leaves it alone; one with new weights keeps
// them, and a cached dispatch of its handle replays those (the host executor's rule). Every handle's
// combine without weights reads the weights of its own dispatch, after all four dispatches ran.
for (const layout of layouts([1, 2, 4])) {
  const W = layout.ranks;
  const tokens = { 1: [128], 2: [128, 77], 4: [100, 77, 0, 128] }[W];

  describe(`cached dispatches of cached handles keep each handle's weights for combine: ${layout.name}`, () => {
    let cuda;
    let host;
    cudaAndHost(layout, MOE_BUFFER, (c, h) => ((cuda = c), (host = h)));

    for (const fp8 of [false, true]) {
      test(`d0; k1 = d0 with new weights; k2 = k1 without; k3 = d0 without; four combines without weights${fp8 ? ', fp8 + scales' : ''}`, async () => {
        const cached = (seed, of, withWeights) => inputs(seed, tokens, { fp8 }).map((i, r) => ({
          x: i.x, ...(fp8 ? { scales: i.scales } : {}), handle: of[r].handle, ...(withWeights ? { topkWeights: i.topkWeights } : {}),
        }));
        const run = async (g) => {
          const d0 = await g.dispatch(inputs(91, tokens, { fp8 }));
          const k1 = await g.dispatch(cached(92, d0, true));
          const k2 = await g.dispatch(cached(93, k1, false));
          const k3 = await g.dispatch(cached(94, d0, false));
          const all = [d0, k1, k2, k3];
          const combined = [];
          for (const [n, res] of all.entries())
            combined.push(await g.combine(res.map((d, r) => ({ x: tensor('bf16', [d.x.shape[0], hidden], combineInput(95 + n, r, d.x.shape[0]).x), handle: d.handle }))));
          return { all, combined };
        };
        const c = await run(cuda), h = await run(host);
        ['d0', 'k1', 'k2', 'k3'].forEach((name, n) => {
          sameDispatch(c.all[n], h.all[n], name);
          h.combined[n].forEach((w, r) => {
            same(c.combined[n][r].x.data, w.x.data, `${name} combine x, rank ${r}`);
            same(c.combined[n][r].topkWeights, w.topkWeights, `${name} combine weights, rank ${r}`);
          });
        });
        // The rule itself, read off the reference: k2 received k1's weights, k3 d0's; k1's differ.
        h.all[0].forEach((_, r) => {
          same(h.all[2][r].topkWeights, h.all[1][r].topkWeights, `host k2 replays k1's weights, rank ${r}`);
          same(h.all[3][r].topkWeights, h.all[0][r].topkWeights, `host k3 replays d0's weights, rank ${r}`);
          if (h.all[0][r].x.shape[0] > 0) assert.ok(!bytes(h.all[1][r].topkWeights).equals(bytes(h.all[0][r].topkWeights)), `k1's weights are new, rank ${r}`);
        });
      });
    }
  });
}
