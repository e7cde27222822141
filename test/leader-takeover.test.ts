/**
 * An elastic world outlives its leader (docs/api.md "Elastic worlds"; actors/world/takeover.ts): the
 * process with rankOffset 0, which holds the rendezvous and relays every exchange, is SIGKILLed at a
 * random op of a loop of dispatch, combine, barrier and allGather (test/fixtures/elastic-world-child.mjs,
 * as in test/elastic-world.test.ts), and of a loop of group.run (elastic-world-runs.mjs). The lowest
 * survivor takes the rendezvous over, the others resume with it, and every survivor goes on as after a
 * follower's loss: rankLeft for each rank of the old leader's range, 'degraded', every result bit for
 * bit the plain references and a healthy group's on the masked inputs (the oracle), never a hang. Then
 * a process started with world.rejoin takes range 0 back from the new leader (results: a healthy
 * group's), and the new leader's death is survived too. Resumes are checked field by field; without
 * elastic the leader's death still fails every process fast.
 */
import { afterEach, describe, expect, it } from 'vitest';

import { hostId } from '../actors/world/host-id.js';
import { checkResume, type ResumeContext } from '../actors/world/resume.js';
import type { RendezvousPeer } from '../actors/world/rendezvous.js';
import { ensureCompiled, forkFixture, freePort, killAll, percentile, worldSources, type Child, type Message } from './helpers/children.js';
import { prng, randInt } from './helpers/moe-reference.js';
import { authenticate, connectStranger } from './helpers/stranger.js';
import { checkRuns, ROUNDS, type Done, type RunsDone } from './helpers/world-runs.js';

const children: Child[] = [];
afterEach(() => killAll(children));

const now = (): number => performance.timeOrigin + performance.now();
const sources = [...worldSources, 'actors/elastic.ts', 'actors/elastic-world.ts', 'actors/elastic-join.ts', 'actors/run.ts', 'actors/group.ts'];
const sum = (xs: number[]): number => xs.reduce((a, b) => a + b, 0);
const rangeOf = (layout: number[], p: number): number[] => Array.from({ length: layout[p]! }, (_, j) => sum(layout.slice(0, p)) + j);
const all = (W: number): number[] => Array.from({ length: W }, (_, g) => g);
const f = (xs: number[]): string => `p50 ${percentile(xs, 50).toFixed(1)} ms, max ${Math.max(...xs).toFixed(1)} ms`;

/**
 * A world of `layout` running the op loop; `kills`: [process, op] in turn, each SIGKILLed 0-3 ms after
 * it says it reached that op (the next one once the one before is dead). Each survivor's 'done', the kills' times.
 */
async function killLeaders(layout: number[], ops: number, kills: Array<[number, number]>, seed: number, extra: object = {}) {
  ensureCompiled('dist/actors/world/takeover.js', sources);
  const url = `tcp://127.0.0.1:${await freePort()}`, worldSize = sum(layout);
  const spec = (p: number, more: object = {}) => ({ url, worldSize, rankOffset: sum(layout.slice(0, p)), ranks: layout[p], ops, seed, oracle: true, layout, ...extra, ...more });
  const procs = layout.map((_, p) => forkFixture('elastic-world-child', spec(p)));
  children.push(...procs);
  await Promise.all(procs.map((c) => c.next('ready', 30_000)));
  const rng = prng(seed);
  const killedAt: number[] = [];
  let k = 0;
  const arm = (): void => {
    if (k >= kills.length) return;
    const [victim, at] = kills[k]!;
    const onAt = (m: Message): void => {
      if (m.kind !== 'at' || (m.i as number) < at) return;
      procs[victim]!.proc.off('message', onAt);
      setTimeout(() => { killedAt.push(now()); procs[victim]!.proc.kill('SIGKILL'); k++; void procs[victim]!.exited.then(arm); }, randInt(rng, 4));
    };
    procs[victim]!.proc.on('message', onAt);
  };
  arm();
  const victims = new Set(kills.map(([v]) => v));
  const survivors = procs.filter((_, p) => !victims.has(p));
  const done = (await Promise.all(survivors.map((c) => c.next('done', 120_000)))) as Done[];
  for (const v of victims) expect(await procs[v]!.exited).toBe('SIGKILL');
  expect(killedAt.length).toBe(kills.length);
  return { done, killedAt, survivors, spec, url, procs };
}

