/**
 * Elastic groups across processes (API.md "Elastic groups"): a world of 2, 3 or 4 processes on the
 * host backend, every process a child (test/fixtures/elastic-world-child.mjs) running the same loop of
 * dispatch, combine, barrier and allGather, whose results it checks bit for bit against the plain
 * references of the inputs with the dead ranks' experts -1 and the dead sending nothing, and against a
 * healthy (not elastic) group of its own fed those inputs. The test SIGKILLs a follower process at a
 * random op of the loop (0-3 ms after it said it got there: between ops or inside one): every survivor
 * sees rankLeft for each of its ranks, is 'degraded' without them, and never a wrong result or a hang.
 * Then a process started with world.rejoin takes the range back: rankJoined in every survivor, 'ready',
 * and the next ops' results are a healthy group's; rejoins that do not fit are refused, each told why.
 * group.run across processes (test/fixtures/elastic-world-runs.mjs): a follower SIGKILLed during a loop
 * of rank programs; the run in flight rejects RANK_FAILED in every survivor, the next ones run on the
 * live ranks, every value checked here against the parts of the ranks that serve; after a rejoin they
 * are a healthy group's. The leader process's death is survived too: test/leader-takeover.test.ts.
 */
import { afterEach, describe, expect, it } from 'vitest';

import { createGroup } from '../actors/index.js';
import { ensureCompiled, forkFixture, freePort, killAll, percentile, worldSources, type Child, type Message } from './helpers/children.js';
import { prng, randInt } from './helpers/moe-reference.js';
import { checkRuns, ROUNDS, type Done, type RunsDone } from './helpers/world-runs.js';

const children: Child[] = [];
afterEach(() => killAll(children));

const now = (): number => performance.timeOrigin + performance.now();

/** A world of `layout` ranks per process running `ops` ops; process `victim` SIGKILLed once it reaches op `at`. Each survivor's 'done', and the kill's time. */
async function killDuring(layout: number[], ops: number, victim: number, at: number, seed: number): Promise<{ done: Done[]; killedAt: number }> {
  ensureCompiled('dist/actors/elastic-world.js', [...worldSources, 'actors/elastic.ts', 'actors/elastic-world.ts', 'actors/group.ts', 'actors/options.ts']);
  const url = `tcp://127.0.0.1:${await freePort()}`, worldSize = layout.reduce((a, b) => a + b, 0);
  let offset = 0;
  const procs = layout.map((ranks) => {
    const c = forkFixture('elastic-world-child', { url, worldSize, rankOffset: offset, ranks, ops, seed, oracle: true, layout });
    offset += ranks;
    return c;
  });
  children.push(...procs);
  await Promise.all(procs.map((c) => c.next('ready', 30_000)));
  const rng = prng(seed);
  let killedAt = 0;
  procs[victim]!.proc.on('message', (m: Message) => {
    if (m.kind !== 'at' || m.i !== at || killedAt) return;
    killedAt = -1;
    setTimeout(() => { killedAt = now(); procs[victim]!.proc.kill('SIGKILL'); }, randInt(rng, 4));
  });
  const done = (await Promise.all(procs.map((c, p) => (p === victim ? null : c.next('done', 120_000))))).filter((d): d is Done => d !== null);
  expect(await procs[victim]!.exited).toBe('SIGKILL');
  return { done, killedAt };
}

const rangeOf = (layout: number[], p: number): number[] => {
  const start = layout.slice(0, p).reduce((a, b) => a + b, 0);
  return Array.from({ length: layout[p]! }, (_, j) => start + j);
};

