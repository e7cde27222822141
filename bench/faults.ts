// The failure paths, timed (node dist/bench/faults.js [flags]): a loop of `--ops` mixed collectives
// (dispatch, combine, barrier, allGather, a session's reduceScatter, engram fetch; each result checked
// bit for bit by bench/programs/fault-loop.ts), and a fault at a random op on a random rank:
//   throw    the program throws a TypeError           -> PROGRAM_ERROR naming the rank, the TypeError its cause
//   return   the program returns early               -> STATE naming the rank
//   session  throws with a session and an allGather left open -> PROGRAM_ERROR; the session is closed
//   aborted  the run's signal is aborted; every rank stops on rank.aborted, at different ops -> ABORTED
//   kill     the rank's worker is terminated (a crash) -> RANK_FAILED naming it (a fresh group per trial)
// Every run must end with exactly that error (an op that came out wrong, or any other error, is
// counted as a failure and printed); after every program error the same group must give a bit-exact
// allGather. Prints, per kind and world size, the time from the fault to the run's rejection (p50, p90,
// p99, max) and writes bench/results/faults-<backend>-<date>.json with its provenance.
// With --world, every group is 2 processes of W/2 ranks (this script forks its second process), and
// `kill` SIGKILLs the second process.
import { fork } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { createGroup, type Group, type GroupOptions, type RankflowError } from '../actors/index.js';
import { PACKAGE_ROOT } from '../actors/core/config.js';
import type { FaultKind, FaultLoopArgs } from './programs/fault-loop.js';
import { provenance } from './provenance.js';

const { values: flags } = parseArgs({
  options: {
    backend: { type: 'string', default: 'host' },
    ranks: { type: 'string', default: '2,4,8' },
    trials: { type: 'string', default: '40' },
    ops: { type: 'string', default: '1000' },
    faults: { type: 'string', default: 'throw,return,session,aborted,kill' },
    world: { type: 'boolean', default: false },
    child: { type: 'string' },
    out: { type: 'string', default: path.join(PACKAGE_ROOT, 'bench', 'results') },
    help: { type: 'boolean', default: false },
  },
});
if (flags.help) {
  console.log('usage: node dist/bench/faults.js [--backend host|cuda] [--ranks 2,4,8] [--trials 40] [--ops 1000] [--faults throw,return,session,aborted,kill] [--world] [--out dir]');
  process.exit(0);
}

type Fault = 'throw' | 'return' | 'session' | 'aborted' | 'kill';
const FAULTS: readonly Fault[] = ['throw', 'return', 'session', 'aborted', 'kill'];
const KINDS: FaultKind[] = ['dispatch', 'combine', 'barrier', 'allGather', 'session', 'fetch'];
const PROGRAM = new URL('./programs/fault-loop.js', import.meta.url);
const backend = flags.backend as 'host' | 'cuda';
const ops = Number(flags.ops);
const now = (): number => performance.timeOrigin + performance.now();
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
const buffer = (W: number) => ({ maxTokensPerRank: 8, hidden: 64, topk: 2, numExperts: 2 * W, cpuBytes: 2 << 20 });
const options = (W: number, world?: GroupOptions['world']): GroupOptions => ({
  backend, ranks: world ? W / 2 : W, buffer: buffer(W), ...(backend === 'cuda' ? { devices: Array(world ? W / 2 : W).fill(0) } : {}),
  ...(world ? { world } : {}),
});
// a seeded stream of choices, so that a run can be repeated
let seed = 12345;
const rand = (n: number): number => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);

/** A bit-exact allGather of values that say rank and trial (the group must be usable after a program error). */
async function check(g: Group, trial: number): Promise<void> {
  const parts = g.ranks.map((h) => ({ dtype: 'fp32' as const, shape: [2], data: Float32Array.of(h.rank + trial, -(h.rank * 2 ** -12)) }));
  const out = await g.allGather(parts);
  for (const o of out)
    for (let q = 0; q < g.worldSize; q++)
      if (o.data[2 * q] !== q + trial || o.data[2 * q + 1] !== Math.fround(-(q * 2 ** -12))) throw new Error(`the allGather after trial ${trial} is wrong at rank ${q}`);
}

