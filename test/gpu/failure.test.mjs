// Faults on cuda in one process (issue 9): a rank whose worker ends abruptly while its peer waits in
// a barrier kernel. The peer's kernel is let go (far-future epochs in its own slots, rank.cc), so the
// peer rejects with RANK_FAILED naming the dead rank long before gpuSeconds; the communicators are
// aborted rather than torn down together; destroy gives every fd back.
import { before, test } from 'node:test';
import assert from 'node:assert/strict';

import { cudaGroup, openFds, requireTwoGpus } from './helpers.mjs';

before(() => requireTwoGpus());

const LATE_BARRIER = new URL('./programs/late-barrier.mjs', import.meta.url);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const CASES = [
  { op: 'barrier', state: 'barrier.device' },
  { op: 'barrierCpuSync', state: 'barrier.device' },
  { op: 'allGather', state: 'allGathering' },
];
for (const { op, state } of CASES) test(`rank 1 terminated while rank 0 waits in its ${op} kernel: rank 0 fails RANK_FAILED naming rank 1, its kernel is released, destroy gives everything back`, { timeout: 90_000 }, async () => {
  // A first group warms up what the driver and NCCL keep for the life of the process.
  const warm = await cudaGroup();
  await warm.barrier();
  await warm.destroy();
  const fds = openFds();

  // gpuSeconds far beyond the test's timeout: only the release can end rank 0's wait in time.
  const group = await cudaGroup({ timeouts: { gpuSeconds: 600 } });
  const failures = [];
  group.on('failed', ({ rank, error }) => failures.push({ rank, code: error.code, errorRank: error.rank }));
  let killed;
  try {
    const inKernel = new Promise((resolve) => group.on('transition', (t) => { if (t.rank === 0 && t.to === state) resolve(); }));
    const run = group.run(LATE_BARRIER, { sleepMs: 600_000, op });
    await inKernel;
    await sleep(500);  // rank 0's kernel is waiting on GPU 0 for rank 1 now
    killed = group.ranks[1].terminate();
    await assert.rejects(run, (e) => {
      console.log(`the program's error: ${JSON.stringify({ code: e.code, rank: e.rank, phase: e.phase, message: e.message })}`);
      assert.equal(e.code, 'RANK_FAILED');
      assert.equal(e.rank, 1);
      return true;
    });
    // Rank 0's executor answers only once its kernel returned: the released wait marks the rank's
    // protocol state gone, and every later call on it says why.
    await assert.rejects(group.readWindow(0, 0, 8), (e) => {
      console.log(`rank 0 after the release: ${JSON.stringify({ code: e.code, rank: e.rank, message: e.message })}`);
      assert.equal(e.code, 'RANK_FAILED');
      assert.match(e.message, /released after rank 1 failed/);
      return true;
    });
    assert.deepEqual(group.snapshot().map((r) => [r.state, r.error?.code, r.error?.rank]), [['failed', 'RANK_FAILED', 1], ['failed', 'RANK_FAILED', 1]]);
    await assert.rejects(group.barrier(), { code: 'RANK_FAILED', rank: 1 });
    assert.deepEqual(failures.map((f) => f.rank).sort(), [0, 1]);
  } finally {
    await group.destroy();
    await killed;
  }
  assert.deepEqual(group.snapshot().map((r) => r.state), ['destroyed', 'destroyed']);
  assert.equal(openFds(), fds);
});
