// Scale-out benchmark of the host backend (node dist/bench/scaleout.js [flags]): the same world of
// processes, one per node, run twice on this machine:
//   flat      : every process names one nodeId: ranks share memory, one level (the host executor);
//   two-level : each process names its own nodeId (simulated nodes): nothing is shared between nodes
//               and every byte between them takes the scale-out leg (TCP between rail peers).
// Per layout: dispatch and combine per call (median over a rank program's rounds, slowest rank), the
// bytes each rank sends over the scale-out leg per dispatch and per combine (group.traffic()), what
// the flat design would send between the same nodes (a row per remote destination rank), and the
// time the scale-out exchanges took. Writes bench/results/scaleout-host-<date>.json.
import { fork } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { PACKAGE_ROOT } from '../actors/core/config.js';
import type { MoeLoopResult } from './programs/moe-loop.js';
import { freePort } from './free-port.js';
import { commit, command, machine } from './provenance.js';

const { values: flags } = parseArgs({
  options: {
    nodes: { type: 'string', default: '2' },
    'per-node': { type: 'string', default: '2' },
    tokens: { type: 'string', default: '512' },
    hidden: { type: 'string', default: '2048' },
    topk: { type: 'string', default: '8' },
    experts: { type: 'string', default: '64' },
    iters: { type: 'string', default: '20' },
    warmup: { type: 'string', default: '3' },
    out: { type: 'string', default: path.join(PACKAGE_ROOT, 'bench', 'results') },
    help: { type: 'boolean', default: false },
  },
});
if (flags.help) {
  console.log('usage: node dist/bench/scaleout.js [--nodes 2] [--per-node 2] [--tokens 512] [--hidden 2048] [--topk 8] [--experts 64] [--iters 20] [--warmup 3] [--out dir]');
  process.exit(0);
}
const int = (name: keyof typeof flags): number => {
  const v = Number(flags[name]);
  if (!Number.isInteger(v) || v < 1) throw new Error(`--${name} must be a positive integer (got ${String(flags[name])})`);
  return v;
};
const nodes = int('nodes'), perNode = int('per-node'), W = nodes * perNode;
const moe = { tokens: int('tokens'), hidden: int('hidden'), topk: int('topk'), experts: int('experts'), iters: int('iters'), warmup: int('warmup') };

interface Traffic { rank: number; up: number; out: number; outSeconds: number }
interface ChildResult { loop: MoeLoopResult[]; looped: Traffic[]; dispatch: Traffic[]; combine: Traffic[] }

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;
const sum = (xs: number[]): number => xs.reduce((a, b) => a + b, 0);