describe.each([
  [[2, 2], 1], [[1, 1, 1], 1], [[1, 1, 1], 2], [[2, 1, 1], 2],
])('a world of processes hosting %j ranks, process %i SIGKILLed at a random op', (layout, victim) => {
  it('every survivor: rankLeft for its ranks within 100 ms, degraded without them, every result right, no hang', async () => {
    const times: { left: number[]; first: number[] } = { left: [], first: [] };
    for (let rep = 0; rep < 3; rep++) {
      const seed = 31 * rep + victim + 7 * layout.length, ops = 200;
      const at = 10 + randInt(prng(seed + 1), ops - 60);
      const { done, killedAt } = await killDuring(layout, ops, victim, at, seed);
      const gone = rangeOf(layout, victim), W = layout.reduce((a, b) => a + b, 0);
      for (const d of done) {
        expect(d.errors).toEqual([]);
        expect(d.succeeded + d.rejected + d.skipped).toBe(ops);
        // Only the op the kill lands in (and a combine of its dispatch) is rejected.
        expect(d.rejected).toBeLessThanOrEqual(3);
        expect(d.oracle).toBeGreaterThan(5);
        expect(d.lefts.map((l) => l.rank).sort()).toEqual(gone);
        expect(d.lefts.every((l) => l.code === 'RANK_FAILED')).toBe(true);
        expect(d.state).toBe('degraded');
        expect(d.liveRanks).toEqual(Array.from({ length: W }, (_, g) => g).filter((g) => !gone.includes(g)));
        times.left.push(...d.lefts.map((l) => l.at - killedAt));
        if (d.firstOp !== null) times.first.push(d.firstOp - killedAt);
      }
    }
    // API.md: within 100 ms on host. The kill's own cost is in it: a process's sockets close only once
    // the kernel has torn its memory down (~20-40 ms here).
    expect(percentile(times.left, 50)).toBeLessThan(100);
    for (const ms of times.left) expect(ms).toBeLessThan(1000);
    console.log(`${JSON.stringify(layout)}, process ${victim} killed: kill -> rankLeft p50 ${percentile(times.left, 50).toFixed(1)} ms, max ${Math.max(...times.left).toFixed(1)} ms; ` +
      `kill -> first survivor op p50 ${percentile(times.first, 50).toFixed(1)} ms, max ${Math.max(...times.first).toFixed(1)} ms`);
  }, 300_000);
});

describe('two followers killed at once', () => {
  it('in a world of 4 processes: the survivors agree on one mask, every result right', async () => {
    ensureCompiled('dist/actors/elastic-world.js', [...worldSources, 'actors/elastic.ts', 'actors/elastic-world.ts']);
    const layout = [1, 1, 1, 1], url = `tcp://127.0.0.1:${await freePort()}`, ops = 160;
    const procs = layout.map((_, p) => forkFixture('elastic-world-child', { url, worldSize: 4, rankOffset: p, ranks: 1, ops, seed: 5, oracle: true, layout }));
    children.push(...procs);
    await Promise.all(procs.map((c) => c.next('ready', 30_000)));
    procs[1]!.proc.on('message', (m: Message) => {
      if (m.kind === 'at' && m.i === 41) { procs[1]!.proc.kill('SIGKILL'); setTimeout(() => procs[3]!.proc.kill('SIGKILL'), 1); }
    });
    const done = (await Promise.all([procs[0]!.next('done', 120_000), procs[2]!.next('done', 120_000)])) as Done[];
    for (const d of done) {
      expect(d.errors).toEqual([]);
      expect(d.succeeded + d.rejected + d.skipped).toBe(ops);
      expect(d.lefts.map((l) => l.rank).sort()).toEqual([1, 3]);
      expect(d.liveRanks).toEqual([0, 2]);
    }
  }, 180_000);
});

