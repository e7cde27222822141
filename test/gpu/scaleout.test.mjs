// The cuda backend across nodes, on simulated nodes (API.md "More than one process", world.nodeId):
// one process per node on this host, every rank on GPU 0. No communicator holds two ranks of a node,
// and each process's NCCL_HOSTID names its node, so NCCL connects the nodes over its network
// transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 as well), as real nodes would be. Worlds of 2
// nodes x 1 rank and 2 nodes x 2 ranks (the node's 2 ranks in one process, devices [0, 0]): barriers
// with and without CPU sync, allGathers checked against bytes computed here, the scale-out bytes of
// an allGather, dispatch (with a CPU sync) and combine on the host backend's scale-out cases
// (test/fixtures/scaleout-cases.mjs: bf16, fp8 with scales, -1 slots, an empty rank, every token to
// one expert, cached handles, combines with biases and given weights) bit-identical to a one-node host
// group of the same size and with the two-level design's scale-out bytes; the AGRS cases of the same
// file (a session's allGather and fp32 / bf16 reduce-scatters, some of cancelling values whose sum
// shows its order, ppExchange, engramWrite) likewise, with their scale-out and scale-up bytes; engram
// fetches of the node's own entries, and another node's refused with EINVAL naming indices[0]; the
// session ops on device tensors, async and in place (programs/agrs-views.mjs), equal to the plain
// reference and the host group; graph capture refused with BACKEND_UNAVAILABLE naming it (the group
// usable after), and destroy. native/src/backends/cuda/two_level*.cc is what runs.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';

import { BUFFER, bytesOfTensor, createGroup, forkChild, freePort, killAll, pattern, requireGpu } from './helpers.mjs';
import { referenceAllGather, referenceReduceScatter } from '../../dist/test/helpers/agrs-reference.js';
import {
  BUFFER as MOE_BUFFER, EXPERTS, HIDDEN, TOPK, agrsTraffic, dispatchInput, runAgrsCases, runMoeCases, sessionViewArgs, sessionViewReport, tokensOf,
} from '../fixtures/scaleout-cases.mjs';

const FIXTURE = new URL('./fixtures/scaleout-child.mjs', import.meta.url);
const children = [];

before(() => requireGpu());
after(() => killAll(children));

/** The environment of a simulated node's process: NCCL on its network transport, over loopback; no inherited NCCL_HOSTID. */
function nodeEnv() {
  const env = { ...process.env, NCCL_P2P_DISABLE: '1', NCCL_SHM_DISABLE: '1', NCCL_SOCKET_IFNAME: process.env.NCCL_SOCKET_IFNAME ?? 'lo' };
  delete env.NCCL_HOSTID;  // each process must get its node's (rankflow sets it)
  return env;
}

/** The bytes a flat allGather gives: every global rank's part, in rank order. */
const flat = (W, dtype, shape, round) => Buffer.concat(Array.from({ length: W }, (_, g) => Buffer.from(bytesOfTensor(pattern(dtype, shape, g, round)))));

/**
 * On a one-node host group of W ranks (the flat results, which the host backend's two levels equal
 * too): { moe, agrs } (the cases' results by name) and views (the session-view program's, by rank).
 */
const oracles = new Map();
function oracle(W) {
  if (!oracles.has(W)) oracles.set(W, runOracle(W));
  return oracles.get(W);
}
async function runOracle(W) {
  const out = { moe: {}, agrs: {} };
  const g = await createGroup({ ranks: W, backend: 'host', buffer: { ...MOE_BUFFER, bytes: BUFFER.bytes }, timeouts: { cpuSeconds: 60, gpuSeconds: 60 } });
  const globals = Array.from({ length: W }, (_, r) => r);
  try {
    await runMoeCases(g, globals, (name, values) => { out.moe[name] = values; });
    await runAgrsCases(g, globals, W, (name, values) => { out.agrs[name] = values; });
    out.views = sessionViewReport(await g.run(new URL('./programs/agrs-views.mjs', import.meta.url), sessionViewArgs(W)));
  } finally {
    await g.destroy();
  }
  return out;
}

