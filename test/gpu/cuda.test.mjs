// The CUDA backend: the probe; group lifecycle with every memory kind; ranks that share a GPU (no
// NCCL between them, each with its share of the SMs); barrier with and without CPU sync and allGather
// checked against the host backend, in every layout the machine has; fds released. (Dispatch and
// combine: moe.test.mjs; sessions, engram, pipeline: agrs.test.mjs; faults: failure / timeout.)
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';

import {
  BUFFER, MiB, bytesOfTensor, createGroup, cudaGroup, gpuCount, hostGroup, layouts, needsTwoGpus, openFds, pattern, range, requireGpu,
} from './helpers.mjs';

let probe;
before(() => {
  probe = requireGpu();
});

describe('cudaProbe', () => {
  test('reports the GPUs (with their UUIDs), the embedded kernels and NCCL', () => {
    assert.equal(probe.available, true);
    assert.ok(probe.kernels.images >= 8, `kernel images: ${JSON.stringify(probe.kernels)}`);
    assert.equal(probe.gpus.length, probe.devices);
    for (const g of probe.gpus) {
      assert.match(g.arch, /^sm_\d+$/);
      assert.match(g.uuid, /^GPU-[0-9a-f-]{36}$/);
      assert.ok(g.sms > 0);
      assert.equal(g.vmmPosixFd, true);
      assert.equal(g.cooperativeLaunch, true);
    }
    assert.match(probe.nccl.version ?? '', /^2\.\d+\.\d+$/, `nccl: ${JSON.stringify(probe.nccl)}`);
    console.log(`probe: ${probe.devices} x ${probe.gpus[0].name} ${probe.gpus[0].arch} (${probe.gpus[0].sms} SMs), driver ${probe.driverVersion}, NCCL ${probe.nccl.version} (${probe.nccl.origin}), kernels ${probe.kernels.note}`);
  });
});