/** A world of `layout` whose process `victim` is SIGKILLed at op `at` of phase 1; the survivors then wait for a rejoin (phase 2: `phase2` ops). */
async function degradedWorld(layout: number[], victim: number, at: number, opts: { token?: string; phase2?: number } = {}) {
  ensureCompiled('dist/actors/elastic-join.js', [...worldSources, 'actors/elastic.ts', 'actors/elastic-world.ts', 'actors/elastic-join.ts', 'actors/startup.ts']);
  const url = `tcp://127.0.0.1:${await freePort()}`, worldSize = layout.reduce((a, b) => a + b, 0);
  const offsets = layout.map((_, p) => layout.slice(0, p).reduce((a, b) => a + b, 0));
  const spec = (p: number, extra: object = {}) => ({
    url, worldSize, rankOffset: offsets[p], ranks: layout[p], ops: 80, phase2: opts.phase2 ?? 60, seed: 11, oracle: true, layout,
    ...(opts.token ? { token: opts.token } : {}), ...extra,
  });
  const procs = layout.map((_, p) => forkFixture('elastic-world-child', spec(p)));
  children.push(...procs);
  await Promise.all(procs.map((c) => c.next('ready', 30_000)));
  procs[victim]!.proc.on('message', (m: Message) => m.kind === 'at' && m.i === at && procs[victim]!.proc.kill('SIGKILL'));
  const survivors = procs.filter((_, p) => p !== victim);
  const phase1 = (await Promise.all(survivors.map((c) => c.next('done', 60_000)))) as Done[];
  const rejoin = (extra: object = {}): Child => {
    const c = forkFixture('elastic-world-child', spec(victim, { rejoin: true, ...extra }));
    children.push(c);
    return c;
  };
  return { url, worldSize, survivors, phase1, rejoin, offsets };
}

describe.each([
  [[2, 2], 1], [[1, 1, 1], 2], [[2, 1, 1], 1],
])('a world of processes hosting %j ranks: process %i SIGKILLed, then a process with world.rejoin takes its range back', (layout, victim) => {
  it.each([0, 1])("every process: rankJoined for the range, 'ready', and a healthy group's results; the rejoin within 2 s (kill point %i)", async (rep) => {
    const at = 20 + randInt(prng(layout.length * 10 + victim + 100 * rep), 40);
    const { survivors, phase1, rejoin, worldSize } = await degradedWorld(layout, victim, at);
    for (const d of phase1) expect(d.errors).toEqual([]);
    const startedAt = now();
    const r = rejoin();
    const ready = await r.next('ready', 30_000);
    expect(ready).toMatchObject({ state: 'ready', liveRanks: Array.from({ length: worldSize }, (_, g) => g) });
    const joined = await Promise.all(survivors.map((c) => c.next('joined', 30_000)));
    const range = rangeOf(layout, victim);
    for (const j of joined) {
      expect(j).toMatchObject({ state: 'ready', liveRanks: Array.from({ length: worldSize }, (_, g) => g) });
      expect((j.joins as Array<{ rank: number }>).map((x) => x.rank)).toEqual(range);
    }
    const phase2 = (await Promise.all([...survivors, r].map((c) => c.next('done2', 60_000)))) as Done[];
    for (const d of phase2) {
      expect(d.errors).toEqual([]);
      expect(d.rejected).toBe(0);
      expect(d.succeeded + d.skipped).toBe(60);
      expect(d.skipped).toBe(0);
      expect(d.state).toBe('ready');
    }
    // The rejoin: from the rejoiner's start (its process, node and workers included) to rankJoined in every survivor.
    const ms = Math.max(...joined.flatMap((j) => (j.joins as Array<{ at: number }>).map((x) => x.at - startedAt)));
    console.log(`${JSON.stringify(layout)}, process ${victim}: rejoin ${ms.toFixed(0)} ms from the rejoiner's fork to the last rankJoined (its createGroup ${Number(ready.createMs).toFixed(0)} ms)`);
    expect(ms).toBeLessThan(2000);
  }, 120_000);
});

