// Worlds spread over simulated nodes: processes on this host that name different world.nodeId share no
// memory, so every byte between nodes takes the host backend's scale-out leg (TCP between rail peers).
// Every result must be the one a one-node group of the same size gives on the same inputs, bit for bit,
// and the scale-out traffic must be what the two-level design sends: a token once per remote node
// that owns one of its experts (dispatch), one partial sum per token per destination node (combine).
import { afterEach, describe, expect, it } from 'vitest';

import { ensureCompiled, forkFixture, freePort, killAll, worldSources, type Child, type Message } from './helpers/children.js';
import { createGroup } from '../actors/index.js';
import { BUFFER, EXPERTS, HIDDEN, TOPK, agrsTraffic, dispatchInput, runCases, tokensOf } from './fixtures/scaleout-cases.mjs';

const children: Child[] = [];
afterEach(() => killAll(children));

interface Layout { nodes: number; perNode: number; procsPerNode: number }

/** Forks the processes of a world: node n holds ranks [n*R, (n+1)*R), split over procsPerNode processes. */
async function world(l: Layout, arg: Record<string, unknown>, crash?: { rank: number; round: number }): Promise<Child[]> {
  ensureCompiled('dist/actors/world/scaleout.js', [...worldSources, 'actors/group.ts', 'actors/ranks.ts', 'actors/startup.ts', 'actors/options.ts', 'workers/rank.ts']);
  const url = `tcp://127.0.0.1:${await freePort()}`;
  const W = l.nodes * l.perNode, per = l.perNode / l.procsPerNode;
  const procs: Child[] = [];
  for (let n = 0; n < l.nodes; n++) {
    for (let q = 0; q < l.procsPerNode; q++) {
      const rankOffset = n * l.perNode + q * per;
      const dies = crash !== undefined && crash.rank >= rankOffset && crash.rank < rankOffset + per;
      procs.push(forkFixture('scaleout-child', { url, worldSize: W, rankOffset, ranks: per, nodeId: `sim-node-${n}`, ...arg, ...(dies ? { crash: crash.round } : {}) }));
    }
  }
  children.push(...procs);
  return procs;
}

/** What a one-node group of W ranks gives on the same inputs: name -> value per global rank. */
const oracles = new Map<number, Promise<Map<string, unknown[]>>>();
function oracle(W: number): Promise<Map<string, unknown[]>> {
  if (!oracles.has(W)) {
    oracles.set(W, (async () => {
      const out = new Map<string, unknown[]>();
      const g = await createGroup({ ranks: W, backend: 'host', buffer: BUFFER, timeouts: { cpuSeconds: 60, gpuSeconds: 60 } });
      try {
        await runCases(g, Array.from({ length: W }, (_, r) => r), W, (name, values) => out.set(name, values));
      } finally {
        await g.destroy();
      }
      return out;
    })());
  }
  return oracles.get(W)!;
}

/** The results of every child, by case name, indexed by global rank. */
function collect(procs: Child[]): Map<string, unknown[]> {
  const out = new Map<string, unknown[]>();
  for (const c of procs) {
    for (const m of c.taken('result') as Array<Message & { name: string; globals: number[]; values: unknown[] }>) {
      const v = out.get(m.name) ?? [];
      m.globals.forEach((g, i) => (v[g] = m.values[i]));
      out.set(m.name, v);
    }
  }
  return out;
}

/** The destination ranks of each token of global rank g in a dispatch case. */
function destinations(g: number, name: string, W: number): number[][] {
  const { topkIdx } = dispatchInput(g, name);
  const perRank = EXPERTS / W;
  return Array.from({ length: tokensOf(g) }, (_, t) =>
    [...new Set(Array.from(topkIdx.subarray(t * TOPK, (t + 1) * TOPK)).filter((e) => e >= 0).map((e) => Math.floor(e / perRank)))].sort((a, b) => a - b));
}

const layouts: Array<[string, Layout]> = [
  ['2 nodes x 2 ranks, a process per node', { nodes: 2, perNode: 2, procsPerNode: 1 }],
  ['4 nodes x 1 rank', { nodes: 4, perNode: 1, procsPerNode: 1 }],
  ['2 nodes x 3 ranks, a process per rank', { nodes: 2, perNode: 3, procsPerNode: 3 }],
];