describe.each([[[1, 1]], [[1, 1, 1]], [[2, 1, 1]], [[1, 2, 1]]])('a world of processes hosting %j ranks, the leader (process 0) SIGKILLed at a random op', (layout) => {
  it('every survivor: rankLeft for range 0, degraded without it, every result right (the oracle too), no hang', async () => {
    const times: { left: number[]; first: number[] } = { left: [], first: [] };
    const W = sum(layout), gone = rangeOf(layout, 0);
    for (let rep = 0; rep < 3; rep++) {
      const seed = 29 * rep + 3 * layout.length + layout[0]! + layout[1]!, ops = 160;
      const at = 10 + randInt(prng(seed + 1), ops - 60);
      const { done, killedAt } = await killLeaders(layout, ops, [[0, at]], seed);
      for (const d of done) {
        expect(d.errors).toEqual([]);
        expect(d.succeeded + d.rejected + d.skipped).toBe(ops);
        expect(d.rejected).toBeLessThanOrEqual(3);  // the op the kill lands in, and a combine of its dispatch
        expect(d.oracle).toBeGreaterThan(5);
        expect(d.lefts.map((l) => l.rank).sort()).toEqual(gone);
        expect(d.lefts.every((l) => l.code === 'RANK_FAILED')).toBe(true);
        expect(d.state).toBe('degraded');
        expect(d.liveRanks).toEqual(all(W).filter((g) => !gone.includes(g)));
        expect(d.firstOp).not.toBeNull();
        times.left.push(...d.lefts.map((l) => l.at - killedAt[0]!));
        times.first.push(d.firstOp! - killedAt[0]!);
      }
    }
    expect(percentile(times.left, 50)).toBeLessThan(100);
    for (const ms of [...times.left, ...times.first]) expect(ms).toBeLessThan(2000);
    console.log(`${JSON.stringify(layout)}, the leader killed: kill -> rankLeft ${f(times.left)}; kill -> first survivor op ${f(times.first)}`);
  }, 300_000);
});

describe('the new leader killed too', () => {
  it.each([[[1, 1, 1]], [[1, 1, 1, 1]]])('%j: process 0 and then process 1 (which took over): the others go on, every result right', async (layout) => {
    const W = sum(layout), ops = 200, gone = [0, 1];
    const { done, killedAt } = await killLeaders(layout, ops, [[0, 40], [1, 110]], 13, { deadSets: [[0, 1]] });
    const times: number[] = [], first: number[] = [];
    for (const d of done) {
      expect(d.errors).toEqual([]);
      expect(d.succeeded + d.rejected + d.skipped).toBe(ops);
      expect(d.rejected).toBeLessThanOrEqual(6);
      expect(d.lefts.map((l) => l.rank).sort()).toEqual(gone);
      expect(d.state).toBe('degraded');
      expect(d.liveRanks).toEqual(all(W).filter((g) => !gone.includes(g)));
      times.push(d.lefts.find((l) => l.rank === 1)!.at - killedAt[1]!);
      const after = (d.firstOps as number[]).at(-1)!;
      expect(after).toBeGreaterThan(killedAt[1]!);
      first.push(after - killedAt[1]!);
    }
    console.log(`${JSON.stringify(layout)}, the second leader killed: kill -> rankLeft ${f(times)}; kill -> first survivor op ${f(first)}`);
  }, 120_000);
});

describe('range 0 rejoined, then the leader that took over SIGKILLed', () => {
  it('[1, 1, 1]: process 0 leads again (the rejoiner, the lowest survivor), every result right', async () => {
    const { survivors, spec } = await killLeaders([1, 1, 1], 60, [[0, 25]], 17, { phase2: 120, at2: true });
    const r = forkFixture('elastic-world-child', spec(0, { rejoin: true }));
    children.push(r);
    expect(await r.next('ready', 30_000)).toMatchObject({ liveRanks: [0, 1, 2] });
    for (const c of survivors) expect(await c.next('joined', 30_000)).toMatchObject({ state: 'ready' });
    const [one, two] = survivors as [Child, Child];
    let killedAt = 0;
    one.proc.on('message', (m: Message) => {
      if (m.kind === 'at2' && m.i === 50 && !killedAt) setTimeout(() => { killedAt = now(); one.proc.kill('SIGKILL'); }, 2);
    });
    const done = (await Promise.all([r, two].map((c) => c.next('done2', 60_000)))) as Done[];
    expect(await one.exited).toBe('SIGKILL');
    for (const d of done) {
      expect(d.errors).toEqual([]);
      expect(d.succeeded + d.rejected + d.skipped).toBe(120);
      expect(d.rejected).toBeLessThanOrEqual(3);
      expect(d.lefts.filter((l) => l.at > killedAt).map((l) => l.rank)).toEqual([1]);
      expect({ state: d.state, liveRanks: d.liveRanks }).toEqual({ state: 'degraded', liveRanks: [0, 2] });
      expect(d.firstOp).not.toBeNull();
    }
    console.log(`[1,1,1], range 0 rejoined, then the new leader (process 1) killed: kill -> rankLeft ${f(done.flatMap((d) => d.lefts.filter((l) => l.rank === 1).map((l) => l.at - killedAt)))}; ` +
      `kill -> first survivor op ${f(done.map((d) => d.firstOp! - killedAt))}`);
  }, 120_000);
});