describe('a rejoiner SIGKILLed while it joins', () => {
  // Before it serves: its fork, its workers and its join take ~400 ms here, less on a fast machine. A
  // kill after it served is a loss (above), not this case: the survivors then run phase 2 with the
  // range back once and end. Such a repetition is made again with a kill earlier (0.7x).
  it.each([120, 240, 330])('after %i ms: the survivors go on degraded, and the next rejoiner takes the range back', async (first) => {
    const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
    for (let ms = first; ; ms = Math.floor(ms * 0.7)) {
      const { survivors, rejoin } = await degradedWorld([1, 1, 1], 2, 25, { phase2: 40 });
      const doomed = rejoin();
      await sleep(ms);
      doomed.proc.kill('SIGKILL');
      await sleep(300);
      if (survivors.some((c) => c.taken('joined').length > 0)) {
        console.log(`a rejoiner SIGKILLed ${ms} ms after its fork had served already: again, ${Math.floor(ms * 0.7)} ms after`);
        expect(ms).toBeGreaterThan(50);
        killAll(children);
        continue;
      }
      const second = rejoin();
      expect(await second.next('ready', 30_000)).toMatchObject({ state: 'ready', liveRanks: [0, 1, 2] });
      for (const c of survivors) expect(await c.next('joined', 30_000)).toMatchObject({ state: 'ready', liveRanks: [0, 1, 2] });
      for (const d of (await Promise.all([...survivors, second].map((c) => c.next('done2', 60_000)))) as Done[]) {
        expect(d.errors).toEqual([]);
        expect(d.rejected).toBe(0);
      }
      return;
    }
  }, 120_000);
});

describe('rejoins that are refused', () => {
  const buffer = { maxTokensPerRank: 16, hidden: 128, topk: 4, numExperts: 12, cpuBytes: 2 << 20 };  // elastic-cases.mjs buffer(3)
  it('a range that serves, one that is no process\'s, another world size, a second rejoin at once, a wrong token: each told why; then the right one joins', async () => {
    const token = 'a'.repeat(64);
    const { url, survivors, rejoin } = await degradedWorld([1, 1, 1], 2, 15, { token, phase2: 20 });
    const attempt = (world: object, cpuSeconds = 10) => createGroup({ backend: 'host', ranks: 1, buffer, elastic: true, timeouts: { cpuSeconds }, world: { size: 3, rendezvous: url, token, rejoin: true, ...world } as never });
    await expect(attempt({ rankOffset: 1 })).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/refused this rejoin: rank 1 \(pid \d+ .*\) serves/) });
    // Range 0 too: its process (the leader) serves. It is taken back only once it was lost (test/leader-takeover.test.ts).
    await expect(attempt({ rankOffset: 0 })).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/refused this rejoin: rank 0 \(pid \d+ .*\) serves/) });
    await expect(attempt({ rankOffset: 2, size: 4 })).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/refused this rejoin: world sizes disagree/) });
    await expect(createGroup({ backend: 'host', ranks: 2, buffer, elastic: true, timeouts: { cpuSeconds: 10 }, world: { size: 3, rankOffset: 1, rendezvous: url, token, rejoin: true } }))
      .rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/refused this rejoin: ranks \[1, 3\) are not the range of one process/) });
    await expect(attempt({ rankOffset: 2, token: 'b'.repeat(64) }, 2)).rejects.toMatchObject({ code: 'TIMEOUT_CPU', message: expect.stringMatching(/world\.token/) });
    await expect(createGroup({ backend: 'host', ranks: 1, buffer: { ...buffer, hidden: 64 }, elastic: true, timeouts: { cpuSeconds: 10 }, world: { size: 3, rankOffset: 2, rendezvous: url, token, rejoin: true } }))
      .rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/refused this rejoin: its buffer/) });
    // Two at once: one takes the range back, the other is told why (in progress, or the range serves by then).
    const two = [rejoin(), rejoin()];
    const outcomes = await Promise.all(two.map((c) => Promise.race([c.next('ready', 30_000), c.next('refused', 30_000)])));
    expect(outcomes.map((m) => m.kind).sort()).toEqual(['ready', 'refused']);
    expect(outcomes.find((m) => m.kind === 'refused')).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/another rejoin is in progress|serves/) });
    const first = two[outcomes.findIndex((m) => m.kind === 'ready')]!;
    for (const c of survivors) expect(await c.next('joined', 30_000)).toMatchObject({ state: 'ready' });
    for (const d of (await Promise.all([...survivors, first].map((c) => c.next('done2', 60_000)))) as Done[]) expect(d.errors).toEqual([]);
  }, 120_000);

  it('the option: world.rejoin without elastic is EINVAL, at once (rankOffset 0 included)', async () => {
    const world = { size: 2, rendezvous: 'tcp://127.0.0.1:1', rejoin: true };
    await expect(createGroup({ backend: 'host', ranks: 1, buffer, world: { ...world, rankOffset: 0 } }))
      .rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^world\.rejoin: needs elastic: true/) });
    await expect(createGroup({ backend: 'host', ranks: 1, buffer, elastic: 'no' as never, world: { ...world, rankOffset: 1, rejoin: 'yes' as never } }))
      .rejects.toMatchObject({ code: 'EINVAL' });
  });
});

