// GPU benchmark of AGRS sessions, reduce-scatter, engram fetch and pipeline send/recv on 2 GPUs
// (node dist/bench/gpu-agrs.js [--world] [--out dir] [--commit sha]). A rank program runs native benchmarks on
// device-resident data (ctx.benchAgrs: the ops' own kernels and copies, without the driver mode's
// host<->device staging), timed with CUDA events over `iters` back-to-back calls:
//  - ce: the copy-engine limit, cuMemcpyAsync of my bytes into the peer's window, no signals;
//  - ag: session allGather (put + done signals) through peer pointers (kernel) and copy engines (ce);
//  - rs-fp32 / rs-bf16: session reduce-scatter (put of W chunks + done + the reduce kernel);
//  - pp: pipeline send/recv to the next rank with the enter/done protocol;
//  - engram: fetch of 512 tokens x 24 entries rows of 128 bf16 from the host segments (random ids).
// GB/s = bytes a rank sends to peers per call / time (allGather, reduce-scatter: bytes per rank x
// (W-1)); engram: rows and bytes fetched per second. Writes bench/results/gpu-agrs-<date>.json.
// Layouts: by default one process hosts both ranks (createGroup({ ranks: 2 })). With --world, 2
// processes x 1 GPU: the launcher forks this file once per GPU (--child k --rendezvous url); child k
// hosts global rank k on GPU k (createGroup({ ranks: 1, devices: [k], world: { size: 2, rankOffset: k,
// rendezvous } })) and runs the same rank program; the launcher collects both ranks' times over IPC,
// prints the same table and writes bench/results/gpu-agrs-world-<date>.json (layout recorded).
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { PACKAGE_ROOT } from '../actors/core/config.js';
import type { AgrsCase, AgrsLoopArgs, AgrsLoopResult } from './programs/agrs-loop.js';
import { runOnGpus } from './layout.js';
import { commit, command, machine } from './provenance.js';

const { values: flags } = parseArgs({
  options: {
    out: { type: 'string', default: path.join(PACKAGE_ROOT, 'bench', 'results') },
    commit: { type: 'string', default: '' },  // else RANKFLOW_COMMIT, else git (provenance.ts)
    world: { type: 'boolean', default: false },
    child: { type: 'string' },
    rendezvous: { type: 'string' },
  },
});

const MiB = 1 << 20;
const W = 2;
const SIZES = [1, 2, 4, 8, 16, 32, 64].map((m) => m * MiB);
const ENGRAM = { tokens: 512, entries: 24, hidden: 128, entriesPerRank: 65536 };
const ROW_BYTES = ENGRAM.hidden * 2;
const BUFFER = {
  maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 4,
  bytes: 64 * MiB * W + 32 * MiB, cpuBytes: ENGRAM.entriesPerRank * ROW_BYTES, hybrid: true,
};


const iters = (bytes: number): number => Math.max(20, Math.min(500, Math.round((256 * MiB) / bytes)));
const kinds: Array<[string, AgrsCase['engine']]> = [
  ['ce', 'ce'], ['ag', 'kernel'], ['ag', 'ce'], ['rs-fp32', 'kernel'], ['rs-fp32', 'ce'], ['rs-bf16', 'kernel'],
  ['pp', 'kernel'], ['pp', 'ce'],
];

const cases: AgrsCase[] = [];
for (const bytes of SIZES) for (const [op, engine] of kinds) cases.push({ op, engine, bytes, iters: iters(bytes) });
const FETCH_ROWS = ENGRAM.tokens * ENGRAM.entries;
cases.push({ op: 'engram', engine: 'auto', bytes: FETCH_ROWS, iters: 200 });
const ARGS: AgrsLoopArgs = { cases, engram: { entriesPerRank: ENGRAM.entriesPerRank, hidden: ENGRAM.hidden } };
const PROGRAM = new URL('./programs/agrs-loop.js', import.meta.url);

