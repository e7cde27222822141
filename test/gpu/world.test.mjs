// The CUDA backend across processes (API.md "More than one process"): 2 processes x 1 GPU, each
// hosting one rank of a 2-rank world. They meet at a TCP rendezvous, pass their segments' fds over
// SCM_RIGHTS (device segments and, for hybrid/elastic memory, HOST_NUMA host segments), get NCCL's
// unique id through the rendezvous, and register their windows together. Results are checked
// against bytes computed here and against a host-backend world of 2 processes doing the same.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';

import { bytesOfTensor, forkChild, freePort, killAll, needsTwoGpus, pattern, requireGpu } from './helpers.mjs';

const FIXTURE = new URL('./fixtures/world-child.mjs', import.meta.url);
const KINDS = ['gpu', 'hybrid', 'elastic'];
const children = [];

before(() => requireGpu());
after(() => killAll(children));

/** Forks the fixture for global rank `rank`; messages wait in an inbox until taken with next(). */
const child = (arg) => forkChild(FIXTURE, arg, { label: `rank ${arg.rank} (${arg.backend}, ${arg.mode})`, children });

/** Two processes, global ranks 0 and 1, on one rendezvous url per world. */
async function pair(backend, mode, kinds, extra = {}) {
  const worlds = [];
  for (const kind of kinds) worlds.push({ kind, url: `tcp://127.0.0.1:${await freePort()}` });
  return [0, 1].map((rank) => child({ backend, mode, rank, worlds, ...extra }));
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

test('two processes naming the same GPU are refused with EINVAL naming devices (kernels of two processes would time-slice)', async () => {
  const [a, b] = await pair('cuda', 'share', ['gpu'], { device: 0 });
  const refused = await Promise.all([a.next('refused'), b.next('refused')]);
  console.log(`the refusal: ${JSON.stringify(refused[0].error)}`);
  assert.ok(refused.some((m) => m.error !== null), 'at least one process is refused');
  for (const m of refused) {
    if (m.error === null) continue;
    assert.ok(['EINVAL', 'BACKEND_UNAVAILABLE', 'RANK_FAILED'].includes(m.error.code), JSON.stringify(m.error));
  }
  assert.ok(refused.some((m) => m.error?.code === 'EINVAL' && /devices: GPU GPU-[0-9a-f-]+ is used by this process and by ranks .*processes must not share a GPU/.test(m.error.message)),
    JSON.stringify(refused.map((m) => m.error)));
  await Promise.all([a.exited, b.exited]);
});

describe('a cuda world of 2 processes x 1 GPU', { skip: needsTwoGpus() }, () => {
  let cuda;
  let host;
  before(async () => {
    cuda = await pair('cuda', 'collectives', KINDS);
    host = await pair('host', 'collectives', ['gpu']);
  });

  // One world per memory kind, one after the other in the same two processes.
  const gathered = {};
  for (const kind of KINDS) {
    test(`${kind} memory: the world forms, each process on its own GPU with NCCL`, async () => {
      const ready = await Promise.all(cuda.map((c) => c.next('ready')));
      ready.forEach((m, k) => {
        assert.equal(m.world, kind);
        assert.equal(m.rank, k);
        assert.equal(m.worldSize, 2);
        assert.equal(m.memoryKind, kind);
        assert.equal(m.ordinal, k);
        assert.equal(m.nccl, true);
        assert.deepEqual(m.states, ['ready']);
      });
    });

    test(`${kind} memory: what one process writes through its mapping of the peer's fds, the peer reads`, async () => {
      const probes = await Promise.all(cuda.map((c) => c.next('probe')));
      // Device segments; elastic: the peer's host segment behind its device segment; hybrid: the
      // peer's host segment mapped in my own window.
      const regions = kind === 'gpu' ? 1 : 2;
      for (const p of probes) assert.deepEqual(p.seen, Array(regions).fill(true), `${kind}: ${JSON.stringify(p)}`);
    });

    test(`${kind} memory: 200 barriers, then 200 with CPU sync, in step across the processes`, async () => {
      const done = await Promise.all(cuda.map((c) => c.next('barriers')));
      for (const m of done) {
        assert.equal(m.seqs, 400);
        assert.deepEqual(m.states, ['ready']);
      }
    });

    test(`${kind} memory: allGather equals the concatenation of both ranks' inputs`, async () => {
      const results = await Promise.all(cuda.map((c) => c.next('allGather')));
      for (const m of results) {
        assert.equal(m.gathered.length, 8);
        for (const g of m.gathered) {
          const want = Buffer.concat([0, 1].map((r) => Buffer.from(bytesOfTensor(pattern(g.dtype, g.shape, r, g.round)))));
          assert.equal(g.outDtype, g.dtype);
          assert.deepEqual(g.outShape, [2 * g.shape[0], ...g.shape.slice(1)]);  // concatenated along dim 0
          assert.ok(Buffer.from(g.bytes, 'base64').equals(want), `${kind} ${g.dtype} [${g.shape}] round ${g.round}`);
        }
      }
      gathered[kind] = results;
    });

    test(`${kind} memory: destroy ends both ranks 'destroyed'${kind === 'gpu' ? '' : ' and gives back every fd'}`, async () => {
      const done = await Promise.all(cuda.map((c) => c.next('done')));
      for (const m of done) {
        assert.deepEqual(m.states, ['destroyed']);
        console.log(`${kind}: fds ${m.fdsBefore} before the group, ${m.fdsAfter} after destroy`);
        // The first world warms up what the driver and NCCL keep for the process's life.
        if (kind !== 'gpu') assert.ok(m.fdsAfter <= m.fdsBefore, `${kind}: ${m.fdsAfter} fds after destroy, ${m.fdsBefore} before`);
      }
    });
  }

  test('a host-backend world of 2 processes gathers the same bytes (the oracle)', async () => {
    const results = await Promise.all(host.map((c) => c.next('allGather')));
    assert.ok(gathered.gpu, 'the cuda world gathered');
    results.forEach((m, k) => assert.deepEqual(m.gathered, gathered.gpu[k].gathered));
    await Promise.all(host.map((c) => c.next('done')));
  });

  test('every process exits 0', async () => {
    assert.deepEqual(await Promise.all([...cuda, ...host].map((c) => c.exited)), [0, 0, 0, 0]);
  });
});

describe('faults across processes', { skip: needsTwoGpus() }, () => {
  for (const withCpuSync of [false, true]) test(`a process killed while its peer waits in a barrier kernel${withCpuSync ? ' (with CPU sync)' : ''}: the peer rejects with RANK_FAILED naming rank 1, long before gpuSeconds`, { timeout: 100_000 }, async () => {
    const [a, b] = await pair('cuda', 'crash', ['gpu'], { withCpuSync });
    await Promise.all([a.next('ready'), b.next('ready')]);
    await a.next('waiting');
    await sleep(1000);  // rank 0's kernel is waiting on the GPU now (gpuSeconds is 120)
    b.send({ kind: 'die' });
    assert.equal(await b.exited, 'SIGKILL');
    const { error } = await a.next('error');
    console.log(`rank 0's error: ${JSON.stringify(error)}`);
    assert.equal(error.code, 'RANK_FAILED');
    assert.equal(error.rank, 1);
    assert.match(error.message, /rank 1/);
    const done = await a.next('done');
    assert.equal(done.later.code, 'RANK_FAILED', 'a later collective rejects too');
    assert.equal(done.snapshot[0].state, 'failed');
    assert.deepEqual(done.states, ['destroyed']);
    assert.equal(await a.exited, 0);
  });

  test('a device-side timeout in one process leaves the other process\'s GPU usable', { timeout: 100_000 }, async () => {
    const [a, b] = await pair('cuda', 'trap', ['gpu']);
    await Promise.all([a.next('ready'), b.next('ready')]);
    const { error } = await a.next('error');
    console.log(`rank 0's error: ${JSON.stringify(error)}`);
    assert.equal(error.code, 'TIMEOUT_GPU');
    assert.equal(error.rank, 1);
    assert.equal(error.phase, 'barrier');
    b.send({ kind: 'probe' });
    const { probe } = await b.next('probe');
    console.log(`rank 1's GPU after rank 0's trap in the other process: ${JSON.stringify(probe)}`);
    assert.deepEqual(probe, { ok: true });
    a.send({ kind: 'exit' });
    assert.deepEqual((await a.next('done')).states, ['destroyed']);
    assert.equal(await a.exited, 0);
    b.send({ kind: 'destroy' });
    assert.deepEqual((await b.next('done')).states, ['destroyed']);
    assert.equal(await b.exited, 0);
  });
});