describe('the option', () => {
  const buffer = { maxTokensPerRank: 4, hidden: 64, topk: 2, numExperts: 8 };
  it('elastic with a world that spans nodes (world.nodeId) is refused once the world met', async () => {
    const url = `tcp://127.0.0.1:${await freePort()}`;
    const make = (p: number) => createGroup({ backend: 'host', ranks: 1, buffer, elastic: true, timeouts: { cpuSeconds: 20 }, world: { size: 2, rankOffset: p, rendezvous: url, nodeId: `n${p}` } });
    const out = await Promise.allSettled([make(0), make(1)]);
    for (const o of out) expect(o).toMatchObject({ status: 'rejected', reason: { code: 'EINVAL', message: expect.stringMatching(/^elastic: is supported within one node only/) } });
  });
});

// group.run across processes (test/fixtures/elastic-world-runs.mjs): a loop of rank programs that each
// gather every rank's part of the run (programs/world-gather.mjs), checked here against the parts of
// the ranks that serve, those that left giving zeros; a follower process SIGKILLed in the loop.
const HOLD_MS = 100;

/** A world of `layout` looping `runs` runs; process `victim` SIGKILLed at run `at` (`hold`: inside it, its programs asleep; else 0-3 ms after it said it got there). */
async function runsWorld(layout: number[], runs: number, victim: number, at: number, opts: { hold: boolean; seed: number; phase2?: number }) {
  ensureCompiled('dist/actors/world/run-exchange.js', [...worldSources, 'actors/run.ts', 'actors/elastic.ts', 'actors/elastic-world.ts', 'actors/elastic-join.ts', 'actors/group.ts']);
  const url = `tcp://127.0.0.1:${await freePort()}`, worldSize = layout.reduce((a, b) => a + b, 0);
  const spec = (p: number, extra: object = {}) => ({
    url, worldSize, rankOffset: layout.slice(0, p).reduce((a, b) => a + b, 0), ranks: layout[p], runs, rounds: ROUNDS,
    ...(opts.hold ? { hold: at, holdMs: HOLD_MS } : {}), ...(opts.phase2 ? { phase2: opts.phase2 } : {}), ...extra,
  });
  const procs = layout.map((_, p) => forkFixture('elastic-world-runs', spec(p)));
  children.push(...procs);
  await Promise.all(procs.map((c) => c.next('ready', 30_000)));
  const rng = prng(opts.seed);
  let killedAt = 0;
  procs[victim]!.proc.on('message', (m: Message) => {
    if (m.kind !== 'at' || m.i !== at || killedAt) return;
    killedAt = -1;
    setTimeout(() => { killedAt = now(); procs[victim]!.proc.kill('SIGKILL'); }, opts.hold ? 30 : randInt(rng, 4));
  });
  const survivors = procs.filter((_, p) => p !== victim);
  const done = (await Promise.all(survivors.map((c) => c.next('done', 120_000)))) as RunsDone[];
  expect(await procs[victim]!.exited).toBe('SIGKILL');
  const rejoin = (): Child => {
    const c = forkFixture('elastic-world-runs', spec(victim, { rejoin: true }));
    children.push(c);
    return c;
  };
  return { done, killedAt, survivors, rejoin, worldSize };
}


