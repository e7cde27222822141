// The CUDA backend on 2 GPUs: group lifecycle with every memory kind, barrier with and without CPU
// sync, allGather checked against the host backend, fds released (dispatch/combine: moe.test.mjs; sessions, engram, pipeline: agrs.test.mjs).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';

import {
  BUFFER, MiB, bytesOfTensor, createGroup, cudaGroup, hostGroup, openFds, pattern, requireTwoGpus,
} from './helpers.mjs';

let probe;
before(() => {
  probe = requireTwoGpus();
});

describe('cudaProbe', () => {
  test('reports the GPUs, the embedded kernels and NCCL', () => {
    assert.equal(probe.available, true);
    assert.equal(probe.groups, true);
    assert.ok(probe.kernels.images >= 2, `kernel images: ${JSON.stringify(probe.kernels)}`);
    assert.equal(probe.gpus.length, probe.devices);
    for (const g of probe.gpus) {
      assert.match(g.arch, /^sm_\d+$/);
      assert.ok(g.sms > 0);
      assert.equal(g.vmmPosixFd, true);
    }
    assert.match(probe.nccl.version ?? '', /^2\.\d+\.\d+$/, `nccl: ${JSON.stringify(probe.nccl)}`);
    console.log(`probe: ${probe.devices} x ${probe.gpus[0].name} ${probe.gpus[0].arch}, driver ${probe.driverVersion}, NCCL ${probe.nccl.version} (${probe.nccl.origin}), kernels ${probe.kernels.note}`);
  });
});

describe('lifecycle', () => {
  const kinds = [
    { kind: 'gpu', buffer: { ...BUFFER, cpuBytes: 0 } },
    { kind: 'hybrid', buffer: { ...BUFFER, cpuBytes: 2 * MiB, hybrid: true } },
    { kind: 'elastic', buffer: { ...BUFFER, cpuBytes: 2 * MiB, hybrid: false } },
  ];
  for (const { kind, buffer } of kinds) {
    test(`${kind} memory: create -> ready -> destroy, one GPU per rank, flat windows`, async () => {
      const seen = [];
      const group = await createGroup({ backend: 'cuda', ranks: 2, buffer });
      group.on('transition', (t) => seen.push(`${t.rank}:${t.to}`));
      try {
        assert.equal(group.backend, 'cuda');
        assert.deepEqual(group.snapshot().map((r) => r.state), ['ready', 'ready']);
        const infos = [await group.info(0), await group.info(1)];
        infos.forEach((info, r) => {
          assert.equal(info.backend, 'cuda');
          assert.equal(info.memoryKind, kind);
          assert.equal(info.device.ordinal, r);
          assert.equal(info.device.nccl, true);
          // Flat VA: rank p's window at base + p * stride, in every rank's own reservation.
          info.peerWindows.forEach((w, p) => assert.equal(w, info.peerWindows[0] + BigInt(p * info.stride)));
          assert.equal(info.window, info.peerWindows[r]);
        });
        // Rank 0 writes into rank 1's buffer through its own mapping; rank 1 reads it from its GPU.
        const at = infos[0].workspaceBytes + 4096;
        const bytes = Uint8Array.from({ length: 4096 }, (_, i) => (i * 7 + 3) & 0xff);
        const dst = await group.writePeer(0, 1, at, bytes);
        assert.equal(dst, infos[0].peerWindows[1] + BigInt(at));
        assert.deepEqual(await group.readWindow(1, at, bytes.length), bytes);
      } finally {
        await group.destroy();
      }
      assert.deepEqual(group.snapshot().map((r) => r.state), ['destroyed', 'destroyed']);
      assert.ok(seen.includes('0:destroyed') && seen.includes('1:destroyed'), seen.join(' '));
    });
  }

  test('devices picks the GPU of each rank', async () => {
    const group = await cudaGroup({ devices: [1, 0] });
    try {
      assert.equal((await group.info(0)).device.ordinal, 1);
      assert.equal((await group.info(1)).device.ordinal, 0);
      await group.barrier();
    } finally {
      await group.destroy();
    }
  });

  test('devices that are not one distinct GPU per rank are refused with EINVAL naming devices', async () => {
    await assert.rejects(cudaGroup({ devices: [0, 0] }), { code: 'EINVAL', message: /devices\[1\]/ });
    await assert.rejects(cudaGroup({ devices: [0, probe.devices] }), { code: 'EINVAL', message: /devices\[1\].*does not exist/ });
    await assert.rejects(cudaGroup({ devices: [0] }), { code: 'EINVAL', message: /devices/ });
  });

  test('ranks default to the GPU count', async () => {
    const group = await createGroup({ backend: 'cuda', buffer: BUFFER });
    try {
      assert.equal(group.size, probe.devices);
    } finally {
      await group.destroy();
    }
  });
});

