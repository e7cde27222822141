// Sequence numbers across 2^32 on cuda (RANKFLOW_TEST_FIRST_SEQ, a test-only hook): barriers,
// allGather, dispatch + combine (cached too) and a session run across 2^32 - 3 .. 2^32 + 6 with the
// same bytes as a host group that starts at 0 (the oracle), and the same seq on every rank. Also the
// lifecycle on cuda: group.run's signal with rank.anyAborted() (a host-tensor allGather inside a
// cuda rank program), and a script that never destroys its cuda group still exits.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import { BUFFER, bytesOfTensor, cudaGroup, hostGroup, layouts, pattern, range, requireGpu } from './helpers.mjs';

before(() => requireGpu());

const FIRST = 2 ** 32 - 3;
const sameBytes = (a, b, what) => assert.ok(Buffer.from(bytesOfTensor(a)).equals(Buffer.from(bytesOfTensor(b))), `${what}: bytes differ`);

for (const layout of layouts([2])) {
  describe(layout.name, () => {
    let gpu, host;
    before(async () => {
      process.env.RANKFLOW_TEST_FIRST_SEQ = String(FIRST);
      try {
        gpu = await cudaGroup(layout);
      } finally {
        delete process.env.RANKFLOW_TEST_FIRST_SEQ;
      }
      host = await hostGroup(layout);
    });
    after(async () => {
      await gpu?.destroy();
      await host?.destroy();
    });

    test('across 2^32: the same results as the host, one seq per collective on every rank', async () => {
      const W = layout.ranks;
      assert.deepEqual(gpu.snapshot().map((s) => s.seq), range(W).map(() => FIRST));
      await gpu.barrier();
      await gpu.barrier({ withCpuSync: true });
      const parts = range(W).map((r) => pattern('int32', [1000, 3], r, 1));
      const [g, h] = [await gpu.allGather(parts), await host.allGather(parts)];
      range(W).forEach((r) => sameBytes(g[r], h[r], `allGather rank ${r}`));  // seq 2^32
      const { hidden, topk, numExperts } = BUFFER;
      const inputs = range(W).map((r) => {
        const T = 5 + r;
        const topkIdx = Int32Array.from({ length: T * topk }, (_, i) => (i % topk === 0 ? (i + r) % numExperts : -1));
        return { x: pattern('bf16', [T, hidden], r, 2), topkIdx, topkWeights: Float32Array.from({ length: T * topk }, (_, i) => (i % topk === 0 ? 0.5 + i : 0)) };
      });
      const dg = await gpu.dispatch(inputs), dh = await host.dispatch(inputs);
      range(W).forEach((r) => {
        sameBytes(dg[r].x, dh[r].x, `dispatch rank ${r}`);
        assert.deepEqual(Array.from(dg[r].srcToken), Array.from(dh[r].srcToken));
        assert.equal(dg[r].handle.seq, FIRST + 4);
      });
      const ys = dg.map((o) => o.x);
      const cg = await gpu.combine(dg.map((o, r) => ({ x: ys[r], handle: o.handle })));
      const ch = await host.combine(dh.map((o, r) => ({ x: ys[r], handle: o.handle })));
      range(W).forEach((r) => sameBytes(cg[r].x, ch[r].x, `combine rank ${r}`));
      const ag = await gpu.dispatch(inputs.map((d, r) => ({ x: d.x, handle: dg[r].handle })));
      range(W).forEach((r) => sameBytes(ag[r].x, dh[r].x, `cached dispatch rank ${r}`));
      const cg2 = await gpu.combine(ag.map((o, r) => ({ x: ys[r], handle: o.handle })));
      range(W).forEach((r) => sameBytes(cg2[r].x, ch[r].x, `cached combine rank ${r}`));
      const sg = await gpu.openSession({ maxBytes: 4096, maxAllGathers: 2 });
      const sh = await host.openSession({ maxBytes: 4096, maxAllGathers: 2 });
      const grads = range(W).map((r) => pattern('fp32', [W * 64], r, 3));
      const [rg, rh] = [await sg.reduceScatter(grads), await sh.reduceScatter(grads)];
      range(W).forEach((r) => sameBytes(rg[r], rh[r], `reduceScatter rank ${r}`));
      await sg.close();
      await sh.close();
      assert.deepEqual(gpu.snapshot().map((s) => s.seq), range(W).map(() => FIRST + 10));
      assert.equal((await gpu.info(0)).seq, FIRST + 11);  // the native count includes the registration
    });

    test("group.run's signal: rank.anyAborted() stops every rank after the same collective; ABORTED; the ranks ready and in step", async () => {
      const ac = new AbortController();
      const running = gpu.run(new URL('../fixtures/programs/until-aborted.mjs', import.meta.url), { mode: 'agree' }, { signal: ac.signal });
      await new Promise((r) => setTimeout(r, 300));
      ac.abort();
      await assert.rejects(running, (e) => e.code === 'ABORTED');
      const seqs = gpu.snapshot().map((s) => s.seq);
      assert.equal(new Set(seqs).size, 1);
      assert.deepEqual(gpu.snapshot().map((s) => s.state), seqs.map(() => 'ready'));
      await gpu.barrier();
    });
  });
}

test('a script that never destroys its cuda group exits by itself with code 0', () => {
  const dist = new URL('../../dist/actors/index.js', import.meta.url).href;
  const script = `import { createGroup } from ${JSON.stringify(dist)};
    const g = await createGroup({ backend: 'cuda', ranks: 2, devices: [0, 0], buffer: ${JSON.stringify(BUFFER)} });
    await g.barrier();
    console.log('done');`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { cwd: fileURLToPath(new URL('../..', import.meta.url)), timeout: 60_000, encoding: 'utf8' });
  assert.equal(r.status, 0, `exit ${r.status} ${r.signal ?? ''}: ${r.stderr}`);
  assert.equal(r.stdout.trim(), 'done');
});