/** The results of a message kind from every node's process, by case name, indexed by global rank. */
function byName(msgs) {
  const got = {};
  for (const m of msgs)
    for (const [name, values] of Object.entries(m.results)) {
      got[name] ??= [];
      m.globals.forEach((g, i) => (got[name][g] = values[i]));
    }
  return got;
}

/** Every result of the one-node host group's (`want`, by name) equals the world's, bit for bit; traffic is checked apart. */
function sameResults(got, want) {
  for (const [name, values] of Object.entries(want)) {
    if (name.startsWith('traffic.')) continue;
    assert.deepEqual(got[name], values, name);
  }
}

/** The destination ranks of each token of global rank g in a dispatch case, ascending. */
function destinations(g, name, W) {
  const { topkIdx } = dispatchInput(g, name);
  const perRank = EXPERTS / W;
  return Array.from({ length: tokensOf(g) }, (_, t) =>
    [...new Set(Array.from(topkIdx.subarray(t * TOPK, (t + 1) * TOPK)).filter((e) => e >= 0).map((e) => Math.floor(e / perRank)))].sort((a, b) => a - b));
}

for (const [N, R] of [[2, 1], [2, 2]]) {
  describe(`a cuda world of ${N} simulated nodes x ${R} rank${R > 1 ? 's' : ''}, all on GPU 0`, () => {
    const W = N * R;
    let procs;
    before(async () => {
      const url = `tcp://127.0.0.1:${await freePort()}`;
      procs = Array.from({ length: N }, (_, n) => forkChild(FIXTURE, { url, worldSize: W, rankOffset: n * R, ranks: R, nodeId: `sim-node-${n}` },
        { label: `node ${n} (${N}x${R})`, env: nodeEnv(), children }));
    });

    test('forms: two-level domains, a rail communicator per rank, NCCL_HOSTID per node', async () => {
      const ready = await Promise.all(procs.map((c) => c.next('ready', 180_000)));
      ready.forEach((m, n) => {
        assert.deepEqual(m.globals, Array.from({ length: R }, (_, j) => n * R + j));
        assert.deepEqual(m.states, Array(R).fill('ready'));
        assert.equal(m.nccl, true);
        assert.equal(m.domains.numNvlRanks, R);
        assert.equal(m.domains.numRdmaRanks, N);
        assert.equal(m.domains.rdmaRankIdx, n);
        assert.match(m.ncclHostId ?? '', new RegExp(`^rankflow:[0-9a-f]{16}:sim-node-${n}$`));
      });
      assert.notEqual(ready[0].ncclHostId, ready[1].ncclHostId);
      assert.equal(ready[0].ncclHostId.split(':')[1], ready[1].ncclHostId.split(':')[1], 'one world id');
    });

    test('20 barriers, then 20 with CPU sync, in step across the nodes', async () => {
      for (const m of await Promise.all(procs.map((c) => c.next('barriers', 120_000)))) {
        assert.equal(m.seqs, 40);
        assert.deepEqual(m.states, Array(R).fill('ready'));
      }
    });

    test('allGather equals the concatenation of every rank\'s part in rank order (the flat result), bit for bit', async () => {
      for (const m of await Promise.all(procs.map((c) => c.next('allGather', 120_000)))) {
        assert.equal(m.gathered.length, 8 * R);
        for (const g of m.gathered) {
          assert.equal(g.outDtype, g.dtype);
          assert.deepEqual(g.outShape, [W * g.shape[0], ...g.shape.slice(1)]);
          assert.ok(Buffer.from(g.bytes, 'base64').equals(flat(W, g.dtype, g.shape, g.round)), `rank ${g.rank}: ${g.dtype} [${g.shape}] round ${g.round}`);
        }
      }
    });

    test('an allGather sends each part once to each other node: scale-out (N-1) x part bytes, scale-up (R-1) x N x part', async () => {
      for (const m of await Promise.all(procs.map((c) => c.next('traffic', 60_000)))) {
        assert.equal(m.deltas.length, R);
        for (const d of m.deltas) assert.deepEqual(d, { rank: d.rank, scaleOut: (N - 1) * m.part, scaleUp: (R - 1) * N * m.part });
      }
    });

    test('dispatch and combine equal a one-node host group\'s, bit for bit; scale-out bytes as the two-level design sends them', async () => {
      const got = byName(await Promise.all(procs.map((c) => c.next('moe', 300_000))));
      const want = (await oracle(W)).moe;
      sameResults(got, want);
      const nodeOf = (g) => Math.floor(g / R);
      // dispatch: tokens x distinct remote destination nodes x record bytes (row, k ids, k weights, token id).
      const record = HIDDEN * 2 + TOPK * 8 + 4;
      for (let g = 0; g < W; g++) {
        const remoteNodes = destinations(g, 'dispatch.bf16', W).map((d) => new Set(d.map(nodeOf).filter((n) => n !== nodeOf(g))).size);
        assert.equal(got['traffic.dispatch.bf16'][g].out, remoteNodes.reduce((a, b) => a + b, 0) * record, `dispatch traffic of rank ${g}`);
      }
      // combine: one fp32 row (hidden + topk floats) per hop that leaves node a on rail i.
      const hops = new Array(W).fill(0);
      for (let p = 0; p < W; p++)
        for (const d of destinations(p, 'dispatch.bf16', W)) {
          const chain = [...new Set(d.map(nodeOf))];
          if (chain.length === 0) continue;
          if (chain[chain.length - 1] !== nodeOf(p)) chain.push(nodeOf(p));
          for (let h = 0; h + 1 < chain.length; h++) hops[chain[h] * R + (p % R)] += 1;
        }
      got['traffic.combine.plain'].forEach((t, g) => assert.equal(t.out, hops[g] * (HIDDEN + TOPK) * 4, `combine traffic of rank ${g}`));
    });

    test('on device tensors (rank programs) too; a dispatch without a CPU sync refuses with BACKEND_UNAVAILABLE naming it', async () => {
      const msgs = await Promise.all(procs.map((c) => c.next('moeDevice', 300_000)));
      const want = (await oracle(W)).moe;
      for (const m of msgs)
        m.results.forEach((r, i) => {
          const g = m.globals[i];
          assert.deepEqual(r.dispatched, want['dispatch.bf16'][g], `dispatch on device, rank ${g}`);
          assert.deepEqual(r.combined, want['combine.plain'][g], `combine on device, rank ${g}`);
          assert.equal(r.nosync?.code, 'BACKEND_UNAVAILABLE', JSON.stringify(r.nosync));
          assert.match(r.nosync.message, /^dispatch without a CPU sync \(outputsInBuffer\) does not run across nodes on backend 'cuda' yet/);
        });
    });

    test('AGRS sessions (allGather, reduceScatter fp32 and bf16, cancelling sums), ppExchange and engramWrite equal a one-node host group\'s, bit for bit; scale-out and scale-up bytes as the host backend\'s two levels count them', async () => {
      const got = byName(await Promise.all(procs.map((c) => c.next('agrs', 300_000))));
      const want = (await oracle(W)).agrs;
      sameResults(got, want);
      assert.ok(got['session.reduceScatter.cancel.fp32'], 'the cancelling case ran');
      for (let g = 0; g < W; g++)
        for (const [name, t] of Object.entries(agrsTraffic(g, N, R))) assert.deepEqual(got[name][g], t, `${name}, rank ${g}`);
    });

    test('engram: every rank fetches its node\'s entries; another node\'s entry is refused with EINVAL naming indices[0], the ranks still ready', async () => {
      for (const m of await Promise.all(procs.map((c) => c.next('engram', 120_000)))) {
        const rows = m.own.ids.flatMap((id) => [Math.floor(id / 4), id % 4]);  // entry e of rank g = [g, e]
        for (const r of m.own.rows) assert.deepEqual(r, rows);
        console.log(`the refusal: ${JSON.stringify(m.remote.error)}`);
        assert.equal(m.remote.error?.code, 'EINVAL');
        assert.match(m.remote.error.message, /^indices\[0\]: entry \d+ lives on rank \d+, on node \d+: reading another node's host segment is an RDMA read/);
        assert.deepEqual(m.remote.states, Array(R).fill('ready'));
      }
    });

    test('session ops on device tensors, async and in place, equal the plain reference and the one-node host group\'s, bit for bit; results lie in the window', async () => {
      const got = [];
      for (const m of await Promise.all(procs.map((c) => c.next('agrsDevice', 300_000)))) m.globals.forEach((g, i) => (got[g] = m.results[i]));
      const want = (await oracle(W)).views;
      const { cases } = sessionViewArgs(W);
      for (let g = 0; g < W; g++) {
        const r = got[g];
        assert.deepEqual(r.checks.filter((c) => !c.ok), [], `rank ${g}: zero-copy checks`);
        assert.equal(r.revoked, true, `rank ${g}: views refuse their address after close`);
        assert.equal(r.end, 'ready');
        cases.forEach((c, i) => {
          const what = `rank ${g} case ${i} (${c.op}${c.inPlace ? ' in place' : ''}${c.async ? ' async' : ''})`;
          const ref = c.op === 'ag' ? referenceAllGather(c.inputs) : referenceReduceScatter(c.inputs, g);
          assert.equal(r.out[i].bytes, Buffer.from(bytesOfTensor(ref)).toString('base64'), `${what} vs reference`);
          assert.deepEqual(r.out[i], want[g].out[i], `${what} vs host group`);
        });
      }
    });

    test('graph capture refuses with BACKEND_UNAVAILABLE naming it; the group stays usable and in step', async () => {
      for (const m of await Promise.all(procs.map((c) => c.next('refusals', 60_000)))) {
        console.log(`the refusal: ${JSON.stringify(m.capture[0])}`);
        for (const e of m.capture) {
          assert.equal(e?.code, 'BACKEND_UNAVAILABLE');
          assert.match(e.message, /^capture does not run across nodes on backend 'cuda' yet/);
        }
        assert.deepEqual(m.after, Array(R).fill('ready'));
        assert.deepEqual(m.states, Array(R).fill('ready'));
        for (const a of m.again) assert.ok(Buffer.from(a.bytes, 'base64').equals(flat(W, 'int32', [8], 9)), `rank ${a.rank}: the allGather after the refusal`);
      }
    });

    test('destroy ends every rank destroyed, and every process exits 0', async () => {
      for (const m of await Promise.all(procs.map((c) => c.next('done', 60_000)))) assert.deepEqual(m.states, Array(R).fill('destroyed'));
      assert.deepEqual(await Promise.all(procs.map((c) => c.exited)), Array(N).fill(0));
    });
  });
}

describe('a node of a cuda world killed between rounds of barriers and allGathers (2 simulated nodes x 1 rank, GPU 0)', () => {
  test('the other node fails with RANK_FAILED naming rank 1, long before any timeout (60 s), and tears down', async () => {
    const url = `tcp://127.0.0.1:${await freePort()}`;
    const procs = [0, 1].map((n) => forkChild(FIXTURE, { url, worldSize: 2, rankOffset: n, ranks: 1, nodeId: `sim-node-${n}`, mode: 'loop', ...(n === 1 ? { crash: 3 } : {}) },
      { label: `node ${n} (loop)`, env: nodeEnv(), children }));
    await Promise.all(procs.map((c) => c.next('ready', 180_000)));
    while ((await procs[0].next('round', 60_000)).round !== 3);
    procs[1].send({ kind: 'die' });
    assert.equal(await procs[1].exited, 'SIGKILL');
    const m = await procs[0].next('failed', 60_000);
    console.log(`after the kill: ${JSON.stringify(m.error)} in ${m.ms} ms`);
    assert.equal(m.round, 3);
    assert.ok(m.ms < 20_000, `failed after ${m.ms} ms`);
    assert.equal(m.error.code, 'RANK_FAILED', JSON.stringify(m.error));
    assert.match(m.error.message, /rank 1/);
    assert.deepEqual(m.states, ['failed']);
    assert.deepEqual((await procs[0].next('done', 60_000)).states, ['destroyed']);
    assert.equal(await procs[0].exited, 0);
  });
});
