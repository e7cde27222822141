// Elastic worlds, timed (node dist/bench/elastic-world.js [flags]), host backend: per trial a fresh
// world of `--procs` processes of `--per-proc` ranks (this script forks them: --child), every process
// running driver-mode dispatches in lockstep, and a random follower process SIGKILLed at a random
// moment of the loop. Per survivor process: ms from the kill to its 'rankLeft' (each rank of the dead
// process) and to its first dispatch that succeeded among the survivors (it started after rankLeft:
// the survivor processes had re-formed without the dead). Then a process started with world.rejoin
// takes the range back: ms from its fork (node, its workers, the join) to the last survivor's
// 'rankJoined', and its createGroup's ms. p50 / p99 over trials and survivors. The leader
// (rankOffset 0) is never killed: an elastic world does not outlive it (docs/api.md).
// Writes bench/results/elastic-host-world-<date>.json with its provenance.
import { fork } from 'node:child_process';
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { createGroup, type DispatchInput } from '../actors/index.js';
import { PACKAGE_ROOT } from '../actors/core/config.js';
import { SHAPE, buffer, input, stats } from './elastic-inputs.js';
import { freePort } from './free-port.js';
import { provenance } from './provenance.js';

const { values: flags } = parseArgs({
  options: {
    layouts: { type: 'string', default: '2x2,3x1,2x4' },
    trials: { type: 'string', default: '20' },
    out: { type: 'string', default: path.join(PACKAGE_ROOT, 'bench', 'results') },
    child: { type: 'string' },
    help: { type: 'boolean', default: false },
  },
});
if (flags.help) {
  console.log('usage: node dist/bench/elastic-world.js [--layouts 2x2,3x1,2x4 (processes x ranks)] [--trials 20] [--out dir]');
  process.exit(0);
}
const now = (): number => performance.timeOrigin + performance.now();

interface Spec { url: string; W: number; rankOffset: number; ranks: number; rejoin?: boolean }
interface Report { kind: 'report'; lefts: number[]; firstAt: number; rejected: number; error?: string; i?: number; joinedAt?: number; createMs?: number }

/**
 * One process of the world: dispatches until op `stopAt`, which the bench names once every survivor
 * said which op it is at after its first success (the processes stop at one op: in lockstep).
 */
async function child(spec: Spec): Promise<void> {
  const t0 = now();
  const g = await createGroup({
    backend: 'host', ranks: spec.ranks, buffer: buffer(spec.W), elastic: true, timeouts: { cpuSeconds: 20 },
    world: { size: spec.W, rankOffset: spec.rankOffset, rendezvous: spec.url, ...(spec.rejoin ? { rejoin: true } : {}) },
  });
  if (spec.rejoin) {
    // Back in: one barrier with the survivors (their next op), then done.
    const createMs = now() - t0;
    await g.barrier();
    process.send!({ kind: 'rejoined', createMs });
    await g.destroy();
    process.disconnect();
    return;
  }
  let joinedAt = 0;
  g.on('rankJoined', (e) => { joinedAt = Math.max(joinedAt, e.at); });
  const lefts: number[] = [];
  g.on('rankLeft', (e) => lefts.push(e.at));
  const inputs = Array.from({ length: spec.ranks }, (_, r) => input(spec.W, spec.rankOffset + r));
  process.send!({ kind: 'ready' });
  let firstAt = 0, rejected = 0, stopAt = Infinity, error: string | undefined;
  process.on('message', (m: { stopAt?: number }) => { if (typeof m.stopAt === 'number') stopAt = m.stopAt; });
  try {
    for (let i = 0; i < stopAt && i < 1_000_000; i++) {
      const started = lefts.length;
      const ok = await g.dispatch(inputs.map((x, r) => (g.liveRanks.includes(spec.rankOffset + r) ? x : null)) as DispatchInput[]).then(() => true, () => false);
      if (!ok) rejected++;
      else if (started > 0 && firstAt === 0) {
        firstAt = now();
        process.send!({ kind: 'first', i });
      }
    }
  } catch (e) {
    error = String(e);
  }
  process.send!({ kind: 'report', lefts, firstAt, rejected, ...(error ? { error } : {}) } satisfies Report);
  // The rejoin: wait (bounded) until the range is back, then the barrier the rejoiner starts with.
  for (const until = now() + 30_000; g.state !== 'ready' && now() < until;) await new Promise((r) => setTimeout(r, 1));
  await g.barrier();
  process.send!({ kind: 'joined', joinedAt });
  await g.destroy();
  process.disconnect();
}

