// A device-side wait that times out: rank 0's barrier kernel waits for rank 1, which never comes.
// The kernel gives up (it never traps): it writes its Diagnostic into mapped host memory and returns,
// so rank 0 fails TIMEOUT_GPU naming the phase and the peer, the GPU stays usable, and a new group on
// the same GPU works in the same process. Runs with the ranks sharing GPU 0 (and on 2 GPUs where there are).
import { before, test } from 'node:test';
import assert from 'node:assert/strict';

import { cudaGroup, layouts, pattern, range, requireGpu, waitFor } from './helpers.mjs';

before(() => requireGpu());

for (const layout of layouts([2, 4])) test(`${layout.name}: a barrier nobody joins fails rank 0 with TIMEOUT_GPU naming the phase and the peer; the GPU stays usable`, { timeout: 60_000 }, async () => {
  const group = await cudaGroup(layout, { timeouts: { gpuSeconds: 1 } });
  const failures = [];
  group.on('failed', ({ rank, error }) => failures.push({ rank, code: error.code }));
  const t0 = Date.now();
  try {
    await assert.rejects(group.run(new URL('./programs/lonely-barrier.mjs', import.meta.url)), (e) => {
      console.log(`rank 0's error after ${Date.now() - t0} ms: ${JSON.stringify({ code: e.code, rank: e.rank, phase: e.phase, message: e.message })}`);
      assert.equal(e.code, 'TIMEOUT_GPU');
      assert.ok(e.rank >= 1 && e.rank < layout.ranks, `the peer it waited for: ${e.rank}`);
      assert.equal(e.phase, 'barrier');
      assert.match(e.message, new RegExp(`rank 0 in barrier timed out after 1 s on counter barrier\\[from rank ${e.rank}\\].*the kernels gave up.*GPU stays usable`));
      return true;
    });
    assert.ok(Date.now() - t0 < 20_000, 'the wait ends near gpuSeconds');
    assert.equal(group.snapshot()[0].state, 'failed');
    assert.equal(group.snapshot()[0].error.code, 'TIMEOUT_GPU');
    // The peer is told: rank 1 fails with RANK_FAILED naming rank 0.
    await waitFor(() => group.snapshot().every((r) => r.state === 'failed'));
    for (const r of group.snapshot().slice(1)) assert.deepEqual([r.error.code, r.error.rank], ['RANK_FAILED', 0]);
    assert.deepEqual(failures.map((f) => f.rank).sort(), range(layout.ranks));
    await assert.rejects(group.barrier(), (e) => ['TIMEOUT_GPU', 'RANK_FAILED'].includes(e.code));
  } finally {
    await group.destroy();
  }
  assert.deepEqual(group.snapshot().map((r) => r.state), range(layout.ranks).map(() => 'destroyed'));

  // Nothing trapped, so the process's CUDA is intact: a new group on the same GPU(s) works.
  const again = await cudaGroup(layout);
  try {
    await again.barrier();
    const inputs = range(layout.ranks).map((r) => pattern('int32', [64], r, 3));
    const out = await again.allGather(inputs);
    const want = Buffer.concat(inputs.map((t) => Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength)));
    for (const o of out) assert.ok(Buffer.from(o.data.buffer, o.data.byteOffset, o.data.byteLength).equals(want));
  } finally {
    await again.destroy();
  }
});