describe.each([[[1, 1]], [[1, 1, 1]], [[2, 1, 1]]])('a world hosting %j ranks: the leader SIGKILLed, then a process with world.rejoin takes range 0 back', (layout) => {
  it("every process: rankJoined for range 0, 'ready', and a healthy group's results", async () => {
    const W = sum(layout);
    const { survivors, spec } = await killLeaders(layout, 80, [[0, 20 + randInt(prng(W), 30)]], 11, { phase2: 60 });
    const startedAt = now();
    const r = forkFixture('elastic-world-child', spec(0, { rejoin: true }));
    children.push(r);
    expect(await r.next('ready', 30_000)).toMatchObject({ state: 'ready', liveRanks: all(W) });
    const joined = await Promise.all(survivors.map((c) => c.next('joined', 30_000)));
    for (const j of joined) {
      expect(j).toMatchObject({ state: 'ready', liveRanks: all(W) });
      expect((j.joins as Array<{ rank: number }>).map((x) => x.rank)).toEqual(rangeOf(layout, 0));
    }
    for (const d of (await Promise.all([...survivors, r].map((c) => c.next('done2', 60_000)))) as Done[]) {
      expect(d.errors).toEqual([]);
      expect({ rejected: d.rejected, skipped: d.skipped, succeeded: d.succeeded, state: d.state }).toEqual({ rejected: 0, skipped: 0, succeeded: 60, state: 'ready' });
      expect(d.oracle).toBeGreaterThan(2);
    }
    const ms = Math.max(...joined.flatMap((j) => (j.joins as Array<{ at: number }>).map((x) => x.at - startedAt)));
    console.log(`${JSON.stringify(layout)}: range 0 rejoined ${ms.toFixed(0)} ms from the rejoiner's fork to the last rankJoined`);
  }, 120_000);
});

// group.run: the leader killed in a loop of runs (test/fixtures/elastic-world-runs.mjs, whose programs
// gather every rank's part); every value checked here against the parts of the ranks that serve.

async function runsWorld(layout: number[], runs: number, at: number, opts: { hold: boolean; seed: number; phase2?: number }) {
  ensureCompiled('dist/actors/world/takeover.js', sources);
  const url = `tcp://127.0.0.1:${await freePort()}`, worldSize = sum(layout);
  const spec = (p: number, extra: object = {}) => ({
    url, worldSize, rankOffset: sum(layout.slice(0, p)), ranks: layout[p], runs, rounds: ROUNDS,
    ...(opts.hold ? { hold: at, holdMs: 100 } : {}), ...(opts.phase2 ? { phase2: opts.phase2 } : {}), ...extra,
  });
  const procs = layout.map((_, p) => forkFixture('elastic-world-runs', spec(p)));
  children.push(...procs);
  await Promise.all(procs.map((c) => c.next('ready', 30_000)));
  const rng = prng(opts.seed);
  let killedAt = 0;
  procs[0]!.proc.on('message', (m: Message) => {
    if (m.kind !== 'at' || m.i !== at || killedAt) return;
    killedAt = -1;
    setTimeout(() => { killedAt = now(); procs[0]!.proc.kill('SIGKILL'); }, opts.hold ? 30 : randInt(rng, 4));
  });
  const survivors = procs.slice(1);
  const done = (await Promise.all(survivors.map((c) => c.next('done', 120_000)))) as RunsDone[];
  expect(await procs[0]!.exited).toBe('SIGKILL');
  return { done, killedAt, survivors, worldSize, rejoin: () => { const c = forkFixture('elastic-world-runs', spec(0, { rejoin: true })); children.push(c); return c; } };
}