interface Trial { ms: number; ok: boolean; problem?: string }

/** One trial of `fault` on group g (fresh for kill); the time from the fault to the run's rejection. */
async function trial(g: Group, fault: Fault, t: number): Promise<Trial> {
  const W = g.worldSize;
  const at = rand(ops), who = rand(W);
  const args: FaultLoopArgs = { ops, at, who, how: fault === 'kill' ? 'none' : fault, kinds: KINDS };
  const ac = new AbortController();
  const last = new Map<number, number>();  // each rank's last transition (a return's time: its last op's end)
  const onTransition = (e: { rank: number; at: number }): void => void last.set(e.rank, e.at);
  g.on('transition', onTransition);
  let faultAt = 0;
  const run = g.run(PROGRAM, fault === 'kill' || fault === 'aborted' ? { ...args, ops: 1e9 } : args, { signal: ac.signal }).then(
    () => ({ error: undefined as RankflowError | undefined, at: now() }), (error: RankflowError) => ({ error, at: now() }));
  if (fault === 'aborted' || fault === 'kill') {
    await sleep(5 + rand(50));
    faultAt = now();
    if (fault === 'aborted') ac.abort();
    else await g.ranks[who % g.size]!.terminate();
  }
  const { error, at: rejectedAt } = await run;
  g.off('transition', onTransition);
  const stamp = Number(/boom at ([\d.]+)/.exec(String((error?.cause as Error | undefined)?.message))?.[1]);
  if (fault === 'throw' || fault === 'session') faultAt = stamp;
  if (fault === 'return') faultAt = last.get(who) ?? NaN;
  const want = { throw: 'PROGRAM_ERROR', session: 'PROGRAM_ERROR', return: 'STATE', aborted: 'ABORTED', kill: 'RANK_FAILED' }[fault];
  const ms = rejectedAt - faultAt;
  const wantRank = fault === 'aborted' ? undefined : fault === 'kill' ? g.ranks[who % g.size]!.rank : who;
  // a returning rank's peers may be released by a rank of the other process first: the error names the earliest return
  const named = wantRank === undefined || error?.rank === wantRank || (fault === 'return' && flags.world);
  if (error?.code !== want || !named || ((fault === 'throw' || fault === 'session') && !Number.isFinite(stamp)))
    return { ms, ok: false, problem: `trial ${t} (${fault} at op ${at} of rank ${who}): ${error ? `${error.code} rank ${error.rank}: ${error.message}` : 'resolved'}` };
  if (fault !== 'kill') await check(g, t);
  return { ms, ok: true };
}

const quantile = (xs: number[], q: number): number => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(q * xs.length))] ?? NaN;

/** The world's second process (--child): hosts ranks W/2.., runs the same trials in lockstep with the first. */
async function child(spec: { W: number; url: string; faults: Fault[]; trials: number; seed: number }): Promise<void> {
  seed = spec.seed;
  const g = await createGroup(options(spec.W, { size: spec.W, rankOffset: spec.W / 2, rendezvous: spec.url }));
  // kill: this process is the one killed, in the middle of the first process's barrier
  if (spec.faults.length === 0) await new Promise(() => setInterval(() => g.snapshot(), 1 << 30));
  for (const fault of spec.faults) for (let t = 0; t < spec.trials; t++) await trial(g, fault, t).catch(() => undefined);
  await g.destroy();
}

