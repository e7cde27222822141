// GPU benchmark (`npm run bench:gpu`, i.e. node dist/bench/gpu.js [flags]) on 2 GPUs, backend 'cuda',
// in rank-program mode with device-resident tensors and CUDA-event timing after warm-up, in one run:
// rankflow dispatch (CPU sync / no CPU sync with outputs in the buffer / cached) and combine, beside
// ncclAlltoAll of the same bytes and a copy-engine peer copy of the remote bytes, for 4096 x 7168 bf16
// top-8 of 256 (headline, with an SM sweep), fp8 dispatch, 128 and 512 tokens. Figures: µs, DeepEP's
// metric (bytes a rank receives incl. local rows / time), remote GB/s, xNCCL (NCCL time / this time),
// xCE (remote GB/s / copy-engine GB/s). Prints a table; writes bench/results/gpu-<date>.json.
// --world: the same in the one-process-per-GPU layout (bench/layout.ts), written as gpu-world-<date>.json.
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { probeCuda, sizeHint } from '../actors/index.js';
import { PACKAGE_ROOT } from '../actors/core/config.js';
import type { GpuFigure, GpuMoeArgs, GpuMoeResult } from './programs/gpu-moe.js';
import { measureOverhead } from './overhead.js';
import { runOnGpus } from './layout.js';
import { commit, command, machine } from './provenance.js';

const { values: flags } = parseArgs({
  options: {
    iters: { type: 'string', default: '30' },
    'overhead-iters': { type: 'string', default: '2000' },
    warmup: { type: 'string', default: '5' },
    sms: { type: 'string', default: '8,16,24,32,48,64,96,132' },
    out: { type: 'string', default: path.join(PACKAGE_ROOT, 'bench', 'results') },
    /** ranks = GPUs used; default: every GPU the driver sees */
    ranks: { type: 'string' },
    world: { type: 'boolean', default: false },
    child: { type: 'string' },
    rendezvous: { type: 'string' },
  },
});


