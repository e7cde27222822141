/**
 * An elastic world's leader lost together with more (docs/api.md "Elastic worlds"; actors/world/takeover.ts),
 * the cases test/leader-takeover.test.ts leaves out, each in child processes (test/fixtures/elastic-world-child.mjs)
 * with timeouts, the times until every survivor knows printed:
 * - no leader can be reached (the rendezvous address held by another program): every survivor ends its
 *   ops with RANK_FAILED saying no process took over, within its timeout, its group 'failed', and it
 *   destroys it and exits cleanly;
 * - the leader and the first candidate SIGKILLed together: the next candidate takes over after its turn,
 *   the others go on (rankLeft for both ranges, every result the plain references' and the oracle's);
 *   with no process left but one, that one leads itself;
 * - the leader SIGKILLed during a rejoin: while the world takes over (the rejoiner retries), before
 *   the rejoiner's table (it rejoins with the new leader) and after it (it fails with RANK_FAILED,
 *   and a new rejoin works); the survivors never hang, their results stay right.
 */
import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';

import { ensureCompiled, forkFixture, freePort, killAll, worldSources, type Child, type Message } from './helpers/children.js';
import { prng, randInt } from './helpers/moe-reference.js';
import type { Done } from './helpers/world-runs.js';

const children: Child[] = [];
const strangers: net.Server[] = [];
afterEach(() => {
  killAll(children);
  for (const s of strangers.splice(0)) s.close();
});

const now = (): number => performance.timeOrigin + performance.now();
const sources = [...worldSources, 'actors/elastic.ts', 'actors/elastic-world.ts', 'actors/elastic-join.ts', 'actors/startup.ts', 'actors/group.ts'];
const sum = (xs: number[]): number => xs.reduce((a, b) => a + b, 0);
const rangeOf = (layout: number[], p: number): number[] => Array.from({ length: layout[p]! }, (_, j) => sum(layout.slice(0, p)) + j);
const all = (W: number): number[] => Array.from({ length: W }, (_, g) => g);
const ms = (x: number): string => `${x.toFixed(0)} ms`;
type Debug = { lines: string[]; on?: (line: string) => void };

/** A world of `layout` running the op loop (`extra`: more of the fixture's options); process 0's debug log in `debug`. */
async function world(layout: number[], ops: number, seed: number, extra: object = {}) {
  ensureCompiled('dist/actors/world/takeover.js', sources);
  const url = `tcp://127.0.0.1:${await freePort()}`, worldSize = sum(layout);
  const spec = (p: number, more: object = {}) => ({ url, worldSize, rankOffset: sum(layout.slice(0, p)), ranks: layout[p], ops, seed, oracle: true, layout, ...extra, ...more });
  const debug: Debug = { lines: [] };
  const procs = layout.map((_, p) => p === 0
    ? forkFixture('elastic-world-child', spec(p), { NODE_DEBUG: 'rankflow' }, (l) => (debug.lines.push(l), debug.on?.(l)))
    : forkFixture('elastic-world-child', spec(p)));
  children.push(...procs);
  await Promise.all(procs.map((c) => c.next('ready', 30_000)));
  return { procs, spec, url, port: Number(new URL(url).port), debug };
}

/** Resolves once process `c` says it reached op `at` of its loop. */
const reaches = (c: Child, at: number): Promise<void> => new Promise((resolve) => {
  const on = (m: Message): void => {
    if (m.kind === 'at' && (m.i as number) >= at) (c.proc.off('message', on), resolve());
  };
  c.proc.on('message', on);
});

/** Resolves once process 0's debug log has a line matching `re` (rejects after 30 s). */
const logged = (d: Debug, re: RegExp): Promise<void> => new Promise((resolve, reject) => {
  if (d.lines.some((l) => re.test(l))) return resolve();
  const timer = setTimeout(() => reject(new Error(`no ${re} in process 0's debug log: ${d.lines.slice(-5).join(' | ')}`)), 30_000);
  d.on = (l) => re.test(l) && (d.on = undefined, clearTimeout(timer), resolve());
});

/** Listens at `port` as another program would: it holds every connection without a word (`silent`), or closes it at once. */
async function stranger(port: number, silent: boolean): Promise<net.Server> {
  const held: net.Socket[] = [];
  const s = net.createServer((c) => (silent ? held.push(c) : c.destroy()));
  s.on('close', () => held.forEach((c) => c.destroy()));
  await new Promise<void>((resolve, reject) => (s.once('error', reject), s.listen(port, '127.0.0.1', () => resolve())));
  strangers.push(s);
  return s;
}

