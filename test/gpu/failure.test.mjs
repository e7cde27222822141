// Faults on cuda in one process: a rank whose worker ends abruptly while its peer waits in a kernel
// or in a dispatch's CPU sync. The main thread writes the failure into the peer's abort words (shared
// memory the peer's waits and, through a mapped mirror, its kernels read), so the peer rejects with
// RANK_FAILED naming the dead rank long before gpuSeconds; destroy gives every fd back. Runs with the
// ranks sharing GPU 0, 2 and 4 of them (and on 2 GPUs where there are).
import { before, test } from 'node:test';
import assert from 'node:assert/strict';

import { cudaGroup, layouts, openFds, range, requireGpu, waitFor } from './helpers.mjs';
import { MOE_BUFFER } from './moe-inputs.mjs';

before(() => requireGpu());

const LATE = new URL('./programs/late-barrier.mjs', import.meta.url);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const CASES = [
  { op: 'barrier', state: 'barrier' },
  { op: 'barrierCpuSync', state: 'barrier' },
  { op: 'allGather', state: 'allGathering' },
  { op: 'dispatch', state: 'dispatching.cpuSync' },
  { op: 'combine', state: 'combining' },
];
for (const layout of layouts([2, 4]))
  for (const { op, state } of CASES) test(`${layout.name}: rank 1 terminated while rank 0 waits in its ${op}: rank 0 fails RANK_FAILED naming rank 1, its wait is released, destroy gives everything back`, { timeout: 90_000 }, async () => {
    // A first group warms up what the driver keeps for the life of the process.
    const warm = await cudaGroup(layout, { buffer: MOE_BUFFER });
    await warm.barrier();
    await warm.destroy();
    const fds = openFds();

    // gpuSeconds far beyond the test's timeout: only the release can end rank 0's wait in time.
    const group = await cudaGroup(layout, { buffer: MOE_BUFFER, timeouts: { gpuSeconds: 600, cpuSeconds: 600 } });
    const failures = [];
    group.on('failed', ({ rank, error }) => failures.push({ rank, code: error.code, errorRank: error.rank }));
    let killed;
    const t0 = Date.now();
    try {
      const waiting = new Promise((resolve) => group.on('transition', (t) => { if (t.rank === 0 && t.to === state) resolve(); }));
      const run = group.run(LATE, { sleepMs: 600_000, op });
      await waiting;
      await sleep(500);  // rank 0 is waiting for rank 1 now
      killed = group.ranks[1].terminate();
      await assert.rejects(run, (e) => {
        console.log(`${op}: the program's error after ${Date.now() - t0} ms: ${JSON.stringify({ code: e.code, rank: e.rank, phase: e.phase, message: e.message })}`);
        assert.equal(e.code, 'RANK_FAILED');
        assert.equal(e.rank, 1);
        return true;
      });
      // Every rank's own report follows (the run rejected as soon as rank 1 was gone).
      await waitFor(() => group.snapshot().every((r) => r.state === 'failed'));
      assert.deepEqual(group.snapshot().map((r) => [r.state, r.error?.code, r.error?.rank]), range(layout.ranks).map(() => ['failed', 'RANK_FAILED', 1]));
      await assert.rejects(group.barrier(), { code: 'RANK_FAILED', rank: 1 });
      assert.deepEqual(failures.map((f) => f.rank).sort(), range(layout.ranks));
    } finally {
      await group.destroy();
      await killed;
    }
    assert.deepEqual(group.snapshot().map((r) => r.state), range(layout.ranks).map(() => 'destroyed'));
    assert.equal(openFds(), fds);
  });
