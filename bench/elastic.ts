// Elastic groups, timed (node dist/bench/elastic.js [flags]), host backend:
// - recovery: a loop of driver-mode dispatches on an elastic group while a random rank is terminated
//   at a random moment: ms from the kill to 'rankLeft' and to the first dispatch that succeeded among
//   the survivors, then replaceRank's ms; `--trials` times per world size on one group (p50, p99).
// - the degraded op's cost: rank-program rounds of dispatch + combine (bench/programs/elastic-loop.ts),
//   side by side in one run, interleaved round by round: an elastic group with one rank gone against a
//   healthy group fed what the degraded one computes (the gone rank's experts -1, its tokens none);
//   the latter once more on a second identical group (the machine's noise floor for these ratios);
//   and a healthy elastic group against a group that is not elastic (the option's own cost); and one
//   elastic group killed and replaced every round, degraded against its own healthy rounds on the
//   masked work (the same survivors' threads: no spread between two groups in that ratio).
// Writes bench/results/elastic-host-<date>.json with its provenance (date, commit, machine, uname -a,
// the CPU model, the command).
// Across processes (a world, a process SIGKILLed): bench/elastic-world.ts.
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { createGroup, type DispatchInput, type Group } from '../actors/index.js';
import { PACKAGE_ROOT } from '../actors/core/config.js';
import type { ElasticLoopArgs, ElasticLoopResult } from './programs/elastic-loop.js';
import { SHAPE, buffer, input, median, pct, stats } from './elastic-inputs.js';
import { provenance } from './provenance.js';

const { values: flags } = parseArgs({
  options: {
    ranks: { type: 'string', default: '4,8' },
    trials: { type: 'string', default: '20' },
    rounds: { type: 'string', default: '10' },
    iters: { type: 'string', default: '100' },
    out: { type: 'string', default: path.join(PACKAGE_ROOT, 'bench', 'results') },
    help: { type: 'boolean', default: false },
  },
});
if (flags.help) {
  console.log('usage: node dist/bench/elastic.js [--ranks 4,8] [--trials 20] [--rounds 10] [--iters 100] [--out dir]');
  process.exit(0);
}
const LOOP = new URL('./programs/elastic-loop.js', import.meta.url);
const now = (): number => performance.timeOrigin + performance.now();
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function recovery(W: number, trials: number) {
  const g = await createGroup({ backend: 'host', ranks: W, buffer: buffer(W), elastic: true });
  const left: number[] = [], first: number[] = [], replace: number[] = [], rejected: number[] = [];
  const inputs = Array.from({ length: W }, (_, r) => input(W, r));
  try {
    for (let t = 0; t < trials; t++) {
      const d = Math.floor(Math.random() * W);
      let killedAt = 0, firstAt = 0, failed = 0;
      const loop = (async () => {
        while (firstAt === 0) {
          const live = g.liveRanks;
          const r = await g.dispatch(inputs.map((x, q) => (live.includes(q) ? x : null)) as DispatchInput[]).then((v) => v, () => null);
          if (r === null) failed++;
          else if (killedAt > 0 && r[d] === null) firstAt = now();
        }
      })();
      await sleep(5 + Math.random() * 20);
      const gone = new Promise<{ at: number }>((resolve) => g.once('rankLeft', resolve));
      killedAt = now();
      void g.ranks[d]!.terminate();
      left.push((await gone).at - killedAt);
      await loop;
      first.push(firstAt - killedAt);
      rejected.push(failed);
      const t0 = now();
      await g.replaceRank(d);
      replace.push(now() - t0);
    }
  } finally {
    await g.destroy();
  }
  return { killToRankLeftMs: stats(left), killToFirstSurvivorOpMs: stats(first), replaceRankMs: stats(replace), opsRejectedPerKill: stats(rejected) };
}

/** One round: per iteration, the slowest live rank's ms of one dispatch + combine (the ranks start each together, after a barrier). */
async function rounds(g: Group, masked: number[], iters: number): Promise<{ ms: number[]; maskedSlots: number }> {
  const args: ElasticLoopArgs = { ...SHAPE, experts: 8 * g.worldSize, iters, warmup: 5, seed: 17, masked };
  const out = (await g.run<ElasticLoopResult | null>(LOOP, args)).filter((o): o is ElasticLoopResult => o !== null);
  return { ms: out[0]!.ms.map((_, i) => Math.max(...out.map((o) => o.ms[i]!))), maskedSlots: out.reduce((s, o) => s + o.maskedSlots, 0) };
}