async function runWorld(twoLevel: boolean): Promise<ChildResult[]> {
  const url = `tcp://127.0.0.1:${await freePort()}`;
  const child = path.join(path.dirname(fileURLToPath(import.meta.url)), 'scaleout-child.js');
  return Promise.all(Array.from({ length: nodes }, (_, n) => new Promise<ChildResult>((resolve, reject) => {
    const c = fork(child, [JSON.stringify({ url, worldSize: W, rankOffset: n * perNode, ranks: perNode, nodeId: twoLevel ? `bench-node-${n}` : 'bench-node', moe })],
      { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    let got: ChildResult | undefined;
    c.on('message', (m: { kind: string } & ChildResult) => { if (m.kind === 'result') got = m; });
    c.on('exit', (code) => (got && code === 0 ? resolve(got) : reject(new Error(`bench process ${n} exited with ${code} before its result`))));
  })));
}

/** Rows a dispatch of these inputs would send between nodes if every remote destination rank got its own copy (the flat design). */
function flatRemoteRows(): number[] {
  const out: number[] = [];
  for (let g = 0; g < W; g++) {
    let s = (1 + g * 7919) >>> 0;
    const rng = (): number => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296);
    let rows = 0;
    for (let t = 0; t < moe.tokens; t++) {
      const picked = new Set<number>();
      while (picked.size < moe.topk) picked.add(Math.floor(rng() * moe.experts));
      const ranks = new Set([...picked].map((e) => Math.floor(e / (moe.experts / W))));
      rows += [...ranks].filter((p) => Math.floor(p / perNode) !== Math.floor(g / perNode)).length;
    }
    out.push(rows);
  }
  return out;
}

function summary(results: ChildResult[]) {
  const loop = results.flatMap((r) => r.loop);
  const dispatch = results.flatMap((r) => r.dispatch), combine = results.flatMap((r) => r.combine), looped = results.flatMap((r) => r.looped);
  const rounds = moe.warmup + moe.iters;
  return {
    dispatchMs: Math.max(...loop.map((r) => median(r.dispatchMs))),
    combineMs: Math.max(...loop.map((r) => median(r.combineMs))),
    scaleOutBytesPerDispatch: dispatch.map((t) => t.out),
    scaleOutBytesPerCombine: combine.map((t) => t.out),
    scaleUpBytesPerDispatch: dispatch.map((t) => t.up),
    scaleOutMsPerDispatch: Math.max(...dispatch.map((t) => t.outSeconds * 1e3)),
    scaleOutMsPerCombine: Math.max(...combine.map((t) => t.outSeconds * 1e3)),
    scaleOutMsPerRound: Math.max(...looped.map((t) => (t.outSeconds * 1e3) / rounds)),
  };
}


const cpu = os.cpus()[0]?.model ?? 'unknown';
console.log(`rankflow scale-out benchmark (host): ${nodes} nodes x ${perNode} ranks, a process per node; ${moe.tokens} tokens x ${moe.hidden} bf16, ` +
  `top-${moe.topk} of ${moe.experts}; ${os.cpus().length} cores (${cpu})`);
const flat = summary(await runWorld(false));
const two = summary(await runWorld(true));
const record = moe.hidden * 2 + moe.topk * 8 + 4;  // a token record: bf16 row, k ids, k weights, token id
const flatRows = flatRemoteRows();
const dedupRows = two.scaleOutBytesPerDispatch.map((b) => b / record);
const fmt = (x: number): string => x.toFixed(2);
const MiB = (b: number): string => (b / 2 ** 20).toFixed(2);
console.log('');
console.log('| layout | dispatch ms | combine ms | scale-out MiB per dispatch (sum over ranks) | per combine | scale-out ms per dispatch / combine (slowest rank) |');
console.log('|---|---:|---:|---:|---:|---:|');
console.log(`| flat (one node, shared memory) | ${fmt(flat.dispatchMs)} | ${fmt(flat.combineMs)} | ${MiB(sum(flat.scaleOutBytesPerDispatch))} | ${MiB(sum(flat.scaleOutBytesPerCombine))} | - |`);
console.log(`| two-level (${nodes} simulated nodes) | ${fmt(two.dispatchMs)} | ${fmt(two.combineMs)} | ${MiB(sum(two.scaleOutBytesPerDispatch))} | ${MiB(sum(two.scaleOutBytesPerCombine))} | ${fmt(two.scaleOutMsPerDispatch)} / ${fmt(two.scaleOutMsPerCombine)} |`);
console.log('');
console.log(`token records across nodes per dispatch: ${sum(dedupRows)} (one per token and remote node); a copy per remote rank would be ${sum(flatRows)} ` +
  `(${fmt(sum(flatRows) / Math.max(1, sum(dedupRows)))}x)`);
const date = new Date().toISOString().replace(/:/g, '-').slice(0, 19);
mkdirSync(flags.out!, { recursive: true });
const file = path.join(flags.out!, `scaleout-host-${date}.json`);
writeFileSync(file, JSON.stringify({
  date: new Date().toISOString(), commit: commit(), machine: machine(), command: command(), cpu: { model: cpu, cores: os.cpus().length }, config: { nodes, perNode, ...moe },
  recordBytes: record, flat, twoLevel: two, remoteRecordsPerDispatch: dedupRows, remoteRowsWithoutDedup: flatRows,
}, null, 2));
console.log(`results: ${file}`);