describe.each([[true], [false]])('no leader reachable: the rendezvous address held by another program (silent: %s) once the leader is SIGKILLed', (silent) => {
  it("every survivor ends its ops with RANK_FAILED (no process took over) within its timeout, 'failed', destroys its group and exits 0", async () => {
    const layout = [1, 1, 1], ops = 400, cpuSeconds = 3;
    const { procs, port } = await world(layout, ops, 7, { cpuSeconds });
    await reaches(procs[0]!, 20);
    // Stopped, the survivors cannot bind the address before the other program does; then they see the loss.
    for (const c of procs.slice(1)) c.proc.kill('SIGSTOP');
    const killedAt = now();
    procs[0]!.proc.kill('SIGKILL');
    expect(await procs[0]!.exited).toBe('SIGKILL');
    await stranger(port, silent);
    for (const c of procs.slice(1)) c.proc.kill('SIGCONT');
    const done = (await Promise.all(procs.slice(1).map((c) => c.next('done', 60_000)))) as Array<Done & { brokenAt: number | null }>;
    const knows: number[] = [];
    for (const d of done) {
      expect(d.errors).toEqual([]);
      expect(d.succeeded + d.rejected + d.skipped).toBe(ops);
      expect(d.lefts.map((l) => l.rank)).toEqual([0]);
      expect(d.state).toBe('failed');
      expect(d.lastError).toMatchObject({ code: 'RANK_FAILED', message: expect.stringMatching(/no process took over within 3000 ms/) });
      expect(d.brokenAt).not.toBeNull();
      knows.push(d.brokenAt! - killedAt);
    }
    for (const c of procs.slice(1)) expect(await c.exited).toBe(0);  // destroy() resolved, nothing crashed
    for (const t of knows) expect(t).toBeLessThan(cpuSeconds * 1000 + 10_000);
    console.log(`no leader reachable (address held, ${silent ? 'silent' : 'closing'}), ${JSON.stringify(layout)}, timeouts.cpuSeconds ${cpuSeconds}: ` +
      `kill -> every survivor knows the world is gone: ${knows.map(ms).join(', ')}`);
  }, 120_000);
});

describe.each([[[1, 1, 1]], [[1, 1, 1, 1]], [[2, 1, 1, 1]]])('a world hosting %j ranks: the leader and the first candidate (process 1) SIGKILLed together', (layout) => {
  it('the next candidate takes over after its turn; every survivor: rankLeft for both ranges, degraded, every result right (the oracle too)', async () => {
    const W = sum(layout), gone = [...rangeOf(layout, 0), ...rangeOf(layout, 1)], ops = 120;
    const left: number[] = [], first: number[] = [];
    for (let rep = 0; rep < 2; rep++) {
      const seed = 41 * rep + W, at = 10 + randInt(prng(seed), ops - 50);
      const { procs } = await world(layout, ops, seed, { deadSets: [gone] });
      await reaches(procs[0]!, at);
      const killedAt = now();
      procs[0]!.proc.kill('SIGKILL');
      procs[1]!.proc.kill('SIGKILL');
      const survivors = procs.slice(2);
      const done = (await Promise.all(survivors.map((c) => c.next('done', 60_000)))) as Done[];
      for (const c of procs.slice(0, 2)) expect(await c.exited).toBe('SIGKILL');
      for (const d of done) {
        expect(d.errors).toEqual([]);
        expect(d.succeeded + d.rejected + d.skipped).toBe(ops);
        expect(d.rejected).toBeLessThanOrEqual(4);
        expect(d.oracle).toBeGreaterThan(2);
        expect(d.lefts.map((l) => l.rank).sort()).toEqual(gone);
        expect(d.lefts.every((l) => l.code === 'RANK_FAILED')).toBe(true);
        expect({ state: d.state, liveRanks: d.liveRanks }).toEqual({ state: 'degraded', liveRanks: all(W).filter((g) => !gone.includes(g)) });
        expect(d.firstOp).not.toBeNull();
      }
      left.push(Math.max(...done.flatMap((d) => d.lefts.map((l) => l.at))) - killedAt);
      first.push(Math.max(...done.map((d) => d.firstOp!)) - killedAt);
      children.splice(0).forEach((c) => c.proc.kill('SIGKILL'));
    }
    for (const t of [...left, ...first]) expect(t).toBeLessThan(10_000);
    console.log(`${JSON.stringify(layout)}, processes 0 and 1 killed together: kill -> every survivor has rankLeft for both: ${left.map(ms).join(', ')}; ` +
      `-> every survivor ran again: ${first.map(ms).join(', ')}`);
  }, 240_000);
});