describe.each([[[1, 1]], [[1, 1, 1]], [[2, 1, 1]], [[1, 2, 1]]])('group.run: a world hosting %j ranks, the leader SIGKILLed during a loop of runs', (layout) => {
  it('the run in flight rejects RANK_FAILED in every survivor, the next ones run on the live ranks, every value right', async () => {
    const times: { knows: number[]; first: number[] } = { knows: [], first: [] };
    const runs = 60, gone = rangeOf(layout, 0);
    for (let rep = 0; rep < 3; rep++) {
      const seed = 19 * rep + 5 * layout.length + layout[0]!, hold = rep === 0;
      const at = 10 + randInt(prng(seed + 1), runs - 30);
      const { done, killedAt } = await runsWorld(layout, runs, at, { hold, seed });
      const { rejected, degraded } = checkRuns(done, sum(layout), gone, runs);
      if (hold) expect({ rejected, degraded }).toEqual({ rejected: [at], degraded: at + 1 });
      expect(degraded).toBeLessThanOrEqual(at + 10);
      for (const d of done) {
        expect(d.lefts.map((l) => l.rank).sort()).toEqual(gone);
        expect(d.state).toBe('degraded');
        expect(d.firstRun).not.toBeNull();
      }
      times.knows.push(Math.max(...done.flatMap((d) => d.lefts.map((l) => l.at))) - killedAt);
      times.first.push(Math.max(...done.map((d) => d.firstRun!)) - killedAt);
    }
    for (const ms of times.knows) expect(ms).toBeLessThan(1000);
    console.log(`group.run, ${JSON.stringify(layout)}, the leader killed: kill -> every survivor knows ${f(times.knows)}; -> every survivor ran again ${f(times.first)}`);
  }, 300_000);
});

describe.each([[[1, 1]], [[2, 1, 1]]])('group.run: a world hosting %j ranks, the leader SIGKILLed inside a run, then range 0 rejoins', (layout) => {
  it("the next runs, the rejoiner's too, are a healthy group's", async () => {
    const at = 12, phase2 = 20;
    const { done, survivors, rejoin, worldSize } = await runsWorld(layout, 30, at, { hold: true, seed: 3, phase2 });
    expect(checkRuns(done, worldSize, rangeOf(layout, 0), 30)).toEqual({ rejected: [at], degraded: at + 1 });
    const r = rejoin();
    expect(await r.next('ready', 30_000)).toMatchObject({ state: 'ready', liveRanks: all(worldSize) });
    for (const c of survivors) expect(await c.next('joined', 30_000)).toMatchObject({ state: 'ready' });
    const after = (await Promise.all([r, ...survivors].map((c) => c.next('done2', 60_000)))) as RunsDone[];
    expect(checkRuns(after, worldSize, [], phase2, 1000)).toEqual({ rejected: [], degraded: Infinity });
  }, 120_000);
});