/** One trial: a fresh world, a random follower killed 5-30 ms into the loop; the survivors' ms. */
async function trial(procs: number, perProc: number) {
  const url = `tcp://127.0.0.1:${await freePort()}`, W = procs * perProc;
  const kids = Array.from({ length: procs }, (_, p) =>
    fork(process.argv[1]!, ['--child', JSON.stringify({ url, W, rankOffset: p * perProc, ranks: perProc } satisfies Spec)], { stdio: 'inherit' }));
  const message = (c: (typeof kids)[number], kind: string) => new Promise<Report>((resolve, reject) => {
    c.on('message', (m: Report | { kind: string }) => m.kind === kind && resolve(m as Report));
    c.on('exit', (code, signal) => reject(new Error(`a process exited (${code ?? signal}) before '${kind}'`)));
  });
  try {
    await Promise.all(kids.map((c) => message(c, 'ready')));
    const victim = 1 + Math.floor(Math.random() * (procs - 1));
    const survivors = kids.filter((_, p) => p !== victim);
    const reports = survivors.map((c) => message(c, 'report'));
    const firsts = survivors.map((c) => message(c, 'first'));
    await new Promise((r) => setTimeout(r, 5 + Math.random() * 25));
    const killedAt = now();
    kids[victim]!.kill('SIGKILL');
    const stopAt = Math.max(...(await Promise.all(firsts)).map((m) => m.i!)) + 10;
    for (const c of survivors) c.send({ stopAt });
    const got = await Promise.all(reports);
    for (const r of got) if (r.error || r.lefts.length !== perProc || r.firstAt === 0) throw new Error(`a survivor: ${JSON.stringify(r)}`);
    const joined = survivors.map((c) => message(c, 'joined'));
    const forkedAt = now();
    const rejoiner = fork(process.argv[1]!, ['--child', JSON.stringify({ url, W, rankOffset: victim * perProc, ranks: perProc, rejoin: true } satisfies Spec)], { stdio: 'inherit' });
    kids.push(rejoiner);
    const back = await message(rejoiner, 'rejoined');
    const joins = await Promise.all(joined);
    return {
      left: got.flatMap((r) => r.lefts.map((at) => at - killedAt)), first: got.map((r) => r.firstAt - killedAt), rejected: got.map((r) => r.rejected),
      rejoin: Math.max(...joins.map((j) => j.joinedAt! - forkedAt)), create: back.createMs!,
    };
  } finally {
    for (const c of kids) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  }
}

if (flags.child) {
  await child(JSON.parse(flags.child) as Spec);
} else {
  const result: Record<string, unknown> = {
    bench: 'elastic-world', backend: 'host', ...provenance(),
    uname: execFileSync('uname', ['-a'], { encoding: 'utf8' }).trim(), cpuModel: os.cpus()[0]?.model ?? 'unknown', cpus: os.cpus().length,
    shape: { ...SHAPE, numExperts: '8 * W' }, trials: Number(flags.trials), layouts: {},
  };
  for (const layout of flags.layouts.split(',')) {
    const [procs, perProc] = layout.split('x').map(Number) as [number, number];
    const left: number[] = [], first: number[] = [], rejected: number[] = [], rejoin: number[] = [], create: number[] = [];
    for (let t = 0; t < Number(flags.trials); t++) {
      const r = await trial(procs, perProc);
      left.push(...r.left);
      first.push(...r.first);
      rejected.push(...r.rejected);
      rejoin.push(r.rejoin);
      create.push(r.create);
    }
    const rec = { processes: procs, ranksPerProcess: perProc, killToRankLeftMs: stats(left), killToFirstSurvivorOpMs: stats(first), opsRejectedPerKill: stats(rejected),
      rejoinForkToRankJoinedMs: stats(rejoin), rejoinCreateGroupMs: stats(create) };
    (result.layouts as Record<string, unknown>)[layout] = rec;
    const f = (s: { p50: number; p99: number }) => `p50 ${s.p50.toFixed(1)} ms, p99 ${s.p99.toFixed(1)} ms`;
    console.log(`${procs} processes x ${perProc} ranks: kill -> rankLeft ${f(rec.killToRankLeftMs)}; kill -> first survivor op ${f(rec.killToFirstSurvivorOpMs)}; ` +
      `rejoin (fork -> rankJoined) ${f(rec.rejoinForkToRankJoinedMs)}, its createGroup ${f(rec.rejoinCreateGroupMs)}`);
  }
  mkdirSync(flags.out, { recursive: true });
  const file = path.join(flags.out, `elastic-host-world-${new Date().toISOString().slice(0, 10)}.json`);
  writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
  console.log(`wrote ${path.relative(process.cwd(), file)}`);
}
