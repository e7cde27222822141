/**
 * Backend selection on a machine without a usable GPU (CI): `cuda` is refused with the probe's
 * reason, `auto` runs on the host backend, and `devices` is checked before any rank starts.
 */
import { describe, expect, test } from 'vitest';
import { createGroup, probeCuda, RankflowError } from '../actors/index.js';

const buffer = { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 4 };
const probe = probeCuda();

describe.skipIf(probe.available)('without a usable GPU', () => {
  test('the probe says why, without throwing', () => {
    expect(probe.available).toBe(false);
    expect(probe.reason).toMatch(/libcuda|GPU|CUDA/);
  });

  test("backend 'cuda' is refused with BACKEND_UNAVAILABLE and the probe's reason", async () => {
    const error = await createGroup({ backend: 'cuda', ranks: 2, buffer }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RankflowError);
    expect((error as RankflowError).code).toBe('BACKEND_UNAVAILABLE');
    expect((error as RankflowError).message).toContain(`backend 'cuda' is unavailable: ${probe.reason}`);
  });

  test("backend 'auto' runs on the host backend", async () => {
    const group = await createGroup({ backend: 'auto', ranks: 2, buffer });
    try {
      expect(group.backend).toBe('host');
      expect((await group.info(0)).backend).toBe('host');
      await group.barrier();
    } finally {
      await group.destroy();
    }
  });
});

describe('devices', () => {
  test.each([
    [[0], /devices: has 1 entries/],
    [[0, -1], /devices\[1\]: must be a non-negative integer/],
    ['0,1', /devices: must be an array/],
  ])('%j is refused with EINVAL naming devices', async (devices, message) => {
    await expect(createGroup({ backend: 'host', ranks: 2, buffer, devices: devices as never })).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(message) });
  });

  test('a GPU may be named twice: those ranks share it (on host the ordinals are checked, then unused)', async () => {
    const g = await createGroup({ backend: 'host', ranks: 2, buffer, devices: [0, 0] });
    try {
      expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
    } finally {
      await g.destroy();
    }
  });
});