describe('a resume, as the new leader checks it', () => {
  const peer = (rankOffset: number): RendezvousPeer => ({ rankOffset, localRanks: 1, payload: {}, hostId: 'h', nodeId: 'h', pid: 100 + rankOffset });
  const ctx: ResumeContext = { peers: [0, 1, 2].map(peer), lost: new Set([0]), leader: 1, awaits: (i) => i === 2, runValueBytes: 1 << 16 };
  const live = { at: 3, waiting: [{ seq: 3, value: { mask: '6' } }], done: [{ seq: 2, values: [null, 1, 2] }] };
  const good = { t: 'resume', worldSize: 3, rankOffset: 2, localRanks: 1, pid: 102, hostId: 'h', nodeId: 'h', lost: [0], live, joins: { at: 0, waiting: [], done: [] }, runs: { waiting: [{ run: 7, value: {} }], decided: [{ run: 6, values: null }] } };
  it('takes one that fits: its index and what it hands on', () => {
    expect(checkResume(good, ctx)).toMatchObject({ index: 2, handOver: { lost: [0], live, runs: { waiting: [{ run: 7 }], decided: [{ run: 6, values: null }] } } });
  });
  it.each(([
    [{ worldSize: 4 }, /^worldSize 4 is not the world's/],
    [{ rankOffset: 5 }, /^rankOffset 5 is not the first rank of a process/],
    [{ pid: 7 }, /^pid 7 is not that of rank 2/],
    [{ hostId: 'x' }, /^hostId "x"/],
    [{ rankOffset: 1, pid: 101 }, /is the new leader's/],
    [{ rankOffset: 0, pid: 100, lost: [] }, /was lost: .*world\.rejoin/],
    [{ lost: [0, 0] }, /^lost\[1\] 0 is not a process index .* named once/],
    [{ lost: [1] }, /^lost\[0\] 1 names the new leader/],
    [{ lost: 'all' }, /^lost is not an array/],
    [{ live: { ...live, at: -1 } }, /^live\.at -1 is not a count/],
    [{ live: { ...live, waiting: [{ seq: 9, value: 0 }] } }, /^live\.waiting\[0\]\.seq 9 is not an exchange in \[1, 3\]/],
    [{ live: { ...live, waiting: [{ seq: 3, value: { big: 'x'.repeat(5000) } }] } }, /^live\.waiting\[0\]\.value is more than 4096 bytes/],
    [{ live: { ...live, done: [{ seq: 2, values: [1] }] } }, /^live\.done\[0\]\.values is not 3 values/],
    [{ joins: null }, /^joins is not an object/],
    [{ runs: { waiting: [{ run: 0, value: 1 }], decided: [] } }, /^runs\.waiting\[0\]\.run 0 is not a run number/],
    [{ runs: { waiting: [], decided: [{ run: 4, values: 'cut' }] } }, /^runs\.decided\[0\]\.values is neither null/],
  ] as Array<[object, RegExp]>).map(([change, why]) => [Object.keys(change).join(' and '), change, why] as const))('refuses a wrong %s, naming the field', (_, change, why) => {
    expect(checkResume({ ...good, ...change } as never, ctx)).toEqual({ problem: expect.stringMatching(why) });
  });
  it('refuses a second resume of one process, and one when the world is not taking over', () => {
    expect(checkResume(good, { ...ctx, awaits: () => false })).toEqual({ problem: expect.stringMatching(/resumed already, or the world is not taking over/) });
  });
});

describe('a resume over the socket', () => {
  it('the new leader authenticates it as a join, refuses one that does not fit naming the field, and serves on (a rejoin of range 0 then)', async () => {
    const token = 'c'.repeat(64), layout = [1, 1, 1];
    const { url, survivors, procs, spec } = await killLeaders(layout, 60, [[0, 20]], 5, { token, phase2: 12 });
    const port = Number(new URL(url).port);
    const resume = (patch: object) => `${JSON.stringify({
      t: 'resume', worldSize: 3, rankOffset: 2, localRanks: 1, pid: procs[2]!.proc.pid, hostId: hostId(), nodeId: hostId(), lost: [0],
      live: { at: 0, waiting: [], done: [] }, joins: { at: 0, waiting: [], done: [] }, runs: { waiting: [], decided: [] }, ...patch,
    })}\n`;
    const wrongToken = await connectStranger(port);
    expect(await authenticate(wrongToken, 'd'.repeat(64))).toBe('denied');
    for (const [patch, why] of [
      [{ pid: 7 }, /the new leader refused this resume: pid 7 is not that of rank 2 \(pid \d+/],
      [{ lost: [0, 1] }, /the new leader refused this resume: lost\[1\] 1 names the new leader/],
      [{}, /the new leader refused this resume: rank 2 \(pid \d+ .*\) resumed already, or the world is not taking over/],
    ] as const) {
      const s = await connectStranger(port);
      expect(await authenticate(s, token, resume(patch))).toBe('proof');
      expect(await s.next()).toMatchObject({ t: 'error', code: 'EINVAL', message: expect.stringMatching(why) });
      await s.closed;
    }
    const r = forkFixture('elastic-world-child', spec(0, { rejoin: true }));
    children.push(r);
    expect(await r.next('ready', 30_000)).toMatchObject({ state: 'ready', liveRanks: [0, 1, 2] });
    for (const c of survivors) expect(await c.next('joined', 30_000)).toMatchObject({ state: 'ready' });
    for (const d of (await Promise.all([...survivors, r].map((c) => c.next('done2', 60_000)))) as Done[]) expect({ errors: d.errors, rejected: d.rejected }).toEqual({ errors: [], rejected: 0 });
  }, 120_000);
});

describe('without elastic', () => {
  it("the leader's death still fails the others fast, RANK_FAILED naming rank 0", async () => {
    const url = `tcp://127.0.0.1:${await freePort()}`;
    const a = forkFixture('world-child', { url, worldSize: 4, rankOffset: 0, ranks: 2, cpuBytes: 0, crash: true });
    const b = forkFixture('world-child', { url, worldSize: 4, rankOffset: 2, ranks: 2, cpuBytes: 0, waitMs: 300 });
    children.push(a, b);
    await Promise.all([a.next('ready', 30_000), b.next('ready', 30_000)]);
    expect(await a.exited).toBe('SIGKILL');
    const t0 = now();
    expect(await b.next('error', 30_000)).toMatchObject({ code: 'RANK_FAILED', message: expect.stringMatching(/rank 0/) });
    expect(now() - t0).toBeLessThan(5000);
  }, 60_000);
});
