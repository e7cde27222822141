/**
 * A rank's error reaches the caller with its code, rank and phase, also when a rank program throws it
 * (errors cross the worker boundary through comlink, which by itself keeps only message and name).
 * On the host backend every wait is a CPU wait: its timeout is TIMEOUT_CPU, after cpuSeconds.
 */
import { expect, test } from 'vitest';
import { createGroup } from '../actors/index.js';
import { program } from './helpers/group.js';

const buffer = { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 4 };

test('a rank program whose barrier times out (its peer never enters it, never ends) rejects with TIMEOUT_CPU naming the peer and the phase', async () => {
  const group = await createGroup({ backend: 'host', ranks: 2, buffer, timeouts: { cpuSeconds: 1 } });
  try {
    await expect(group.run(program('late-barrier.mjs'), { late: 1, ms: null })).rejects.toMatchObject({
      code: 'TIMEOUT_CPU', rank: 1, phase: 'barrier', message: expect.stringMatching(/^wait of rank 0 in barrier timed out after 1 s on counter barrier\[from rank 1\]/),
    });
  } finally {
    await group.destroy();
  }
});

test('gpuSeconds does not bound a host wait: cpuSeconds does', async () => {
  const group = await createGroup({ backend: 'host', ranks: 2, buffer, timeouts: { gpuSeconds: 0.2, cpuSeconds: 1.5 } });
  try {
    const t0 = performance.now();
    await expect(group.run(program('late-barrier.mjs'), { late: 1, ms: null })).rejects.toMatchObject({ code: 'TIMEOUT_CPU' });
    expect(performance.now() - t0).toBeGreaterThan(1400);
  } finally {
    await group.destroy();
  }
});

test('a rank program that returns before a barrier its peer waits in: the peer is released at once, the run rejects with STATE naming the rank that returned', async () => {
  const group = await createGroup({ backend: 'host', ranks: 2, buffer });
  try {
    const t0 = performance.now();
    const e = await group.run(new URL('./fixtures/lonely-barrier.mjs', import.meta.url)).then(() => null, (err: unknown) => err);
    expect(performance.now() - t0).toBeLessThan(5000);  // not the 300 s of the default timeout
    expect(e).toMatchObject({ name: 'RankflowError', code: 'STATE', rank: 1, message: expect.stringMatching(/^group\.run: rank 1's program returned after collective #\d+ while its peers went on/) });
    expect((e as Error).cause).toMatchObject({ code: 'ABORTED', rank: 1, message: expect.stringMatching(/\(rank 0 was released from (barrier|the start of its next op), collective #\d+\)$/) });
    // (where rank 0 was when the release came is a race: already waiting in the barrier, or not yet in it)
    expect(group.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
    await group.barrier();
  } finally {
    await group.destroy();
  }
});
