// A device-side wait that times out: rank 0's barrier kernel waits for rank 1, which never comes; it
// writes its Diagnostic into mapped host memory and traps. The trap kills that CUDA context, so this
// file runs in its own process (node --test runs each file in a child process).
import { before, test } from 'node:test';
import assert from 'node:assert/strict';

import { cudaGroup, requireTwoGpus } from './helpers.mjs';

before(() => requireTwoGpus());

test('a barrier nobody joins fails rank 0 with TIMEOUT_GPU naming the phase and the peer; destroy works', async () => {
  const group = await cudaGroup({ timeouts: { gpuSeconds: 1 } });
  const failures = [];
  group.on('failed', ({ rank, error }) => failures.push({ rank, code: error.code }));
  try {
    await assert.rejects(group.run(new URL('./programs/lonely-barrier.mjs', import.meta.url)), (e) => {
      console.log(`rank 0's error: ${JSON.stringify({ code: e.code, rank: e.rank, phase: e.phase, message: e.message })}`);
      assert.equal(e.code, 'TIMEOUT_GPU');
      assert.equal(e.rank, 1);
      assert.equal(e.phase, 'barrier');
      assert.match(e.message, /rank 0 in barrier timed out .* barrier\[from rank 1\].*trapped/);
      return true;
    });
    assert.equal(group.snapshot()[0].state, 'failed');
    assert.equal(group.snapshot()[0].error.code, 'TIMEOUT_GPU');
    // The peer is told: rank 1 fails with RANK_FAILED naming rank 0.
    await waitFor(() => group.snapshot()[1].state === 'failed');
    assert.equal(group.snapshot()[1].error.code, 'RANK_FAILED');
    assert.deepEqual(failures.map((f) => f.rank).sort(), [0, 1]);
    // A trap poisons CUDA for the whole process (sticky launch failure), so rank 1's context on GPU 1
    // is dead too (2x H200: CUDA_ERROR_LAUNCH_FAILED); its error says that rank 0's trap did it.
    // (In separate processes the peer keeps its GPU: world.test.mjs.)
    const probe1 = await group.readWindow(1, 0, 8).then(() => null, (e) => e);
    console.log(`rank 1's GPU after rank 0's trap: ${probe1 ? `${probe1.code} (rank ${probe1.rank}): ${probe1.message}` : 'ok'}`);
    if (probe1) {
      assert.equal(probe1.code, 'RANK_FAILED');
      assert.equal(probe1.rank, 0);
      assert.match(probe1.message, /rank 0's kernel on GPU 0 trapped .*sticky for the whole process/);
    }
  } finally {
    await group.destroy();
  }
  assert.deepEqual(group.snapshot().map((r) => r.state), ['destroyed', 'destroyed']);
});

async function waitFor(cond, ms = 10_000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 20));
  }
}