describe('devices', () => {
  test('without devices, more ranks than GPUs is EINVAL saying how to share a GPU on purpose', async () => {
    await assert.rejects(createGroup({ backend: 'cuda', ranks: gpuCount() + 1, buffer: BUFFER }),
      { code: 'EINVAL', message: /ranks: .*exceeds the GPU count.*devices: \[/ });
  });

  test('a GPU that does not exist is EINVAL naming the entry', async () => {
    await assert.rejects(createGroup({ backend: 'cuda', ranks: 2, devices: [0, gpuCount()], buffer: BUFFER }), { code: 'EINVAL', message: /devices\[1\].*does not exist/ });
    await assert.rejects(createGroup({ backend: 'cuda', ranks: 2, devices: [0], buffer: BUFFER }), { code: 'EINVAL', message: /devices/ });
  });

  test('ranks default to the GPU count, one per GPU', async () => {
    const group = await createGroup({ backend: 'cuda', buffer: BUFFER });
    try {
      assert.equal(group.size, gpuCount());
      for (let r = 0; r < group.size; r++) assert.equal((await group.info(r)).device.ordinal, r);
    } finally {
      await group.destroy();
    }
  });

  test('kernel launches go through the kept graphs where a rank has its GPU to itself, directly for ranks sharing a GPU and with RANKFLOW_GRAPH_LAUNCH=0; the same results', async () => {
    const gathered = async (opts) => {
      const group = await createGroup({ backend: 'cuda', buffer: BUFFER, ...opts });
      try {
        const out = [];
        for (let round = 0; round < 3; round++) {
          await group.barrier();
          await group.barrier({ withCpuSync: true });
          const got = await group.allGather(range(group.size).map((r) => pattern('bf16', [5, 64], r, round)));
          out.push(got.map((t) => Buffer.from(bytesOfTensor(t))));
        }
        const launches = [];
        for (let r = 0; r < group.size; r++) launches.push((await group.info(r)).device);
        return { out, launches };
      } finally {
        await group.destroy();
      }
    };
    const own = await gathered({ ranks: 1, devices: [0] });
    for (const d of own.launches) assert.ok(d.graphLaunches >= 9 && d.directLaunches === 0, `own GPU: ${JSON.stringify(d)}`);
    const shared = await gathered({ ranks: 2, devices: [0, 0] });
    for (const d of shared.launches) assert.ok(d.graphLaunches === 0 && d.directLaunches >= 9, `shared GPU: ${JSON.stringify(d)}`);
    const saved = process.env.RANKFLOW_GRAPH_LAUNCH;
    process.env.RANKFLOW_GRAPH_LAUNCH = '0';
    let off;
    try {
      off = await gathered({ ranks: 1, devices: [0] });
    } finally {
      if (saved === undefined) delete process.env.RANKFLOW_GRAPH_LAUNCH;
      else process.env.RANKFLOW_GRAPH_LAUNCH = saved;
    }
    for (const d of off.launches) assert.ok(d.graphLaunches === 0 && d.directLaunches >= 9, `RANKFLOW_GRAPH_LAUNCH=0: ${JSON.stringify(d)}`);
    for (let round = 0; round < 3; round++) {
      const want = Buffer.from(bytesOfTensor(pattern('bf16', [5, 64], 0, round)));
      assert.ok(own.out[round][0].equals(want), `graph-launched allGather, round ${round}`);
      assert.ok(off.out[round][0].equals(want), `direct allGather, round ${round}`);
      for (let r = 0; r < 2; r++)
        assert.ok(shared.out[round][r].equals(Buffer.concat([0, 1].map((q) => Buffer.from(bytesOfTensor(pattern('bf16', [5, 64], q, round)))))), `shared allGather, rank ${r}, round ${round}`);
    }
  });

  test('devices picks the GPU of each rank', { skip: needsTwoGpus() }, async () => {
    const group = await createGroup({ backend: 'cuda', ranks: 2, devices: [1, 0], buffer: BUFFER });
    try {
      assert.equal((await group.info(0)).device.ordinal, 1);
      assert.equal((await group.info(1)).device.ordinal, 0);
      await group.barrier();
    } finally {
      await group.destroy();
    }
  });

  test('4 ranks on GPU 0: no NCCL communicator, each rank a quarter of the SMs, and the NCCL baseline says why it is unavailable', async () => {
    const group = await createGroup({ backend: 'cuda', ranks: 4, devices: [0, 0, 0, 0], buffer: BUFFER });
    try {
      for (let r = 0; r < 4; r++) {
        const info = await group.info(r);
        assert.equal(info.device.ordinal, 0);
        assert.equal(info.device.nccl, false);
        assert.equal(info.device.smShare, Math.floor(info.device.sms / 4));
      }
      const bench = new URL('./programs/nccl-baseline.mjs', import.meta.url);
      await assert.rejects(group.run(bench), { code: 'EINVAL', message: /NCCL is unavailable in this group: its ranks share a GPU/ });
      await group.barrier();  // a refusal leaves the ranks usable
    } finally {
      await group.destroy();
    }
  });
});

for (const layout of layouts([2, 4])) {
  describe(`lifecycle: ${layout.name}`, () => {
    const kinds = [
      { kind: 'gpu', buffer: { ...BUFFER, cpuBytes: 0 } },
      { kind: 'hybrid', buffer: { ...BUFFER, cpuBytes: 2 * MiB, hybrid: true } },
      { kind: 'elastic', buffer: { ...BUFFER, cpuBytes: 2 * MiB, hybrid: false } },
    ];
    for (const { kind, buffer } of kinds) {
      test(`${kind} memory: create -> ready -> destroy, flat windows, a peer's write lands in its window`, async () => {
        const seen = [];
        const group = await cudaGroup(layout, { buffer });
        group.on('transition', (t) => seen.push(`${t.rank}:${t.to}`));
        const W = layout.ranks;
        try {
          assert.equal(group.backend, 'cuda');
          assert.deepEqual(group.snapshot().map((r) => r.state), Array(W).fill('ready'));
          const infos = await Promise.all(range(W).map((r) => group.info(r)));
          infos.forEach((info, r) => {
            assert.equal(info.backend, 'cuda');
            assert.equal(info.memoryKind, kind);
            assert.equal(info.device.ordinal, layout.devices[r]);
            assert.equal(info.device.nccl, layout.distinct);
            // Flat VA: rank p's window at base + p * stride, in every rank's own reservation.
            info.peerWindows.forEach((w, p) => assert.equal(w, info.peerWindows[0] + BigInt(p * info.stride)));
            assert.equal(info.window, info.peerWindows[r]);
          });
          // Rank 0 writes into rank W-1's buffer through its own mapping; rank W-1 reads it.
          const at = infos[0].workspaceBytes + 4096;
          const bytes = Uint8Array.from({ length: 4096 }, (_, i) => (i * 7 + 3) & 0xff);
          const dst = await group.writePeer(0, W - 1, at, bytes);
          assert.equal(dst, infos[0].peerWindows[W - 1] + BigInt(at));
          assert.deepEqual(await group.readWindow(W - 1, at, bytes.length), bytes);
        } finally {
          await group.destroy();
        }
        assert.deepEqual(group.snapshot().map((r) => r.state), Array(W).fill('destroyed'));
        assert.ok(range(W).every((r) => seen.includes(`${r}:destroyed`)), seen.join(' '));
      });
    }
  });

  describe(`collectives: ${layout.name}`, () => {
    let group;
    let host;
    const W = layout.ranks;
    before(async () => {
      [group, host] = await Promise.all([cudaGroup(layout), hostGroup(layout)]);
    });
    after(async () => {
      await Promise.all([group?.destroy(), host?.destroy()]);
    });

    test('barrier 500 times, then 500 times with CPU sync; every rank stays in step', async () => {
      const phases = new Set();
      const onTransition = (t) => { if (t.from === 'barrier') phases.add(t.phases.join('+')); };
      group.on('transition', onTransition);
      const seq0 = group.ranks[0].seq;
      let t0 = performance.now();
      for (let i = 0; i < 500; i++) await group.barrier();
      const plain = (performance.now() - t0) / 500;
      t0 = performance.now();
      for (let i = 0; i < 500; i++) await group.barrier({ withCpuSync: true });
      const synced = (performance.now() - t0) / 500;
      group.off('transition', onTransition);
      for (const r of group.ranks) assert.equal(r.seq, seq0 + 1000);
      assert.deepEqual([...phases].sort(), ['device', 'device+cpuSync']);
      assert.deepEqual(group.snapshot().map((r) => r.state), Array(W).fill('ready'));
      console.log(`${layout.name}: barrier through the group API ${(plain * 1000).toFixed(1)} us, with CPU sync ${(synced * 1000).toFixed(1)} us`);
    });

    const cases = [
      ['fp32', [1]], ['bf16', [3, 5]], ['fp8e4m3', [4097]], ['int32', [128, 33]], ['bf16', [16, 7168]], ['bf16', [96, 7168]],
    ];
    for (const [dtype, shape] of cases) {
      test(`allGather ${dtype} [${shape}] equals the host backend's, 3 rounds`, async () => {
        for (let round = 0; round < 3; round++) {
          const inputs = range(W).map((r) => pattern(dtype, shape, r, round));
          const [got, want] = await Promise.all([group.allGather(inputs), host.allGather(inputs)]);
          for (let r = 0; r < W; r++) {
            assert.equal(got[r].dtype, dtype);
            assert.deepEqual(got[r].shape, want[r].shape);
            assert.deepEqual(bytesOfTensor(got[r]), bytesOfTensor(want[r]), `rank ${r}, round ${round}`);
          }
        }
      });
    }

    test('allGather of device tensors in a rank program equals the host group\'s allGather', async () => {
      const program = new URL('./programs/device-gather.mjs', import.meta.url);
      const got = await group.run(program, { shape: [33, 64] });
      const want = await host.allGather(range(W).map((r) => pattern('bf16', [33, 64], r, 7)));
      got.forEach((g, r) => assert.ok(Buffer.from(g).equals(Buffer.from(bytesOfTensor(want[r]))), `rank ${r}`));
    });
  });
}

describe('teardown', () => {
  test('every fd is given back after destroy (ranks sharing a GPU and one per GPU)', async () => {
    for (const layout of layouts([2])) {
      // A first group warms up what the driver and NCCL keep for the life of the process.
      const warm = await cudaGroup(layout, { buffer: { ...BUFFER, cpuBytes: 2 * MiB } });
      await warm.barrier();
      await warm.destroy();
      const before = openFds();
      const group = await cudaGroup(layout, { buffer: { ...BUFFER, cpuBytes: 2 * MiB } });
      await group.barrier({ withCpuSync: true });
      await group.allGather(range(layout.ranks).map((r) => pattern('bf16', [64, 128], r, 0)));
      assert.ok(openFds() > before, 'a live group holds fds (its exported segments)');
      await group.destroy();
      await group.destroy();
      assert.equal(openFds(), before, layout.name);
    }
  });
});
