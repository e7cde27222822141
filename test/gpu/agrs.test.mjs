// AGRS sessions, reduce-scatter, engram and pipeline send/recv on cuda (2 and 4 ranks sharing GPU 0,
// and one rank per GPU where there are two), each checked byte for
// byte against a host group running the same calls on the same inputs (the host executor is the
// oracle: same protocol, slots, layouts, fp32 accumulation in rank order, bf16 round to nearest even).
// Sizes are chosen to cover both put engines: peer-pointer kernels (16-byte multiples below
// 1 MiB per destination) and copy engines (from 1 MiB, and any size that is not a 16-byte multiple).
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';

import { bytesOfTensor, createGroup, cudaAndHost, cudaGroup, hostGroup, layouts, MiB, pattern, range, recordPaths, requireGpu, tensor } from './helpers.mjs';

const BUFFER = { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 4, bytes: 64 * MiB };

before(() => requireGpu());

function assertSameBytes(got, want, what) {
  assert.equal(got.length, want.length, what);
  for (let r = 0; r < got.length; r++) {
    assert.equal(got[r].dtype, want[r].dtype, `${what}: rank ${r} dtype`);
    assert.deepEqual(got[r].shape, want[r].shape, `${what}: rank ${r} shape`);
    assert.ok(Buffer.from(bytesOfTensor(got[r])).equals(Buffer.from(bytesOfTensor(want[r]))), `${what}: rank ${r} bytes differ`);
  }
}

// Each round: open -> allGather x3 (various dtypes and sizes) -> reduceScatter fp32 and bf16 -> close.
const rounds = [
  { gathers: [['fp32', [3, 5]], ['bf16', [64, 128]], ['int32', [300_001]]], rs: [['fp32', 4099], ['bf16', 65_536]] },
  { gathers: [['bf16', [1]], ['fp32', [262_144]], ['int32', [1024, 3]]], rs: [['fp32', 4096], ['bf16', 1001]] },
  { gathers: [['int32', [7]], ['bf16', [1024, 1024]], ['fp32', [16]]], rs: [['fp32', 300_000], ['bf16', 524_288]] },
];

async function sessionRound(gpu, host, round, i) {
  const W = gpu.worldSize;
  const sizes = [...round.gathers.map(([d, s]) => s.reduce((a, b) => a * b, 1) * (d === 'bf16' ? 2 : 4)), ...round.rs.map(([d, n]) => n * (d === 'bf16' ? 2 : 4))];
  const opts = { maxBytes: Math.max(...sizes), maxAllGathers: 5 };
  const sg = await gpu.openSession(opts);
  const sh = await host.openSession(opts);
  try {
    let k = 0;
    for (const [dtype, shape] of round.gathers) {
      const inputs = range(W).map((r) => pattern(dtype, shape, r, 10 * i + k++));
      assertSameBytes(await sg.allGather(inputs), await sh.allGather(inputs), `allGather ${dtype} [${shape}]`);
    }
    for (const [dtype, n] of round.rs) {
      const inputs = range(W).map((r) => pattern(dtype, [W * n], r, 10 * i + k++));
      assertSameBytes(await sg.reduceScatter(inputs), await sh.reduceScatter(inputs), `reduceScatter ${dtype} n=${n}`);
    }
  } finally {
    await sg.close();
    await sh.close();
  }
}

const PP_SHAPES = [['bf16', [8]], ['fp32', [3]], ['int32', [1000]], ['bf16', [1024, 1024]], ['fp32', [4096, 64]], ['bf16', [8192, 2048]], ['int32', [1]]];

async function ppRounds(gpu, host) {
  const W = gpu.worldSize;
  for (const [k, [dtype, shape]] of PP_SHAPES.entries()) {
    const inputs = range(W).map((r) => pattern(dtype, shape, r, k));
    const got = await gpu.ppExchange(inputs);
    assertSameBytes(got, await host.ppExchange(inputs), `ppExchange ${dtype} [${shape}]`);
    assertSameBytes(got, range(W).map((r) => inputs[(r + W - 1) % W]), `ppExchange ${dtype} [${shape}] vs inputs`);
  }
}

