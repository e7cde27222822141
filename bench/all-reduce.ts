// allReduce on one GPU against its memory floor (issue 34), measured side by side in one run
// (node dist/bench/all-reduce.js [--sizes 1,4,...] [--ranks 2,4] [--out dir] [--commit sha]).
// W ranks share GPU 0 (W = 2 and 4), each all-reduces a device tensor of `size` MiB in place
// (bench/programs/all-reduce-loop.ts): the peer reduce reads every rank's slice where it lies and
// writes the sums into every rank's tensor, so the GPU must read W x size bytes and write W x size
// bytes in all. Its floor is the time of a device-to-device copy of W x size bytes (which reads and
// writes exactly that), measured in the same run by a group of one rank (benchPeerCopy into its own
// window). Printed per case: ms per allReduce (the slowest rank's mean, median of --repeats), the floor, floor / time
// (the target: >= 80% from 64 MiB), and the bus bandwidth nccl-tests would print (2 (W-1) / W x size
// / time). Writes bench/results/all-reduce-<date>.json with date, commit, machine and command.
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { createGroup, probeCuda } from '../actors/index.js';
import { PACKAGE_ROOT } from '../actors/core/config.js';
import type { AllReduceCase, AllReduceLoopArgs } from './programs/all-reduce-loop.js';
import { provenance } from './provenance.js';

const { values: flags } = parseArgs({
  options: {
    sizes: { type: 'string', default: '1,4,16,64,128,256' },
    ranks: { type: 'string', default: '2,4' },
    dtypes: { type: 'string', default: 'bf16,fp32' },
    warmup: { type: 'string', default: '5' },
    repeats: { type: 'string', default: '3' },
    out: { type: 'string', default: path.join(PACKAGE_ROOT, 'bench', 'results') },
    commit: { type: 'string', default: '' },
  },
});
const MiB = 2 ** 20;
const sizes = flags.sizes!.split(',').map((s) => Number(s) * MiB);
const worlds = flags.ranks!.split(',').map(Number);
const dtypes = flags.dtypes!.split(',') as Array<'fp32' | 'bf16'>;
const warmup = Number(flags.warmup);
const program = new URL('./programs/all-reduce-loop.js', import.meta.url);
// About 64 GiB moved per size (some 30 ms of calls): a rank that starts its loop a millisecond after
// the others adds a few per cent at most. Each case is measured `repeats` times; the median is kept.
const itersFor = (bytes: number, W: number): number => Math.max(20, Math.min(2000, Math.round(2 ** 36 / (bytes * W))));
const BUFFER = { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 4 };

async function timed(W: number, cases: AllReduceCase[], copy: boolean, bufferBytes: number): Promise<number[]> {
  const g = await createGroup({ backend: 'cuda', ranks: W, devices: Array(W).fill(0), buffer: { ...BUFFER, bytes: bufferBytes } });
  try {
    const runs: number[][] = [];
    for (let k = 0; k < Number(flags.repeats); k++) {
      const perRank = await g.run<number[]>(program, { cases, copy, warmup } satisfies AllReduceLoopArgs);
      runs.push(cases.map((_, i) => Math.max(...perRank.map((ms) => ms[i]!))));  // the slowest rank's
    }
    return cases.map((_, i) => runs.map((r) => r[i]!).sort((a, b) => a - b)[runs.length >> 1]!);
  } finally {
    await g.destroy();
  }
}

async function main(): Promise<void> {
  const probe = probeCuda() as { available: boolean; reason?: string; gpus?: Array<{ name: string }> };
  if (!probe.available) throw new Error(`backend 'cuda' is unavailable here: ${probe.reason}`);
  const rows: Array<Record<string, number | string>> = [];
  for (const W of worlds) {
    // The floor of each size: a copy of W x size bytes, by one rank alone on the GPU.
    const copyCases = sizes.map((b) => ({ dtype: 'bf16' as const, bytes: b * W, iters: itersFor(b, W) }));
    const copyMs = await timed(1, copyCases, true, Math.max(...sizes) * W + 16 * MiB);  // room beside the workspace
    for (const dtype of dtypes) {
      const cases = sizes.map((b) => ({ dtype, bytes: b, iters: itersFor(b, W) }));
      // The runtime's check: room for a staged input and its sums (the direct path uses neither).
      const ms = await timed(W, cases, false, 2 * Math.max(...sizes) + 16 * MiB);
      cases.forEach((c, i) => {
        const floor = copyMs[i]!;
        rows.push({
          ranks: W, dtype, MiB: c.bytes / MiB, iters: c.iters, ms: ms[i]!, floorMs: floor, ofFloor: floor / ms[i]!,
          copyGBps: (c.bytes * W) / (floor * 1e6), busGBps: ((2 * (W - 1)) / W) * c.bytes / (ms[i]! * 1e6),
        });
      });
    }
  }
  const pct = (x: number): string => `${(x * 100).toFixed(1)}%`;
  console.log(`allReduce on ${probe.gpus?.[0]?.name ?? 'GPU 0'}: ranks sharing GPU 0, in place, device tensors; floor = d2d copy of ranks x size bytes (same run)`);
  console.log('ranks dtype   MiB  iters     ms/op  floor ms  of floor  copy GB/s  bus GB/s');
  for (const r of rows)
    console.log(`${String(r.ranks).padStart(5)} ${String(r.dtype).padEnd(5)} ${String(r.MiB).padStart(5)} ${String(r.iters).padStart(6)} ${(r.ms as number).toFixed(4).padStart(9)} ${(r.floorMs as number).toFixed(4).padStart(9)} ${pct(r.ofFloor as number).padStart(9)} ${(r.copyGBps as number).toFixed(0).padStart(10)} ${(r.busGBps as number).toFixed(0).padStart(9)}`);
  const big = rows.filter((r) => (r.MiB as number) >= 64);
  const worst = Math.min(...big.map((r) => r.ofFloor as number));
  console.log(`target: >= 80% of the floor from 64 MiB: worst ${pct(worst)} -> ${worst >= 0.8 ? 'met' : 'NOT met'}`);
  mkdirSync(flags.out!, { recursive: true });
  const p = provenance(flags.commit || undefined);
  const file = path.join(flags.out!, `all-reduce-${p.date.slice(0, 10)}.json`);
  writeFileSync(file, JSON.stringify({ ...p, gpu: probe.gpus?.[0]?.name, rows }, null, 2) + '\n');
  console.log(`wrote ${path.relative(PACKAGE_ROOT, file)}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
