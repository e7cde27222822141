// Host-to-device copies of ranks sharing one GPU must not wait on each other inside the driver. A
// copy from pageable host memory goes through the CUDA driver's staging buffers, shared by the whole
// process: one rank's large upload queued behind its own put kernel (which waits for the peers) held
// them, so a peer that had not launched its put yet blocked in its own upload, and the gather timed
// out (TIMEOUT_GPU after the GPU timeout; seen in 1 of 7 runs of agrs-inplace.test.mjs with 4 ranks).
// Every copy from host memory now goes through the rank's own pinned staging (memory.cc from_host),
// which a graph cannot replay: an upload inside rank.capture() is refused, while a tensor made there
// without data is zeroed by a memset node that every replay runs.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';

import { MiB, createGroup, layouts, range, requireGpu } from './helpers.mjs';

before(() => requireGpu());

const ROWS = 1024, ITERS = 6;

for (const layout of layouts([2, 4])) {
  const W = layout.ranks;
  describe(`uploads behind waiting kernels: ${layout.name}`, () => {
    let gpu;
    before(async () => {
      gpu = await createGroup({ backend: 'cuda', ranks: W, devices: layout.devices, buffer: { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 4, bytes: 16 * MiB } });
    });
    after(async () => gpu?.destroy());

    test('a late rank launches its gather while the others upload 32 MiB from pageable memory; gathers and uploads are exact', async () => {
      const res = await gpu.run(new URL('./programs/upload-behind-async.mjs', import.meta.url), { iters: ITERS, rows: ROWS, bigBytes: 32 * MiB, skewMs: 200 });
      for (const r of range(W)) {
        assert.equal(res[r].end, 'ready');
        for (let i = 0; i < ITERS; i++) {
          const want = range(W * ROWS).map((k) => Math.floor(k / ROWS) * 1_000_000 + i * ROWS + (k % ROWS));
          assert.deepEqual(res[r].out[i], want, `rank ${r} gather ${i}`);
        }
        assert.equal(res[r].lastFirst, r * 100 + ITERS - 1);
        assert.equal(res[r].lastEnd, r * 100 + ITERS - 1);
      }
    });

    test('an upload inside rank.capture() is refused with STATE; the rank goes on (barrier, upload, a graph after it); a tensor made without data inside a capture is zeroed by every replay', async () => {
      const res = await gpu.run(new URL('./programs/upload-in-capture.mjs', import.meta.url), {});
      for (const r of range(W)) {
        assert.equal(res[r].refused?.code, 'STATE', `rank ${r}: ${JSON.stringify(res[r].refused)}`);
        assert.match(res[r].refused.message, /inside rank\.capture\(\)/);
        assert.deepEqual(res[r].back, range(256).map((i) => i + r));
        assert.deepEqual(res[r].uploaded, Array(64).fill(5));
        assert.deepEqual(res[r].zeroed, [Array(64).fill(0), Array(64).fill(0)]);
        assert.equal(res[r].end, 'ready');
      }
    });
  });
}