async function cost(W: number, nRounds: number, iters: number) {
  const opts = { backend: 'host' as const, ranks: W, buffer: buffer(W) };
  const degraded = await createGroup({ ...opts, elastic: true });
  const healthyElastic = await createGroup({ ...opts, elastic: true });
  const plain = await createGroup(opts), plain2 = await createGroup(opts);
  // One more elastic group whose rank `dead` is killed and replaced every round: its degraded and its
  // healthy (masked) rounds run on the same survivors' threads, without the spread between two groups.
  const cycled = await createGroup({ ...opts, elastic: true });
  const dead = W - 1;
  const kill = async (g: Group) => {
    const gone = new Promise((resolve) => g.once('rankLeft', resolve));
    await g.ranks[dead]!.terminate();
    await gone;
  };
  try {
    await degraded.ranks[dead]!.terminate();
    // healthyMaskedAgain is healthyMasked on a second, identical group: the spread between the two is
    // this machine's noise floor for the other ratios (ranks of two groups are scheduled differently).
    const columns: Array<[string, Group, number[]]> = [
      ['degraded', degraded, []], ['healthyMasked', plain, [dead]], ['healthyMaskedAgain', plain2, [dead]],
      ['healthyElastic', healthyElastic, []], ['plain', plain, []],
    ];
    const ms: Record<string, number[]> = Object.fromEntries([...columns.map(([k]) => k), 'cycledDegraded', 'cycledHealthyMasked'].map((k) => [k, []]));
    let maskedSlots = 0;
    for (let i = 0; i < nRounds; i++) {
      // Interleaved, and each round in another order: a drift of the machine, or a column's place in
      // the round, hits every column alike.
      for (let j = 0; j < columns.length; j++) {
        const [name, g, masked] = columns[(i + j) % columns.length]!;
        const r = await rounds(g, masked, iters);
        if (name === 'degraded') maskedSlots = r.maskedSlots;
        ms[name]!.push(...r.ms);
      }
      // The cycled group: healthy on the masked work, the kill, degraded, the replacement; every other
      // round degraded first (it is then replaced before its healthy round).
      const healthyRound = async () => ms.cycledHealthyMasked!.push(...(await rounds(cycled, [dead], iters)).ms);
      if (i % 2 === 0) await healthyRound();
      await kill(cycled);
      ms.cycledDegraded!.push(...(await rounds(cycled, [], iters)).ms);
      await cycled.replaceRank(dead);
      if (i % 2 === 1) await healthyRound();
    }
    // Pooled over every iteration of every round: one slow round (a stolen core) moves a median little.
    const m = Object.fromEntries(Object.entries(ms).map(([k, v]) => [k, median(v)]));
    const p90 = Object.fromEntries(Object.entries(ms).map(([k, v]) => [k, pct(v, 90)]));
    return {
      medianMs: m, p90Ms: p90, samples: ms.degraded!.length, maskedSlotsPerOp: maskedSlots,
      degradedOverHealthyMasked: m.degraded! / m.healthyMasked!,
      noiseFloorHealthyMaskedAgainOverHealthyMasked: m.healthyMaskedAgain! / m.healthyMasked!,
      healthyElasticOverPlain: m.healthyElastic! / m.plain!,
      degradedOverPlainFull: m.degraded! / m.plain!,
      cycledDegradedOverHealthyMasked: m.cycledDegraded! / m.cycledHealthyMasked!,
    };
  } finally {
    await Promise.all([degraded.destroy(), healthyElastic.destroy(), plain.destroy(), plain2.destroy(), cycled.destroy()]);
  }
}

const ranks = flags.ranks.split(',').map(Number);
const result: Record<string, unknown> = {
  bench: 'elastic', backend: 'host', ...provenance(),
  uname: execFileSync('uname', ['-a'], { encoding: 'utf8' }).trim(), cpuModel: os.cpus()[0]?.model ?? 'unknown', cpus: os.cpus().length,
  shape: { ...SHAPE, numExperts: '8 * W' }, trials: Number(flags.trials), rounds: Number(flags.rounds), itersPerRound: Number(flags.iters), worlds: {},
};
for (const W of ranks) {
  const rec = await recovery(W, Number(flags.trials));
  const c = await cost(W, Number(flags.rounds), Number(flags.iters));
  (result.worlds as Record<number, unknown>)[W] = { recovery: rec, cost: c };
  const f = (s: { p50: number; p99: number }) => `p50 ${s.p50.toFixed(1)} ms, p99 ${s.p99.toFixed(1)} ms`;
  console.log(`W = ${W}: kill -> rankLeft ${f(rec.killToRankLeftMs)}; kill -> first survivor op ${f(rec.killToFirstSurvivorOpMs)}; replaceRank ${f(rec.replaceRankMs)}`);
  console.log(`W = ${W}: dispatch+combine median ms: degraded ${c.medianMs.degraded!.toFixed(3)}, healthy on the masked inputs ${c.medianMs.healthyMasked!.toFixed(3)} ` +
    `(ratio ${c.degradedOverHealthyMasked.toFixed(3)}; the same on a second group: ${c.noiseFloorHealthyMaskedAgainOverHealthyMasked.toFixed(3)}); healthy elastic ${c.medianMs.healthyElastic!.toFixed(3)}, not elastic ${c.medianMs.plain!.toFixed(3)} (ratio ${c.healthyElasticOverPlain.toFixed(3)}); ` +
    `one group killed and replaced each round: degraded ${c.medianMs.cycledDegraded!.toFixed(3)}, healthy on the masked inputs ${c.medianMs.cycledHealthyMasked!.toFixed(3)} (ratio ${c.cycledDegradedOverHealthyMasked.toFixed(3)})`);
}
mkdirSync(flags.out, { recursive: true });
const file = path.join(flags.out, `elastic-host-${new Date().toISOString().slice(0, 10)}.json`);
writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
console.log(`wrote ${path.relative(process.cwd(), file)}`);