async function main(): Promise<void> {
  const probe = probeCuda() as { available: boolean; reason?: string; devices: number; gpus?: Array<{ name: string; arch: string; sms: number }>; nccl?: { version?: string }; driverVersion?: string };
  const ranks = flags.ranks !== undefined ? Number(flags.ranks) : probe.devices;
  if (!probe.available || !(ranks >= 2) || probe.devices < ranks)
    throw new Error(`needs ${flags.ranks ?? 'at least 2'} GPUs with the CUDA backend: ${probe.reason ?? `${probe.devices} GPUs found`}`);
  const hidden = 7168, topk = 8, experts = 256;
  const ep = { maxTokensPerRank: 4096, hidden, topk, numExperts: experts, fp8Dispatch: true };
  const args: GpuMoeArgs = {
    hidden, topk, experts, iters: Number(flags.iters), warmup: Number(flags.warmup), seed: 1,
    sms: flags.sms!.split(',').map(Number),
    cases: [
      { name: '4096 bf16', tokens: 4096, fp8: false, sweep: true },
      { name: '4096 fp8', tokens: 4096, fp8: true, sweep: false },
      { name: '512 bf16', tokens: 512, fp8: false, sweep: false },
      { name: '128 bf16', tokens: 128, fp8: false, sweep: false },
    ],
  };
  // One process hosting every rank, or (--world) one process per GPU; children send their part and end.
  const run = await runOnGpus<GpuMoeResult>({
    self: fileURLToPath(import.meta.url),
    argv: ['--iters', flags.iters!, '--warmup', flags.warmup!, '--sms', flags.sms!, '--ranks', String(ranks)],
    world: flags.world!,
    ...(flags.child !== undefined ? { child: { rank: Number(flags.child), rendezvous: flags.rendezvous! } } : {}),
    ranks, buffer: { ...ep, bytes: sizeHint(ep, ranks) }, program: new URL('./programs/gpu-moe.js', import.meta.url), args,
  });
  if (!run) return;
  const { results, layout } = run;
  console.log(`layout: ${layout.name}`);
  const key = (f: GpuFigure) => `${f.case}|${f.op}|${f.sms}`;
  const per = new Map<string, GpuFigure[]>();
  for (const r of results) for (const f of r.figures) per.set(key(f), [...(per.get(key(f)) ?? []), f]);
  const rows = [...per.values()].map((fs) => {
    const f = fs[0]!;
    const us = (fs.reduce((s, x) => s + x.ms, 0) / fs.length) * 1e3;
    const bytes = fs.reduce((s, x) => s + x.bytes, 0) / fs.length;
    const remote = fs.reduce((s, x) => s + x.remoteBytes, 0) / fs.length;
    const dus = fs[0]!.deviceMs === undefined ? us : (fs.reduce((s, x) => s + (x.deviceMs ?? 0), 0) / fs.length) * 1e3;
    return { size: f.case, op: f.op, sms: f.sms, us, device_us: dus, device_us_rank: fs.map((x) => (x.deviceMs ?? x.ms) * 1e3),
      gbps_deepep_metric_device: bytes / (dus * 1e-6) / 1e9, gbps_remote_device: remote / (dus * 1e-6) / 1e9, x_nccl_device: NaN, x_ce_device: NaN, us_rank: fs.map((x) => x.ms * 1e3), bytes_rank: fs.map((x) => x.bytes), remote_bytes_rank: fs.map((x) => x.remoteBytes),
      gbps_deepep_metric: bytes / (us * 1e-6) / 1e9, gbps_remote: remote / (us * 1e-6) / 1e9, x_nccl: NaN, x_ce: NaN };
  });
  for (const r of rows) {
    const nccl = rows.find((x) => x.size === r.size && x.op.startsWith('NCCL'));
    const ce = rows.find((x) => x.size === r.size && x.op.startsWith('copy engine'));
    r.x_nccl = nccl ? nccl.us / r.us : NaN;
    r.x_ce = ce ? r.gbps_remote / ce.gbps_remote : NaN;
    r.x_nccl_device = nccl ? nccl.us / r.device_us : NaN;
    r.x_ce_device = ce ? r.gbps_remote_device / ce.gbps_remote : NaN;
  }
  const pad = (s: string | number, n: number) => String(s).padEnd(n);
  console.log('call = CUDA events around iters awaited calls (includes the per-call JS/executor overhead); device = events recorded natively around the op\'s launches (median)');
  console.log(`${pad('size', 10)} ${pad('op', 52)} ${pad('SMs', 4)} ${pad('call µs', 9)} ${pad('dev µs', 8)} ${pad('DeepEP GB/s call/dev', 21)} ${pad('remote GB/s dev', 16)} ${pad('xNCCL call/dev', 15)} xCE dev`);
  for (const r of rows)
    console.log(`${pad(r.size, 10)} ${pad(r.op, 52)} ${pad(r.sms || 'all', 4)} ${pad(r.us.toFixed(1), 9)} ${pad(r.device_us.toFixed(1), 8)} ${pad(`${r.gbps_deepep_metric.toFixed(1)} / ${r.gbps_deepep_metric_device.toFixed(1)}`, 21)} ${pad(r.gbps_remote_device.toFixed(1), 16)} ${pad(`${r.x_nccl.toFixed(2)} / ${r.x_nccl_device.toFixed(2)}`, 15)} ${r.x_ce_device.toFixed(2)}`);
  // Per-op overhead of a nearly free op (a barrier: ~5 µs kernel) in a rank program: wall µs per call.
  // (one process; skipped in the --world run, which measures the collectives in that layout only)
  const overhead = flags.world ? [] : await measureOverhead('cuda', ranks, Number(flags['overhead-iters']), 200);
  if (overhead.length) console.log(`per-op wall µs of a rank program's barrier (${ranks} ranks; the kernel alone takes ~5 µs on 2)`);
  for (const f of overhead) console.log(`${pad(f.op, 22)} p50 ${f.p50.toFixed(1).padStart(8)}  p99 ${f.p99.toFixed(1).padStart(8)}  mean ${f.mean.toFixed(1).padStart(8)}`);
  const date = new Date().toISOString().slice(0, 10);
  const out = {
    date, commit: commit(), machine: machine(), command: command(), layout, gpus: probe.gpus?.map((g) => `${g.name} ${g.arch} ${g.sms} SMs`), driver: probe.driverVersion, nccl: probe.nccl?.version,
    mode: 'rank program, device-resident tensors; us: CUDA events around iters awaited calls after warmup (incl. per-call JS/executor overhead); device_us: median of events recorded natively around each op launches', config: { ...ep, iters: args.iters, warmup: args.warmup },
    metric: 'gbps_deepep_metric = bytes a rank receives per dispatch incl. local rows / time; gbps_remote = bytes over NVLink per direction / time; x_nccl = NCCL time / this time; x_ce = remote GB/s / copy engine GB/s',
    figures: rows,
    overhead_us: overhead,
  };
  mkdirSync(flags.out!, { recursive: true });
  const file = path.join(flags.out!, `gpu-${layout.processes > 1 ? 'world-' : ''}${date}.json`);
  writeFileSync(file, JSON.stringify(out, null, 1) + '\n');
  console.log(`wrote ${file}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
