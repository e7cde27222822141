// Host-backend benchmark (`npm run bench`, i.e. node dist/bench/host.js [flags]):
//  - dispatch and combine throughput in a rank program, DeepEP's metric (bytes a rank receives per
//    dispatch, local rows included, over the call's time), beside a plain memcpy (TypedArray.set) of
//    the same bytes in the same run, on the same ranks at the same time; the ratio is the figure.
//  - the per-call overhead of a tiny collective (barrier), driver mode vs rank program, p50/p99 µs.
// Prints a table and writes bench/results/host-<date>.json (date, commit, machine, command, config, figures).
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { createGroup } from '../actors/index.js';
import { PACKAGE_ROOT } from '../actors/core/config.js';
import type { MoeLoopArgs, MoeLoopResult } from './programs/moe-loop.js';
import { commit, command, machine } from './provenance.js';

const { values: flags } = parseArgs({
  options: {
    ranks: { type: 'string', default: '4' },
    tokens: { type: 'string', default: '512' },
    hidden: { type: 'string', default: '2048' },
    topk: { type: 'string', default: '8' },
    experts: { type: 'string', default: '64' },
    iters: { type: 'string', default: '50' },
    warmup: { type: 'string', default: '3' },
    'barrier-iters': { type: 'string', default: '2000' },
    out: { type: 'string', default: path.join(PACKAGE_ROOT, 'bench', 'results') },
    help: { type: 'boolean', default: false },
  },
});
if (flags.help) {
  console.log('usage: node dist/bench/host.js [--ranks 4] [--tokens 512] [--hidden 2048] [--topk 8] [--experts 64] [--iters 50] [--warmup 3] [--barrier-iters 2000] [--out dir]');
  process.exit(0);
}
const int = (name: keyof typeof flags): number => {
  const v = Number(flags[name]);
  if (!Number.isInteger(v) || v < 0) throw new Error(`--${name} must be a non-negative integer (got ${String(flags[name])})`);
  return v;
};
const ranks = int('ranks');
const moe: Omit<MoeLoopArgs, 'seed'> = { tokens: int('tokens'), hidden: int('hidden'), topk: int('topk'), experts: int('experts'), iters: int('iters'), warmup: int('warmup') };
const barrierIters = int('barrier-iters');

const quantile = (xs: number[], q: number): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))] ?? NaN;
};
const median = (xs: number[]): number => quantile(xs, 0.5);
const gbps = (bytes: number, ms: number): number => bytes / (ms * 1e-3) / 1e9;
const mean = (xs: number[]): number => xs.reduce((a, b) => a + b, 0) / xs.length;


async function main(): Promise<void> {
  const cpu = os.cpus()[0]?.model ?? 'unknown';
  console.log(`rankflow host benchmark: ${ranks} ranks, ${moe.tokens} tokens x ${moe.hidden} hidden bf16, top-${moe.topk} of ${moe.experts} experts; ${os.cpus().length} cores (${cpu})`);
  const group = await createGroup({
    ranks, backend: 'host',
    buffer: { maxTokensPerRank: moe.tokens, hidden: moe.hidden, topk: moe.topk, numExperts: moe.experts },
  });
  try {
    const moeUrl = new URL('./programs/moe-loop.js', import.meta.url);
    const perRank = await group.run<MoeLoopResult>(moeUrl, { ...moe, seed: 1 } satisfies MoeLoopArgs);
    const rows = perRank.map((r) => ({
      rank: r.rank,
      recvTokens: r.recvTokens,
      bytes: r.bytes,
      dispatchMs: median(r.dispatchMs),
      combineMs: median(r.combineMs),
      memcpyMs: median(r.memcpyMs),
    }));
    const dispatchGBps = mean(rows.map((r) => gbps(r.bytes, r.dispatchMs)));
    const combineGBps = mean(rows.map((r) => gbps(r.bytes, r.combineMs)));
    const memcpyGBps = mean(rows.map((r) => gbps(r.bytes, r.memcpyMs)));

    const driverUs: number[] = [];
    for (let i = 0; i < barrierIters / 10; i++) await group.barrier(); // warm-up
    for (let i = 0; i < barrierIters; i++) {
      const t0 = performance.now();
      await group.barrier();
      driverUs.push((performance.now() - t0) * 1000);
    }
    const programUs = (await group.run<number[]>(new URL('./programs/barrier-loop.js', import.meta.url), { iters: barrierIters, warmup: barrierIters / 10 })).flat();

    console.log('\nthroughput (median per call, mean over ranks; bytes = rows a rank receives, local included)');
    console.log(' rank  recv tokens   MiB/call  dispatch ms  combine ms  memcpy ms');
    for (const r of rows) {
      console.log(`${String(r.rank).padStart(5)}  ${String(r.recvTokens).padStart(11)}  ${(r.bytes / 2 ** 20).toFixed(2).padStart(9)}  ${r.dispatchMs.toFixed(3).padStart(11)}  ${r.combineMs.toFixed(3).padStart(10)}  ${r.memcpyMs.toFixed(3).padStart(9)}`);
    }
    console.log('\n op         GB/s    vs memcpy');
    console.log(` dispatch  ${dispatchGBps.toFixed(2).padStart(6)}    ${(dispatchGBps / memcpyGBps).toFixed(3)}`);
    console.log(` combine   ${combineGBps.toFixed(2).padStart(6)}    ${(combineGBps / memcpyGBps).toFixed(3)}`);
    console.log(` memcpy    ${memcpyGBps.toFixed(2).padStart(6)}    1.000`);
    const barrier = {
      driver: { p50: quantile(driverUs, 0.5), p99: quantile(driverUs, 0.99), calls: driverUs.length },
      program: { p50: quantile(programUs, 0.5), p99: quantile(programUs, 0.99), calls: programUs.length },
    };
    console.log(`\nbarrier overhead (${ranks} ranks)   p50 µs    p99 µs`);
    console.log(` driver mode              ${barrier.driver.p50.toFixed(1).padStart(8)}  ${barrier.driver.p99.toFixed(1).padStart(8)}`);
    console.log(` rank program             ${barrier.program.p50.toFixed(1).padStart(8)}  ${barrier.program.p99.toFixed(1).padStart(8)}`);

    const date = new Date().toISOString();
    const result = {
      date, commit: commit(), machine: machine(), command: command(), cpu, cores: os.cpus().length, node: process.version, backend: 'host',
      config: { ranks, ...moe, barrierIters },
      throughput: { dispatchGBps, combineGBps, memcpyGBps, dispatchVsMemcpy: dispatchGBps / memcpyGBps, combineVsMemcpy: combineGBps / memcpyGBps, perRank: rows },
      barrierUs: barrier,
    };
    mkdirSync(flags.out!, { recursive: true });
    const file = path.join(flags.out!, `host-${date.slice(0, 19).replace(/:/g, '-')}.json`);
    writeFileSync(file, JSON.stringify(result, null, 2) + '\n');
    console.log(`\nwrote ${path.relative(process.cwd(), file)}`);
  } finally {
    await group.destroy();
  }
}

await main();