describe.each([
  [[1, 1], 1], [[2, 1], 1], [[1, 1, 1], 1], [[1, 1, 1], 2], [[2, 1, 1], 2],
])('group.run across processes: a world hosting %j ranks, process %i SIGKILLed during a loop of runs', (layout, victim) => {
  it('every survivor: the run in flight rejects RANK_FAILED in every process, the next ones run on the live ranks with every value right', async () => {
    const times: { knows: number[]; rejected: number[]; first: number[] } = { knows: [], rejected: [], first: [] };
    const runs = 80, gone = rangeOf(layout, victim);
    for (let rep = 0; rep < 3; rep++) {
      const seed = 17 * rep + victim + 5 * layout.length, hold = rep === 0;
      const at = 10 + randInt(prng(seed + 1), runs - 40);
      const { done, killedAt } = await runsWorld(layout, runs, victim, at, { hold, seed });
      const { rejected, degraded } = checkRuns(done, layout.reduce((a, b) => a + b, 0), gone, runs);
      // The kill inside a run (its programs asleep) is that run's end: rejected everywhere, the next one degraded.
      if (hold) expect({ rejected, degraded }).toEqual({ rejected: [at], degraded: at + 1 });
      // Elsewhere within a few runs of `at` (its 'at' message crosses IPC while the loop goes on).
      expect(degraded).toBeLessThanOrEqual(at + 10);
      for (const d of done) {
        expect(d.lefts.map((l) => l.rank).sort()).toEqual(gone);
        expect(d.state).toBe('degraded');
        expect(d.liveRanks).toEqual(Array.from({ length: layout.reduce((a, b) => a + b, 0) }, (_, g) => g).filter((g) => !gone.includes(g)));
        expect(d.firstRun).not.toBeNull();
      }
      // Until every surviving process knows (its last rankLeft), until the run in flight rejected in every one, until each ran again.
      times.knows.push(Math.max(...done.flatMap((d) => d.lefts.map((l) => l.at))) - killedAt);
      if (rejected.length > 0) times.rejected.push(Math.max(...done.map((d) => d.outcomes.find((o) => o.i === rejected[0])!.t)) - killedAt);
      times.first.push(Math.max(...done.map((d) => d.firstRun!)) - killedAt);
    }
    expect(percentile(times.knows, 50)).toBeLessThan(100);
    for (const ms of [...times.knows, ...times.rejected]) expect(ms).toBeLessThan(1000);
    const f = (xs: number[]) => `p50 ${percentile(xs, 50).toFixed(1)} ms, max ${Math.max(...xs).toFixed(1)} ms`;
    console.log(`group.run, ${JSON.stringify(layout)}, process ${victim} killed: kill -> every survivor knows ${f(times.knows)}; ` +
      `-> the run in flight rejected in every survivor ${times.rejected.length > 0 ? f(times.rejected) : 'none'} (${times.rejected.length} of 3); -> every survivor ran again ${f(times.first)}`);
  }, 300_000);
});

describe.each([
  [[1, 1], 1], [[1, 1, 1], 2], [[2, 1, 1], 1],
])('group.run across processes: a world hosting %j ranks, process %i SIGKILLed inside a run, then a process with world.rejoin takes its range back', (layout, victim) => {
  it("the next runs, the rejoiner's too, are a healthy group's: every rank serves, every value right", async () => {
    const at = 12, phase2 = 30;
    const { done, survivors, rejoin, worldSize } = await runsWorld(layout, 40, victim, at, { hold: true, seed: 3, phase2 });
    expect(checkRuns(done, worldSize, rangeOf(layout, victim), 40)).toEqual({ rejected: [at], degraded: at + 1 });
    const r = rejoin();
    expect(await r.next('ready', 30_000)).toMatchObject({ state: 'ready', liveRanks: Array.from({ length: worldSize }, (_, g) => g) });
    for (const c of survivors) expect(await c.next('joined', 30_000)).toMatchObject({ state: 'ready' });
    // The rejoiner's runs beside the survivors', in rank order: the world whole again, every value a healthy group's.
    const procs = layout.map((_, p) => (p === victim ? r : survivors[p < victim ? p : p - 1]!));
    const after = (await Promise.all(procs.map((c) => c.next('done2', 60_000)))) as RunsDone[];
    expect(checkRuns(after, worldSize, [], phase2, 1000)).toEqual({ rejected: [], degraded: Infinity });
    for (const d of after) expect(d.state).toBe('ready');
  }, 120_000);
});