// The leader SIGKILLed during a rejoin. [1, 1, 1, 1]: process 3 is killed first, its range rejoins with
// a new process; then the leader (process 0) is killed, at a point of that rejoin. The survivors
// (processes 1 and 2) wait for ranks [1, 2, 3] to serve, then every process runs phase 2 on them.
describe('the leader SIGKILLed during a rejoin ([1, 1, 1, 1]: range 3 rejoining)', () => {
  const layout = [1, 1, 1, 1], phase2 = 40, want = [1, 2, 3];
  async function rejoinWorld(seed: number) {
    const w = await world(layout, 40, seed, { phase2, wantLive: want });
    await reaches(w.procs[3]!, 12);
    w.procs[3]!.proc.kill('SIGKILL');
    await Promise.all([w.procs[0], w.procs[1], w.procs[2]].map((c) => c!.next('done', 60_000)));
    const rejoin = (): Child => {
      const c = forkFixture('elastic-world-child', w.spec(3, { rejoin: true }));
      children.push(c);
      return c;
    };
    return { ...w, rejoin };
  }
  /** Phase 2 in the survivors and the rejoiner: a healthy group's results on ranks [1, 2, 3]. */
  async function phase2Right(survivors: Child[], r: Child): Promise<void> {
    expect(await r.next('ready', 30_000)).toMatchObject({ liveRanks: want });
    for (const c of survivors) expect(await c.next('joined', 60_000)).toMatchObject({ liveRanks: want, state: 'degraded' });
    for (const d of (await Promise.all([...survivors, r].map((c) => c.next('done2', 60_000)))) as Done[]) {
      expect(d.errors).toEqual([]);
      expect({ rejected: d.rejected, succeeded: d.succeeded, skipped: d.skipped, liveRanks: d.liveRanks }).toEqual({ rejected: 0, succeeded: phase2, skipped: 0, liveRanks: want });
      expect(d.oracle).toBeGreaterThan(1);
    }
  }

  it('while the world takes over (a survivor has not resumed yet): the rejoiner retries until the new leader serves, then rejoins', async () => {
    const { procs, rejoin } = await rejoinWorld(5);
    procs[2]!.proc.kill('SIGSTOP');  // process 1 leads and waits for its resume
    const killedAt = now();
    procs[0]!.proc.kill('SIGKILL');
    const r = rejoin();
    await new Promise((resolve) => setTimeout(resolve, 1500));
    procs[2]!.proc.kill('SIGCONT');
    const ready = await r.next('ready', 30_000).catch((e: Error) => ({ kind: 'none', why: e.message, refused: r.taken('refused') }));
    expect(ready, JSON.stringify(ready)).toMatchObject({ kind: 'ready', state: 'degraded' });
    console.log(`the leader killed while the world took over: kill -> the rejoiner serves ${ms(now() - killedAt)} (a survivor stopped for 1500 ms)`);
    await phase2Right([procs[1]!, procs[2]!], reborn(r, ready as Message));
  }, 120_000);

  it('before the rejoiner has its table: it rejoins with the new leader', async () => {
    const { procs, rejoin, debug } = await rejoinWorld(6);
    const r = rejoin();
    await logged(debug, /began the rejoin of rank 3 /);
    const killedAt = now();
    procs[0]!.proc.kill('SIGKILL');
    // A survivor may have given the dead leader its join point while another had not heard of the rejoin:
    // the new leader's rejoin starts a round of its own (world/live-exchange.ts LeaderJoins), so it works.
    const ready = await r.next('ready', 30_000);
    console.log(`the leader killed as the rejoin began: kill -> the rejoiner serves (with the new leader) ${ms(now() - killedAt)}`);
    await phase2Right([procs[1]!, procs[2]!], reborn(r, ready));
  }, 120_000);

  it('after the rejoiner has its table: it fails with RANK_FAILED, the survivors go on, and a new rejoin works', async () => {
    const { procs, rejoin, debug } = await rejoinWorld(8);
    const r = rejoin();
    await logged(debug, /sent its table to the rejoining rank 3 /);
    const killedAt = now();
    procs[0]!.proc.kill('SIGKILL');
    const refused = await r.next('refused', 30_000);
    expect(refused).toMatchObject({ code: 'RANK_FAILED', message: expect.stringMatching(/was lost while this process rejoined/) });
    const failedIn = (refused.at as number) - killedAt;
    let exitedIn = 0;
    // Its fd passing for the abandoned join ends with it (fdCancel, also a call still queued for a pool
    // thread), not at its timeout (cpuSeconds 20), so its process ends at once.
    const exited = r.exited.then((code) => ((exitedIn = now() - killedAt), code));
    const again = rejoin();
    await phase2Right([procs[1]!, procs[2]!], again);
    const servedIn = now() - killedAt;
    expect(await exited).toBe(0);
    console.log(`the leader killed after the rejoiner's table: kill -> the rejoiner fails ${ms(failedIn)}, its process ended ${ms(exitedIn)}; -> a new rejoiner serves ${ms(servedIn)}`);
    expect(failedIn).toBeLessThan(10_000);
    expect(exitedIn).toBeLessThan(10_000);
    expect(servedIn).toBeLessThan(15_000);  // not the timeouts (cpuSeconds 20): the failed rejoiner's process ended at once
  }, 120_000);
});

/** A child whose 'ready' was taken already: it is handed on with it put back. */
function reborn(c: Child, ready: Message): Child {
  return { ...c, next: (kind, t) => (kind === 'ready' ? Promise.resolve(ready) : c.next(kind, t)) };
}