async function measure(W: number, fault: Fault, trials: number): Promise<Trial[]> {
  const out: Trial[] = [];
  if (!flags.world) {
    let g = await createGroup(options(W));
    for (let t = 0; t < trials; t++) {
      out.push(await trial(g, fault, t).catch((e: Error) => ({ ms: NaN, ok: false, problem: `trial ${t}: ${e.message}` })));
      if (fault === 'kill') {
        await g.destroy();
        g = await createGroup(options(W));
      }
    }
    await g.destroy();
    return out;
  }
  // Two processes: both draw the same faults (the same seed); kill SIGKILLs the second one (a fresh pair each trial).
  for (let t = 0; t < (fault === 'kill' ? trials : 1); t++) {
    const url = `tcp://127.0.0.1:${20000 + rand(20000)}`;
    const spec = { W, url, faults: fault === 'kill' ? [] : [fault], trials: fault === 'kill' ? 1 : trials, seed };
    const second = fork(process.argv[1]!, ['--child', JSON.stringify(spec), '--backend', backend], { stdio: 'inherit' });
    const exited = new Promise((r) => second.once('exit', r));
    const g = await createGroup(options(W, { size: W, rankOffset: 0, rendezvous: url }));
    if (fault === 'kill') {
      await sleep(20 + rand(50));
      const t0 = now();
      const rejected = g.barrier().then(() => NaN, () => now());
      second.kill('SIGKILL');
      const at = await rejected;
      out.push({ ms: at - t0, ok: Number.isFinite(at), ...(Number.isFinite(at) ? {} : { problem: `trial ${t}: the barrier resolved` }) });
    } else {
      for (let k = 0; k < trials; k++) out.push(await trial(g, fault, k).catch((e: Error) => ({ ms: NaN, ok: false, problem: `trial ${k}: ${e.message}` })));
    }
    await g.destroy();
    await exited;
  }
  return out;
}

if (flags.child) {
  await child(JSON.parse(flags.child) as Parameters<typeof child>[0]);
} else {
  const results: Array<{ W: number; fault: Fault; trials: number; failures: number; p50: number; p90: number; p99: number; max: number; problems: string[] }> = [];
  const faults = flags.faults.split(',').filter((f): f is Fault => (FAULTS as readonly string[]).includes(f));
  console.log(`faults on ${backend}${flags.world ? ', 2 processes' : ''}: ${ops} ops a run, ${flags.trials} trials each; ms from the fault to the run's rejection`);
  console.log('W  fault     trials fail   timed  p50     p90     p99     max');
  for (const W of flags.ranks.split(',').map(Number)) {
    for (const fault of faults) {
      const ts = await measure(W, fault, Number(flags.trials));
      // a return's time is its rank's last transition, seen only in its own process (--world: half the trials)
      const ms = ts.filter((x) => x.ok && Number.isFinite(x.ms)).map((x) => x.ms);
      const r = { W, fault, trials: ts.length, failures: ts.filter((x) => !x.ok).length, timed: ms.length, p50: quantile(ms, 0.5), p90: quantile(ms, 0.9), p99: quantile(ms, 0.99), max: Math.max(...ms), problems: ts.flatMap((x) => (x.problem ? [x.problem] : [])) };
      results.push(r);
      console.log(`${String(W).padEnd(3)}${fault.padEnd(10)}${String(r.trials).padEnd(7)}${String(r.failures).padEnd(7)}${String(r.timed).padEnd(7)}${[r.p50, r.p90, r.p99, r.max].map((v) => v.toFixed(1).padEnd(8)).join('')}`);
      for (const p of r.problems.slice(0, 5)) console.log(`   ${p}`);
    }
  }
  mkdirSync(flags.out, { recursive: true });
  const file = path.join(flags.out, `faults-${backend}${flags.world ? '-world' : ''}-${new Date().toISOString().slice(0, 10)}.json`);
  writeFileSync(file, `${JSON.stringify({ ...provenance(), backend, world: flags.world, ops, results }, null, 2)}\n`);
  console.log(`wrote ${path.relative(process.cwd(), file)}`);
}
