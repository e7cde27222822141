// In-place AGRS and overlapping engram fetches (node dist/bench/agrs-inplace.js [--backend host|cuda]
// [--ranks 2] [--sizes 0.0625,1,4] [--ops 40] [--rows 16384] [--hidden 1024] [--work-ms 20]
// [--iters 10] [--out dir]). A rank program (bench/programs/agrs-inplace-loop.ts) measures, per size:
// an allGather of an ordinary tensor (copied in and out) vs one of a session tensor with
// { async: true } (no local copy, the result a view); and an engram fetch with a fixed amount of CPU
// work, one after the other vs started together. cuda runs its ranks on GPU 0 (shared, as the
// tests do). Prints a table; writes bench/results/agrs-inplace-<backend>-<date>.json.
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { createGroup, engramSizeHint } from '../actors/index.js';
import { PACKAGE_ROOT } from '../actors/core/config.js';
import type { InplaceLoopArgs, InplaceLoopResult } from './programs/agrs-inplace-loop.js';
import { commit, command, machine } from './provenance.js';

const { values: flags } = parseArgs({
  options: {
    backend: { type: 'string', default: 'host' },
    ranks: { type: 'string', default: '2' },
    sizes: { type: 'string' },
    ops: { type: 'string', default: '40' },
    rows: { type: 'string', default: '16384' },
    hidden: { type: 'string', default: '1024' },
    'work-ms': { type: 'string', default: '20' },
    iters: { type: 'string', default: '10' },
    out: { type: 'string', default: path.join(PACKAGE_ROOT, 'bench', 'results') },
    help: { type: 'boolean', default: false },
  },
});
if (flags.help) {
  console.log('usage: node dist/bench/agrs-inplace.js [--backend host|cuda] [--ranks 2] [--sizes MiB,MiB,..] [--ops 40] [--rows 16384] [--hidden 1024] [--work-ms 20] [--iters 10] [--out dir]');
  process.exit(0);
}
const backend = flags.backend === 'cuda' ? 'cuda' : 'host';
const num = (name: keyof typeof flags): number => {
  const v = Number(flags[name]);
  if (!Number.isFinite(v) || v <= 0) throw new Error(`--${name} must be a positive number (got ${String(flags[name])})`);
  return v;
};
const MiB = 1 << 20;
const ranks = num('ranks');
const sizes = (flags.sizes ?? (backend === 'cuda' ? '0.0625,1,4,16' : '0.0625,1,4')).split(',').map((s) => Math.round((Number(s) * MiB) / 16) * 16);
const fetch = { rows: num('rows'), entriesPerRank: num('rows'), hidden: num('hidden'), workMs: num('work-ms'), iters: num('iters') };
const args: InplaceLoopArgs = { sizes, opsPerSize: num('ops'), fetch };

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;


async function main(): Promise<void> {
  const maxSize = Math.max(...sizes);
  const buffer = {
    maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 4 * ranks,
    bytes: Math.max(64 * MiB, 4 * ranks * maxSize + 8 * MiB),
    cpuBytes: engramSizeHint({ entriesPerRank: fetch.entriesPerRank, hidden: fetch.hidden }),
  };
  const group = await createGroup({ backend, ranks, buffer, ...(backend === 'cuda' ? { devices: Array(ranks).fill(0) } : {}) });
  try {
    const device = backend === 'cuda' ? (await group.info(0)).device?.name ?? 'unknown' : `${os.cpus().length} cores (${os.cpus()[0]?.model ?? 'unknown'})`;
    console.log(`rankflow in-place AGRS and fetch overlap: ${ranks} ranks on ${backend} (${device}${backend === 'cuda' ? ', all on GPU 0' : ''})`);
    const perRank = await group.run<InplaceLoopResult>(new URL('./programs/agrs-inplace-loop.js', import.meta.url), args);
    // The slower rank's median is the collective's.
    const gather = sizes.map((bytes, i) => {
      const copyUs = Math.max(...perRank.map((r) => median(r.gather[i]!.copyUs)));
      const inplaceUs = Math.max(...perRank.map((r) => median(r.gather[i]!.inplaceUs)));
      const gbps = (us: number) => (bytes * (ranks - 1)) / (us * 1e-6) / 1e9;
      return { bytes, copyUs, inplaceUs, copyGBps: gbps(copyUs), inplaceGBps: gbps(inplaceUs), speedup: copyUs / inplaceUs };
    });
    console.log(`\nallGather per rank   copy µs   in place µs   copy GB/s   in place GB/s   speed-up   (${backend === 'cuda' ? 'CUDA events' : 'wall time'}, median, slower rank; GB/s = bytes sent to peers / time)`);
    for (const g of gather)
      console.log(`${(g.bytes / MiB).toFixed(4).padStart(9)} MiB  ${g.copyUs.toFixed(1).padStart(10)}  ${g.inplaceUs.toFixed(1).padStart(12)}  ${g.copyGBps.toFixed(2).padStart(10)}  ${g.inplaceGBps.toFixed(2).padStart(14)}  ${g.speedup.toFixed(2).padStart(8)}x`);
    const f = perRank.map((r) => r.fetch!);
    const fig = (k: 'fetchMs' | 'workMs' | 'serialMs' | 'overlapMs') => Math.max(...f.map((x) => median(x[k])));
    const overlap = { fetchMs: fig('fetchMs'), workMs: fig('workMs'), serialMs: fig('serialMs'), overlapMs: fig('overlapMs') };
    const ideal = Math.max(overlap.fetchMs, overlap.workMs);
    const hidden = (overlap.serialMs - overlap.overlapMs) / Math.min(overlap.fetchMs, overlap.workMs);
    console.log(`\nengram fetch of ${fetch.rows} rows x ${fetch.hidden * 2} B (${((fetch.rows * fetch.hidden * 2) / MiB).toFixed(1)} MiB) with ~${fetch.workMs} ms of CPU work (median ms, slower rank)`);
    console.log(`  fetch alone ${overlap.fetchMs.toFixed(2)}   work alone ${overlap.workMs.toFixed(2)}   one after the other ${overlap.serialMs.toFixed(2)}   started together ${overlap.overlapMs.toFixed(2)}   (ideal ${ideal.toFixed(2)}; ${(100 * hidden).toFixed(0)}% of the shorter one hidden)`);
    const date = new Date().toISOString();
    const result = { date, commit: commit(), machine: machine(), command: command(), node: process.version, backend, device, ranks, config: { ...args, buffer }, gather, overlap: { ...overlap, ideal, hiddenFraction: hidden }, perRank };
    mkdirSync(flags.out!, { recursive: true });
    const file = path.join(flags.out!, `agrs-inplace-${backend}-${date.slice(0, 19).replace(/:/g, '-')}.json`);
    writeFileSync(file, JSON.stringify(result, null, 2) + '\n');
    console.log(`\nwrote ${path.relative(process.cwd(), file)}`);
  } finally {
    await group.destroy();
  }
}

await main();