/** Prints the table and writes the JSON; `perRank` holds both ranks' times, in rank order. */
function report(perRank: AgrsLoopResult[], gpus: string[], layout: { name: string; processes: number; ranksPerProcess: number }): void {
  // The slower rank's time per call is the collective's.
  const us = cases.map((_, i) => Math.max(...perRank.map((r) => r.us[i]!)));
  const gbps = (bytes: number, t: number): number => bytes / (t * 1e-6) / 1e9;
  const figures = cases.map((c, i): AgrsCase & { us: number; GBps: number; rowsPerSec?: number } => {
    const t = us[i]!;
    if (c.op === 'engram') return { ...c, us: t, rowsPerSec: c.bytes / (t * 1e-6), GBps: gbps(c.bytes * ROW_BYTES, t) };
    const sent = c.op === 'pp' ? c.bytes : c.bytes * (W - 1);
    return { ...c, us: t, GBps: gbps(sent, t) };
  });
  const table: Array<Record<string, number>> = [];
  console.log(`\nrankflow GPU AGRS benchmark: ${W} x ${gpus[0]}, ${layout.processes} process(es) x ${layout.ranksPerProcess} GPU(s), device-resident data, CUDA events`);
  console.log('| MiB/rank | CE limit GB/s | AG kernel | AG CE | AG best % of CE | RS fp32 kernel | RS fp32 CE | RS bf16 kernel | PP kernel | PP CE |');
  console.log('|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const bytes of SIZES) {
    const f = (op: string, engine: string): number => figures.find((x) => x.bytes === bytes && x.op === op && x.engine === engine)!.GBps;
    const row = {
      MiB: bytes / MiB, ce: f('ce', 'ce'), agKernel: f('ag', 'kernel'), agCe: f('ag', 'ce'),
      rsFp32Kernel: f('rs-fp32', 'kernel'), rsFp32Ce: f('rs-fp32', 'ce'), rsBf16Kernel: f('rs-bf16', 'kernel'),
      ppKernel: f('pp', 'kernel'), ppCe: f('pp', 'ce'),
    };
    table.push(row);
    const best = Math.max(row.agKernel, row.agCe);
    console.log(`| ${row.MiB} | ${row.ce.toFixed(1)} | ${row.agKernel.toFixed(1)} | ${row.agCe.toFixed(1)} | ${((100 * best) / row.ce).toFixed(1)} | ${row.rsFp32Kernel.toFixed(1)} | ${row.rsFp32Ce.toFixed(1)} | ${row.rsBf16Kernel.toFixed(1)} | ${row.ppKernel.toFixed(1)} | ${row.ppCe.toFixed(1)} |`);
  }
  const e = figures.at(-1)!;
  console.log(`\nengram fetch ${ENGRAM.tokens} tokens x ${ENGRAM.entries} entries x ${ENGRAM.hidden} hidden bf16 (${FETCH_ROWS} rows of ${ROW_BYTES} B from hybrid host segments): ${e.us.toFixed(1)} us, ${(e.rowsPerSec! / 1e6).toFixed(2)} M rows/s, ${e.GBps.toFixed(2)} GB/s`);
  const date = new Date().toISOString();
  const result = { date, commit: commit(flags.commit), machine: machine(), command: command(), gpus, worldSize: W, layout, node: process.version, method: 'rank program, ctx.benchAgrs, CUDA events, max over ranks', engram: ENGRAM, table, figures, perRankUs: perRank };
  mkdirSync(flags.out!, { recursive: true });
  const prefix = layout.processes > 1 ? 'gpu-agrs-world' : 'gpu-agrs';
  const file = path.join(flags.out!, `${prefix}-${date.slice(0, 19).replace(/:/g, '-')}.json`);
  writeFileSync(file, JSON.stringify(result, null, 2) + '\n');
  console.log(`\nwrote ${file}`);
}

// One process hosting both ranks, or (--world) one process per GPU; children send their part and end.
const run = await runOnGpus<AgrsLoopResult>({
  self: fileURLToPath(import.meta.url),
  argv: ['--commit', commit(flags.commit)],
  world: flags.world!,
  ...(flags.child !== undefined ? { child: { rank: Number(flags.child), rendezvous: flags.rendezvous! } } : {}),
  ranks: W, buffer: BUFFER, program: PROGRAM, args: ARGS,
});
if (run) report(run.results, run.gpus, run.layout);