for (const layout of layouts([2, 4])) {
  const W = layout.ranks;

  describe(`AGRS sessions on cuda: ${layout.name}`, () => {
    let gpu, host;
    cudaAndHost(layout, BUFFER, (c, h) => ((gpu = c), (host = h)));

    test('open, allGather, reduceScatter, close: each rank goes session.opening -> open -> gathering/reducing -> open -> closing -> ready', async () => {
      const paths = recordPaths(gpu);
      const s = await gpu.openSession({ maxBytes: 4096, maxAllGathers: 2 });
      assert.deepEqual(gpu.snapshot().map((r) => r.state), Array(W).fill('session.open'));
      await s.allGather(range(W).map(() => tensor('fp32', [4])));
      await s.reduceScatter(range(W).map(() => tensor('fp32', [3 * W])));
      await s.close();
      for (const r of range(W))
        assert.deepEqual(paths[r], ['session.opening', 'session.open', 'session.gathering', 'session.open', 'session.reducing', 'session.open', 'session.closing', 'ready']);
    });

    rounds.forEach((round, i) => {
      test(`session round ${i}: allGather x3 and reduceScatter fp32/bf16 equal the host group's, bit for bit; then close and reopen`, async () => {
        await sessionRound(gpu, host, round, i);
        assert.deepEqual(gpu.snapshot().map((r) => r.state), Array(W).fill('ready'));
      });
    });

    test('bf16 reduceScatter adds in fp32 and rounds once to nearest even: 1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6', async () => {
      const one = 0x3f80, tiny = 0x3b80, tiny3 = 0x3c40; // 1, 2^-8, 3 * 2^-8
      // rank 0 adds 1, rank 1 the small part, the others zero: the same sums in every world size
      const n = 16 * W;
      const inputs = range(W).map((r) => tensor('bf16', [n], Uint16Array.from({ length: n }, (_, i) => (r === 0 ? one : r > 1 ? 0 : i % 2 ? tiny3 : tiny))));
      const s = await gpu.openSession({ maxBytes: 2 * n, maxAllGathers: 1 });
      const out = await s.reduceScatter(inputs);
      await s.close();
      for (const r of range(W)) assert.deepEqual([...out[r].data], Array.from({ length: 16 }, (_, i) => (i % 2 ? 0x3f82 : 0x3f80)));
    });

    test('collectives outside the session still work between sessions (allGather, barrier)', async () => {
      const inputs = range(W).map((r) => pattern('int32', [5], r, 99));
      assertSameBytes(await gpu.allGather(inputs), await host.allGather(inputs), 'allGather outside');
      await gpu.barrier();
    });

    test('more collectives than maxAllGathers: EINVAL, the ranks stay in session.open, close works', async () => {
      const s = await gpu.openSession({ maxBytes: 64, maxAllGathers: 1 });
      await s.allGather(range(W).map(() => tensor('fp32', [4])));
      await assert.rejects(s.allGather(range(W).map(() => tensor('fp32', [4]))), { code: 'EINVAL', message: /maxAllGathers/ });
      assert.deepEqual(gpu.snapshot().map((r) => r.state), Array(W).fill('session.open'));
      await s.close();
      assert.deepEqual(gpu.snapshot().map((r) => r.state), Array(W).fill('ready'));
    });
  });

  describe(`engram on cuda: ${layout.name}`, () => {
    for (const hybrid of [true, false]) {
      const kind = hybrid ? 'hybrid' : 'elastic';
      test(`${kind}: engramFetch of own and peer rows equals the host group's; a second write replaces the tables`, async () => {
        const buffer = { ...BUFFER, bytes: 16 * MiB, cpuBytes: 2 * MiB, hybrid };
        const gpu = await createGroup({ backend: 'cuda', ranks: W, devices: layout.devices, buffer });
        const host = await createGroup({ backend: 'host', ranks: W, buffer });
        try {
          assert.equal((await gpu.info(0)).memoryKind, kind);
          const paths = recordPaths(gpu);
          const cases = [['bf16', 1000, 128], ['fp32', 777, 3], ['bf16', 4000, 128]];
          for (const [c, [dtype, entries, hidden]] of cases.entries()) {
            const tables = range(W).map((r) => pattern(dtype, [entries, hidden], r, c));
            await gpu.engramWrite(tables);
            await host.engramWrite(tables);
            const ids = range(W).map((r) => Int32Array.from({ length: 333 }, (_, i) => (i * 7919 + r * 104_729 + c) % (W * entries)));
            ids[0][0] = 0;
            ids[1][0] = W * entries - 1;
            const got = await gpu.engramFetch(ids);
            assertSameBytes(got, await host.engramFetch(ids), `${kind} fetch ${dtype} [${entries}, ${hidden}]`);
            // and against the tables themselves
            const rowBytes = hidden * (dtype === 'bf16' ? 2 : 4);
            const g = ids[1][0];
            assert.ok(Buffer.from(bytesOfTensor(got[1]).subarray(0, rowBytes)).equals(Buffer.from(bytesOfTensor(tables[Math.floor(g / entries)]).subarray((g % entries) * rowBytes, (g % entries + 1) * rowBytes))));
          }
          const empty = await gpu.engramFetch(range(W).map(() => new Int32Array(0)));
          assert.deepEqual(empty.map((t) => t.shape), range(W).map(() => [0, 128]));
          for (const r of range(W)) assert.deepEqual(paths[r].slice(0, 4), ['engram.writing', 'ready', 'engram.fetching', 'ready']);
        } finally {
          await gpu.destroy();
          await host.destroy();
        }
      });
    }

    test('without a host segment engramWrite is EINVAL naming buffer.cpuBytes; the group stays usable', async () => {
      const gpu = await createGroup({ backend: 'cuda', ranks: W, devices: layout.devices, buffer: { ...BUFFER, bytes: 16 * MiB } });
      try {
        await assert.rejects(gpu.engramWrite(range(W).map(() => tensor('bf16', [10, 128]))), { code: 'EINVAL', message: /cpuBytes/ });
        await gpu.barrier();
      } finally {
        await gpu.destroy();
      }
    });
  });

  describe(`pipeline send/recv on cuda: ${layout.name}`, () => {
    test('ppExchange of several sizes and dtypes: out[r] = in[r - 1], equal to the host group; each rank passes pipeline -> ready', async () => {
      const gpu = await cudaGroup(layout, { buffer: BUFFER });
      const host = await hostGroup(layout, { buffer: BUFFER });
      try {
        const paths = recordPaths(gpu);
        await ppRounds(gpu, host);
        for (const r of range(W)) assert.deepEqual(paths[r].slice(0, 2), ['pipeline', 'ready']);
      } finally {
        await gpu.destroy();
        await host.destroy();
      }
    });
  });

  describe(`copy engines for every put (RANKFLOW_CE_MIN_BYTES=0): ${layout.name}`, () => {
    test('sessions and ppExchange through cuMemcpyAsync into the peers\' windows equal the host group\'s', async () => {
      const saved = process.env.RANKFLOW_CE_MIN_BYTES;
      process.env.RANKFLOW_CE_MIN_BYTES = '0'; // read by each rank when its GPU side is created
      let gpu;
      try {
        gpu = await createGroup({ backend: 'cuda', ranks: W, devices: layout.devices, buffer: BUFFER });
      } finally {
        if (saved === undefined) delete process.env.RANKFLOW_CE_MIN_BYTES;
        else process.env.RANKFLOW_CE_MIN_BYTES = saved;
      }
      const host = await createGroup({ backend: 'host', ranks: W, buffer: BUFFER });
      try {
        for (const [i, round] of rounds.entries()) await sessionRound(gpu, host, round, 20 + i);
        await ppRounds(gpu, host);
      } finally {
        await gpu.destroy();
        await host.destroy();
      }
    });
  });
}