describe.each(layouts)('a world of %s on simulated nodes', (_, l) => {
  const W = l.nodes * l.perNode, R = l.perNode, N = l.nodes;
  const nodeOf = (g: number): number => Math.floor(g / R);

  it('forms with one rail per local index and runs every collective bit-identical to a one-node group', async () => {
    // The 4-node world has a token: its rail key is keyed by it (without one, by the empty key).
    const procs = await world(l, { mode: 'cases', ...(N === 4 ? { token: 'scaleout-test-token-0123456789abcdef' } : {}) });
    const ready = await Promise.all(procs.map((c) => c.next('ready', 60_000)));
    for (const m of ready) {
      expect(m.states).toEqual((m.globals as number[]).map(() => 'ready'));
      expect(m.domains).toMatchObject({ numNvlRanks: R, numRdmaRanks: N, numScaleupRanks: R, numScaleoutRanks: N, rdmaRankIdx: nodeOf((m.globals as number[])[0]!) });
    }
    const engram = await Promise.all(procs.map((c) => c.next('engram', 120_000)));
    const remote = await Promise.all(procs.map((c) => c.next('engramRemote', 60_000)));
    await Promise.all(procs.map((c) => c.next('done', 60_000)));
    expect(await Promise.all(procs.map((c) => c.exited))).toEqual(procs.map(() => 0));

    const got = collect(procs);
    const want = await oracle(W);
    for (const [name, values] of want) {
      if (name.startsWith('traffic.')) continue;
      expect(got.get(name), name).toEqual(values);
    }

    // Entry e of rank g holds [g, e]: a rank reads its node's entries; another node's are refused.
    for (const m of engram) {
      const rows = (m.ids as number[]).flatMap((id) => [Math.floor(id / 4), id % 4]);
      for (const r of m.rows as number[][]) expect(r).toEqual(rows);
    }
    for (const m of remote) {
      expect(m.error).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^indices\[0\]: entry \d+ lives on rank \d+, on node \d+: reading another node's host segment is an RDMA read/) });
      expect(m.states).toEqual((m.states as string[]).map(() => 'ready'));
    }

    // allGather of 16 bytes: one copy of each part crosses to each other node.
    const ag = got.get('traffic.allGather') as Array<{ up: number; out: number }>;
    ag.forEach((t) => expect(t).toEqual({ out: (N - 1) * 16, up: (R - 1) * N * 16 }));
    expect(want.get('traffic.allGather')).toEqual(Array.from({ length: W }, () => ({ out: 0, up: (W - 1) * 16 })));

    // dispatch: tokens x distinct remote destination nodes x record bytes (row, k ids, k weights, token id).
    const record = HIDDEN * 2 + TOPK * 8 + 4;
    const dispatched = got.get('traffic.dispatch.bf16') as Array<{ out: number }>;
    let dedup = 0;
    for (let g = 0; g < W; g++) {
      const dests = destinations(g, 'dispatch.bf16', W);
      const remoteNodes = dests.map((d) => new Set(d.map(nodeOf).filter((n) => n !== nodeOf(g))).size);
      const remoteRanks = dests.map((d) => d.filter((p) => nodeOf(p) !== nodeOf(g)).length);
      expect(dispatched[g]!.out, `rank ${g}`).toBe(remoteNodes.reduce((a, b) => a + b, 0) * record);
      dedup += remoteRanks.reduce((a, b) => a + b, 0) - remoteNodes.reduce((a, b) => a + b, 0);
    }
    if (R > 1) expect(dedup).toBeGreaterThan(0);  // tokens that reach two ranks of one remote node crossed once

    // combine: the partial sum of each token goes from each destination node to the next, then home:
    // rank (a, i) sends one fp32 row (hidden + topk floats) per hop that leaves node a on rail i.
    const hops = new Array<number>(W).fill(0);
    for (let p = 0; p < W; p++) {
      for (const d of destinations(p, 'dispatch.bf16', W)) {
        const chain = [...new Set(d.map(nodeOf))];
        if (chain.length === 0) continue;
        if (chain[chain.length - 1] !== nodeOf(p)) chain.push(nodeOf(p));
        for (let h = 0; h + 1 < chain.length; h++) hops[chain[h]! * R + (p % R)]! += 1;
      }
    }
    const combinedTraffic = got.get('traffic.combine.plain') as Array<{ out: number }>;
    combinedTraffic.forEach((t, g) => expect(t.out, `rank ${g}`).toBe(hops[g]! * (HIDDEN + TOPK) * 4));

    // AGRS sessions, ppExchange, engramWrite: the bytes of each two-level round (agrsTraffic says which).
    for (let g = 0; g < W; g++)
      for (const [name, want] of Object.entries(agrsTraffic(g, N, R))) expect((got.get(name) as unknown[])[g], `${name}, rank ${g}`).toEqual(want);
  });
});

