/**
 * A rank's error reaches the caller with its code, rank and phase, also when a rank program throws it
 * (errors cross the worker boundary through comlink, which by itself keeps only message and name).
 */
import { expect, test } from 'vitest';
import { createGroup } from '../actors/index.js';

test('a rank program whose barrier times out rejects with TIMEOUT_GPU naming the peer and the phase', async () => {
  const group = await createGroup({
    backend: 'host', ranks: 2, buffer: { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 4 }, timeouts: { gpuSeconds: 1 },
  });
  try {
    await expect(group.run(new URL('./fixtures/lonely-barrier.mjs', import.meta.url))).rejects.toMatchObject({
      code: 'TIMEOUT_GPU', rank: 1, phase: 'barrier', message: expect.stringMatching(/rank 0 in barrier timed out/),
    });
  } finally {
    await group.destroy();
  }
});