describe('collectives on 2 GPUs', () => {
  let group;
  let host;
  before(async () => {
    [group, host] = await Promise.all([cudaGroup(), hostGroup()]);
  });
  after(async () => {
    await Promise.all([group?.destroy(), host?.destroy()]);
  });

  test('barrier 1000 times, then 1000 times with CPU sync; every rank stays in step', async () => {
    const states = new Set();
    const onTransition = (t) => states.add(t.to);
    group.on('transition', onTransition);
    const seq0 = group.ranks[0].seq;
    let t0 = performance.now();
    for (let i = 0; i < 1000; i++) await group.barrier();
    const plain = (performance.now() - t0) / 1000;
    t0 = performance.now();
    for (let i = 0; i < 1000; i++) await group.barrier({ withCpuSync: true });
    const synced = (performance.now() - t0) / 1000;
    group.off('transition', onTransition);
    assert.equal(group.ranks[0].seq, seq0 + 2000);
    assert.equal(group.ranks[1].seq, seq0 + 2000);
    assert.ok(states.has('barrier.device') && states.has('barrier.cpuSync'), [...states].join(' '));
    assert.deepEqual(group.snapshot().map((r) => r.state), ['ready', 'ready']);
    console.log(`barrier through the group API: ${(plain * 1000).toFixed(1)} us, with CPU sync ${(synced * 1000).toFixed(1)} us`);
  });

  const cases = [
    ['fp32', [1]], ['bf16', [3, 5]], ['fp8e4m3', [4097]], ['int32', [128, 33]], ['bf16', [16, 7168]], ['bf16', [128, 7168]],
  ];
  for (const [dtype, shape] of cases) {
    test(`allGather ${dtype} [${shape}] equals the host backend's, 3 rounds`, async () => {
      for (let round = 0; round < 3; round++) {
        const inputs = [0, 1].map((r) => pattern(dtype, shape, r, round));
        const [got, want] = await Promise.all([group.allGather(inputs), host.allGather(inputs)]);
        for (let r = 0; r < 2; r++) {
          assert.equal(got[r].dtype, dtype);
          assert.deepEqual(got[r].shape, want[r].shape);
          assert.deepEqual(bytesOfTensor(got[r]), bytesOfTensor(want[r]), `rank ${r}, round ${round}`);
        }
      }
    });
  }

});

describe('teardown', () => {
  test('every fd is given back after destroy', async () => {
    // A first group warms up what the driver and NCCL keep for the life of the process.
    const warm = await cudaGroup({ buffer: { ...BUFFER, cpuBytes: 2 * MiB } });
    await warm.barrier();
    await warm.destroy();
    const before = openFds();
    const group = await cudaGroup({ buffer: { ...BUFFER, cpuBytes: 2 * MiB } });
    await group.barrier({ withCpuSync: true });
    await group.allGather([0, 1].map((r) => pattern('bf16', [64, 128], r, 0)));
    assert.ok(openFds() > before, 'a live group holds fds (its exported segments)');
    await group.destroy();
    await group.destroy();
    assert.equal(openFds(), before);
  });
});
