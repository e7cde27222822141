// A rank program that throws or returns early on cuda (API.md "Faults"), ranks sharing GPU 0: its
// peers' waits (a kernel's spin, a CPU sync, kernels queued behind) are released at once, far before
// gpuSeconds; the run rejects with the thrower's TypeError as the cause (PROGRAM_ERROR) or STATE naming
// the rank that returned; the ranks are alive and back in step (the kernels' give-up flags cleared),
// so the same group goes on: its next dispatch and combine equal the host executor's bit for bit.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';

import { createGroup, cudaGroup, layouts, requireGpu, tensor } from './helpers.mjs';
import { MOE_BUFFER, combineInput, moeInput } from './moe-inputs.mjs';

before(() => requireGpu());

const LATE = new URL('./programs/late-barrier.mjs', import.meta.url);
const LOOP = new URL('./programs/device-loop.mjs', import.meta.url);
const OPS = ['barrier', 'barrierCpuSync', 'allGather', 'dispatch', 'combine'];
const { hidden } = MOE_BUFFER;
const bytes = (a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);

function inputs(seed, W) {
  return Array.from({ length: W }, (_, r) => {
    const i = moeInput(seed, r, 40 + r);
    return { x: tensor('bf16', [40 + r, hidden], i.x), topkIdx: i.topkIdx, topkWeights: i.topkWeights };
  });
}

/** The group's dispatch and combine equal the host group's, bit for bit. */
async function exact(cuda, host, seed) {
  const W = cuda.size;
  const ins = inputs(seed, W);
  const [c, h] = [await cuda.dispatch(ins), await host.dispatch(ins)];
  for (let r = 0; r < W; r++) assert.ok(bytes(c[r].x.data).equals(bytes(h[r].x.data)), `dispatch x, rank ${r}`);
  const back = (d) => d.map((o, r) => ({ x: tensor('bf16', o.x.shape, combineInput(seed, r, o.x.shape[0]).x), handle: o.handle }));
  const [cb, hb] = [await cuda.combine(back(c)), await host.combine(back(h))];
  for (let r = 0; r < W; r++) assert.ok(bytes(cb[r].x.data).equals(bytes(hb[r].x.data)), `combine x, rank ${r}`);
}

for (const layout of layouts([2, 4])) {
  describe(`${layout.name}: a program's error releases its peers and the group goes on`, () => {
    let cuda, host;
    before(async () => {
      cuda = await cudaGroup(layout, { buffer: MOE_BUFFER, timeouts: { gpuSeconds: 600, cpuSeconds: 600 } });
      host = await createGroup({ backend: 'host', ranks: layout.ranks, buffer: MOE_BUFFER });
    });
    after(async () => {
      await cuda?.destroy();
      await host?.destroy();
    });

    for (const end of ['throw', 'return'])
      for (const op of OPS)
        test(`rank 1's program ${end === 'throw' ? 'throws' : 'returns'} while rank 0 waits in its ${op}`, { timeout: 60_000 }, async () => {
          const t0 = Date.now();
          await assert.rejects(cuda.run(LATE, { sleepMs: 300, op, end }), (e) => {
            const ms = Date.now() - t0 - 300;
            console.log(`${layout.name}, ${op}, ${end}: ${e.code} after ${ms} ms from the program's end: ${e.message}`);
            if (end === 'throw') {
              assert.equal(e.code, 'PROGRAM_ERROR');
              assert.ok(e.cause instanceof TypeError && /boom at/.test(e.cause.message));
            } else assert.equal(e.code, 'STATE');
            assert.equal(e.rank, 1);
            assert.ok(ms < 5000, `${ms} ms`);
            return true;
          });
          assert.deepEqual(cuda.snapshot().map((s) => s.state), cuda.ranks.map(() => 'ready'));
          await exact(cuda, host, 7);
        });

    test('kernels queued without a CPU sync (cached dispatch in the buffer, combine) are released on the GPU; the group goes on', { timeout: 60_000 }, async () => {
      for (const who of [0, 1]) {
        await assert.rejects(cuda.run(LOOP, { iters: 200, at: 50, who }), (e) => {
          assert.equal(e.code, 'PROGRAM_ERROR');
          assert.equal(e.rank, who);
          const ms = performance.timeOrigin + performance.now() - Number(/boom at ([\d.]+)/.exec(e.cause.message)[1]);
          console.log(`${layout.name}, device loop, rank ${who} throws: rejected ${ms.toFixed(1)} ms after the throw`);
          return true;
        });
        assert.deepEqual(cuda.snapshot().map((s) => s.state), cuda.ranks.map(() => 'ready'));
        assert.deepEqual(await cuda.run(LOOP, { iters: 20, at: -1, who: 0 }), cuda.ranks.map(() => 'done'));
        await exact(cuda, host, 8 + who);
      }
    });
  });
}