describe('a process of a world on simulated nodes that is killed', () => {
  it('fails every other rank with RANK_FAILED naming its rank, long before any timeout, and the groups still tear down', async () => {
    // 2 nodes x 2 ranks, a process per rank; rank 3 (node 1) dies between two rounds of dispatch +
    // combine, once the others have started the next one (had it died as soon as its own round 2
    // returned, a peer still finishing round 2 would fail there). Timeouts are 60 s: only failure
    // detection can end their waits in time: the rail connection's close (rank 3's rail peer, rank 1),
    // the rendezvous' loss report (everyone).
    const procs = await world({ nodes: 2, perNode: 2, procsPerNode: 2 }, { mode: 'loop', gpuSeconds: 60, cpuSeconds: 60 }, { rank: 3, round: 3 });
    await Promise.all(procs.map((c) => c.next('ready', 60_000)));
    await Promise.all(procs.slice(0, 3).map(async (c) => {
      while ((await c.next('round', 30_000)).round !== 3);
    }));
    procs[3]!.send({ kind: 'die' });
    expect(await procs[3]!.exited).toBe('SIGKILL');
    for (const c of procs.slice(0, 3)) {
      const m = await c.next('failed', 30_000);
      expect(m.round).toBe(3);
      expect(m.ms as number).toBeLessThan(15_000);
      expect(m.error).toMatchObject({ code: 'RANK_FAILED', rank: 3, message: expect.stringMatching(/rank 3/) });
      for (const s of m.snapshot as Array<{ state: string; error?: { code: string } }>) expect(s).toMatchObject({ state: 'failed', error: { code: 'RANK_FAILED' } });
      expect((await c.next('done', 30_000)).states).toEqual(['destroyed']);
    }
    expect(await Promise.all(procs.slice(0, 3).map((c) => c.exited))).toEqual([0, 0, 0]);
  });
});

describe('ranks of a world on simulated nodes that replay different handles in one cached dispatch', () => {
  it('are refused with EINVAL on every rank, and the next dispatch with one handle works', async () => {
    const procs = await world({ nodes: 2, perNode: 2, procsPerNode: 1 }, {
      mode: 'program', program: 'mixed-handles.mjs', args: { odd: 0, hidden: HIDDEN, topk: TOPK, experts: EXPERTS, tokens: 6 },
    });
    const out = (await Promise.all(procs.map((c) => c.next('program', 60_000)))).flatMap((m) => m.results as Array<Record<string, unknown>>);
    // Rank 0 and its node peer see each other's enter; rank 0's rail peer (2) refuses its records;
    // rank 3 learns from its forwarder of rank 0's tokens (2) that they were refused.
    const why = [/^inputs\.handle: rank 1 replays another dispatch's handle than rank 0/, /^inputs\.handle: rank 0 replays another dispatch's handle than rank 1/,
      /^inputs\.handle: rank 0 replays another dispatch's handle than rank 2 in dispatch #4/, /^inputs: the tokens of rank 0 were refused by its forwarder \(rank 2\) in dispatch #4/];
    out.forEach((r, g) => {
      expect(r.mixed, `rank ${g}`).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(why[g]!) });
      expect(r.again, `rank ${g}`).toEqual(r.b);
      expect((r.b as number[]).length).toBeGreaterThan(0);
    });
    for (const c of procs) expect((await c.next('done', 30_000)).states).toEqual(['destroyed', 'destroyed']);
  });
});

describe('allReduce across simulated nodes with a rank of another length', () => {
  it('is EINVAL on every rank naming both ranks, nothing moved, and the next allReduce is the plain sum', async () => {
    const procs = await world({ nodes: 2, perNode: 2, procsPerNode: 1 }, { mode: 'program', program: 'all-reduce.mjs', args: { n: 40, refuse: { rank: 3, n: 36 } } });
    const out = (await Promise.all(procs.map((c) => c.next('program', 60_000)))).flatMap((m) => m.results as Array<{ error?: { code: string; message: string }; after: number[]; state: string }>);
    // (g + 1) * (i + 1) / 4 summed over g = 0..3: small integers and quarters, exact in any order.
    const want = Array.from({ length: 40 }, (_, i) => (10 * (i + 1)) / 4);
    out.forEach((r, g) => {
      const other = g === 3 ? 0 : 3;
      expect(r.error, `rank ${g}`).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(new RegExp(`^input: rank ${other} reduces another element count or dtype than rank ${g} \\(`)) });
      expect(r.after, `rank ${g}`).toEqual(want);
      expect(r.state).toBe('ready');
    });
    for (const c of procs) expect((await c.next('done', 30_000)).states).toEqual(['destroyed', 'destroyed']);
  });
});
