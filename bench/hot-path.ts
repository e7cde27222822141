// The hot path (issues 16, 36): what an operation costs through rankflow's API beside what its kernels
// take, measured side by side in one run (node dist/bench/hot-path.js [--backend cuda|host]).
//   cuda: groups of 1, 2 and 4 ranks sharing GPU 0 (--ranks), rank programs on device tensors
//         (bench/programs/hot-path.ts): barriers, dispatch / combine at 128 and 4096 tokens x 7168 bf16
//         (top-8 of 256), fp8 cached dispatch beside bf16, a captured graph of cached dispatch +
//         combine, driver-mode barrier; beside torch on the same GPU (bench/index_select.py:
//         index_select of the same rows, a copy, the host cost of a trivial op) when --python finds torch.
//         Every 4096-token op's memory floor (issue 36): the bytes all ranks of the group read and write
//         (the program's opBytes, summed: they share one GPU) over the bandwidth of a device-to-device
//         copy (read + write) timed in the same run by the group of one rank, and the op's ratio to it.
//   host: a rank program's barrier with 2 ranks beside a bare Atomics.wait/notify ping-pong between
//         two worker threads, and with 1 rank.
// Prints a table with the targets; writes bench/results/hot-path-<backend>-<date>.json with
// date, commit, machine and command.
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { Worker } from 'node:worker_threads';

import { createGroup, probeCuda, sizeHint } from '../actors/index.js';
import { PACKAGE_ROOT } from '../actors/core/config.js';
import type { HotFigure, HotPathArgs, OpBytes } from './programs/hot-path.js';
import type { OverheadFigure } from './programs/op-overhead.js';
import { commit, command, machine } from './provenance.js';

const { values: flags } = parseArgs({
  options: {
    backend: { type: 'string', default: 'cuda' },
    iters: { type: 'string', default: '1000' },
    warmup: { type: 'string', default: '50' },
    tokens: { type: 'string', default: '128,4096' },
    ranks: { type: 'string', default: '1,2,4' },
    python: { type: 'string', default: process.env.RANKFLOW_TORCH_PYTHON ?? 'python3' },
    out: { type: 'string', default: path.join(PACKAGE_ROOT, 'bench', 'results') },
  },
});
const iters = Number(flags.iters), warmup = Number(flags.warmup);
const pct = (xs: number[], q: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * q))]!;


/** p50 µs of awaited driver-mode (main-thread) barriers. */
async function driverBarrier(g: Awaited<ReturnType<typeof createGroup>>): Promise<number> {
  for (let i = 0; i < warmup; i++) await g.barrier();
  const us: number[] = [];
  for (let i = 0; i < Math.min(iters, 500); i++) {
    const t0 = performance.now();
    await g.barrier();
    us.push((performance.now() - t0) * 1e3);
  }
  return pct(us, 0.5);
}

async function cudaRun() {
  const probe = probeCuda() as { available: boolean; reason?: string; gpus?: Array<{ name: string; arch: string; sms: number }>; driverVersion?: string };
  if (!probe.available) throw new Error(`backend 'cuda' is unavailable here: ${probe.reason}`);
  const tokens = flags.tokens!.split(',').map(Number);
  const ep = { maxTokensPerRank: Math.max(...tokens), hidden: 7168, topk: 8, numExperts: 256, fp8Dispatch: true };
  const args: HotPathArgs = { hidden: ep.hidden, topk: ep.topk, experts: ep.numExperts, tokens, iters, warmup, fp8: true, floorTokens: 4096 };
  const groups: Record<string, { ranks: number; figures: HotFigure[]; driverBarrierP50: number; launches?: { graph: number; direct: number; fusedDispatches: number } }> = {};
  // The copy the floors divide by: the x of the largest token count, by the 1-rank group (or a group of its own).
  const copyBytes = Math.max(...tokens) * ep.hidden * 2;
  const worlds = flags.ranks!.split(',').map(Number);
  let copy: { bytes: number; us: number; GBps: number } | undefined;
  const takeCopy = (fs: HotFigure[]) => {
    const c = fs.find((f) => f.op === 'device-to-device copy');
    if (c) copy = { bytes: c.copy_bytes!, us: c.copy_us!, GBps: (2 * c.copy_bytes!) / (c.copy_us! * 1e3) };
  };
  if (!worlds.includes(1)) {
    const g = await createGroup({ backend: 'cuda', ranks: 1, devices: [0], buffer: { ...ep, bytes: sizeHint(ep, 1) } });
    try {
      takeCopy((await g.run<HotFigure[]>(new URL('./programs/hot-path.js', import.meta.url), { ...args, tokens: [], copyBytes }))[0]!);
    } finally {
      await g.destroy();
    }
  }
  for (const ranks of worlds) {
    const g = await createGroup({ backend: 'cuda', ranks, devices: Array(ranks).fill(0), buffer: { ...ep, bytes: sizeHint(ep, ranks) } });
    try {
      const per = await g.run<HotFigure[]>(new URL('./programs/hot-path.js', import.meta.url), ranks === 1 ? { ...args, copyBytes } : args);
      if (ranks === 1) takeCopy(per[0]!);
      // The slower rank of each figure: every rank waits for the slowest anyway.
      const figures = per[0]!.map((f, i) => {
        const all = per.map((r) => r[i]!);
        const m = (k: keyof HotFigure) => (f[k] === undefined ? undefined : Math.max(...all.map((x) => x[k] as number)));
        // Bytes add up over the ranks: they share the GPU's memory.
        const sum = (k: keyof OpBytes) => all.reduce((s, x) => s + x.bytes![k], 0);
        const bytes = f.bytes ? { read: sum('read'), write: sum('write'), minRead: sum('minRead'), minWrite: sum('minWrite') } : undefined;
        return { ...f, ...(bytes ? { bytes } : {}), call_p50_us: m('call_p50_us'), call_p99_us: m('call_p99_us'), loop_us: m('loop_us'), device_us: m('device_us'), b2b_device_us: m('b2b_device_us'), host_us: m('host_us'), cpu_ref_us: m('cpu_ref_us') } as HotFigure;
      });
      const driverBarrierP50 = await driverBarrier(g);
      const dev = (await g.info(0)).device;  // rank 0's kernel launches: through the kept graphs or not (launch.hpp)
      const launches = dev ? { graph: dev.graphLaunches, direct: dev.directLaunches, fusedDispatches: dev.fusedDispatches } : undefined;
      groups[`${ranks} rank${ranks > 1 ? 's sharing GPU 0' : ''}`] = { ranks, figures, driverBarrierP50, ...(launches ? { launches } : {}) };
    } finally {
      await g.destroy();
    }
  }
  let torch: unknown = null;
  try {
    torch = JSON.parse(execFileSync(flags.python!, [path.join(PACKAGE_ROOT, 'bench', 'index_select.py'), String(ep.hidden), flags.tokens!], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }));
  } catch (e) {
    torch = { unavailable: String((e as Error).message).split('\n')[0] };
  }
  return { gpus: probe.gpus?.map((g) => `${g.name} ${g.arch} ${g.sms} SMs`), driver: probe.driverVersion, groups, torch, copy, floors: floorRows(groups, copy) };
}

/** Each 4096-token op's floor: its group's bytes over the copy's bandwidth (read + write), and its time's ratio to it. */
function floorRows(groups: Record<string, { ranks: number; figures: HotFigure[] }>, copy?: { GBps: number }) {
  if (!copy) return [];
  return Object.values(groups).flatMap((g) => g.figures.filter((f) => f.bytes).map((f) => {
    const us = f.b2b_device_us ?? f.loop_us!;
    const floorUs = (f.bytes!.read + f.bytes!.write) / (copy.GBps * 1e3), minUs = (f.bytes!.minRead + f.bytes!.minWrite) / (copy.GBps * 1e3);
    return { ranks: g.ranks, op: f.op, tokens: f.tokens!, us, timed: f.b2b_device_us !== undefined ? 'b2b' : 'loop', ...f.bytes!, floorUs, minUs, ofFloor: us / floorUs, ofMin: us / minUs };
  }));
}

function printCuda(r: Awaited<ReturnType<typeof cudaRun>>) {
  const f1 = (x: number | undefined) => (x === undefined ? '-' : x.toFixed(1));
  const torch = r.torch as { figures?: Array<{ op: string; tokens: number; device_us: number }>; trivial_op_host_us?: number } | null;
  for (const [name, g] of Object.entries(r.groups)) {
    console.log(`\n${name} (µs; call = awaited call + stream sync, p50/p99; submit = the awaited call alone, p50; loop = per call of ${iters} back to back; device = CUDA events around the launches, in a pass of their own with rank.timeOps(true), median; b2b = device per op between events around ${iters} ops back to back, as torch's figures below; cpu ref = µs of a fixed JavaScript loop on the rank's thread just before the op's figures, the host's speed then)`);
    console.log(`${'op'.padEnd(44)} ${'tokens'.padStart(6)} ${'call p50'.padStart(9)} ${'p99'.padStart(8)} ${'submit'.padStart(7)} ${'loop'.padStart(8)} ${'device'.padStart(8)} ${'b2b'.padStart(7)} ${'host'.padStart(7)} ${'cpu ref'.padStart(8)}`);
    for (const f of g.figures)
      console.log(`${f.op.padEnd(44)} ${String(f.tokens ?? '').padStart(6)} ${f1(f.call_p50_us).padStart(9)} ${f1(f.call_p99_us).padStart(8)} ${f1(f.submit_p50_us).padStart(7)} ${f1(f.loop_us).padStart(8)} ${f1(f.device_us).padStart(8)} ${f1(f.b2b_device_us).padStart(7)} ${f1(f.host_us).padStart(7)} ${f1(f.cpu_ref_us).padStart(8)}`);
    console.log(`${'driver-mode barrier (group.barrier)'.padEnd(44)} ${''.padStart(6)} ${f1(g.driverBarrierP50).padStart(9)}`);
    if (g.launches) console.log(`rank 0's kernel launches: ${g.launches.graph} through kept graphs, ${g.launches.direct} direct; ${g.launches.fusedDispatches} dispatches without a CPU sync as one kernel (RANKFLOW_FUSED_DISPATCH)`);
  }
  if (torch?.figures) {
    console.log('\ntorch on the same GPU (device µs)');
    for (const f of torch.figures) console.log(`${f.op.padEnd(44)} ${String(f.tokens).padStart(6)} ${f.device_us.toFixed(1).padStart(9)}`);
    console.log(`trivial torch op, host µs per call: ${torch.trivial_op_host_us?.toFixed(1)}`);
  } else console.log(`\ntorch: ${JSON.stringify(r.torch)}`);
  // The targets of issue 16, as ratios of this run's figures.
  const one = r.groups['1 rank']?.figures ?? [], two = r.groups['2 ranks sharing GPU 0']?.figures ?? [];
  const get = (fs: HotFigure[], op: string, T?: number) => fs.find((f) => f.op === op && (T === undefined || f.tokens === T));
  const sel = torch?.figures?.find((f) => f.op === 'index_select of every row' && f.tokens === 4096);
  const selCall = torch?.figures?.find((f) => f.op === 'index_select of every row, per call' && f.tokens === 4096);
  const lines: Array<[string, string]> = [];
  const check = (what: string, ok: boolean, got: string) => lines.push([what, `${ok ? 'met' : 'NOT met'}: ${got}`]);
  const b1 = get(one, 'barrier'), bs1 = get(one, 'barrier (CPU sync)'), b2 = get(two, 'barrier');
  if (b1) check('1 rank: barrier p50 <= 10 µs', b1.call_p50_us! <= 10, f1(b1.call_p50_us));
  if (bs1) check('1 rank: barrier with CPU sync p50 <= 15 µs', bs1.call_p50_us! <= 15, f1(bs1.call_p50_us));
  for (const [fs, slack, label] of [[one, 5, '1 rank'], [two, 8, '2 ranks']] as const)
    for (const op of ['dispatch (cached, outputs in buffer)', 'combine']) {
      const f = get(fs, op, 128);
      if (f) check(`${label}: ${op} 128: call p50 <= device + ${slack} µs`, f.call_p50_us! <= f.device_us! + slack, `${f1(f.call_p50_us)} vs ${f1(f.device_us)} + ${slack}`);
    }
  const dc = get(one, 'dispatch (cached, outputs in buffer)', 128), cb = get(one, 'combine', 128);
  if (dc) check('1 rank: dispatch cached 128 device <= 15 µs', dc.device_us! <= 15, f1(dc.device_us));
  if (cb) check('1 rank: combine 128 device <= 12 µs', cb.device_us! <= 12, f1(cb.device_us));
  const d4 = get(one, 'dispatch (no CPU sync, outputs in buffer)', 4096);
  // The same rows timed alike on both sides: ops back to back between two events (timeIt; torch's
  // loop), which leaves out the launch latency both pay per op. For reference, one op between events
  // (timeOps) against torch's per call (which carries Python's launch path) and against torch's loop
  // (the pairing earlier runs were judged by).
  const ratio = (x: number, y: number) => `${f1(x)} vs ${f1(y)} (${(x / y).toFixed(2)}x)`;
  if (d4?.b2b_device_us && sel) check('1 rank: dispatch 4096 in buffer, back to back, <= 1.3x index_select\'s', d4.b2b_device_us <= 1.3 * sel.device_us, ratio(d4.b2b_device_us, sel.device_us));
  if (d4 && selCall) lines.push(['  (reference) one op vs index_select per call', ratio(d4.device_us!, selCall.device_us)]);
  if (d4 && sel) lines.push(['  (reference) one op vs index_select back to back', ratio(d4.device_us!, sel.device_us)]);
  const gr = get(one, 'graph replay (cached dispatch + combine)', 128);
  if (gr && dc && cb) {
    check('1 rank: graph replay <= 1.1x the two device times', gr.device_us! <= 1.1 * (dc.device_us! + cb.device_us!), `${f1(gr.device_us)} vs ${f1(dc.device_us! + cb.device_us!)}`);
    check('1 rank: graph replay host time <= 5 µs', gr.host_us! <= 5, f1(gr.host_us));
  }
  const g1 = r.groups['1 rank'];
  if (g1) check('1 rank: driver-mode barrier p50 <= 100 µs', g1.driverBarrierP50 <= 100, f1(g1.driverBarrierP50));
  if (b2) check('2 ranks: barrier p50 <= 15 µs', b2.call_p50_us! <= 15, f1(b2.call_p50_us));
  if (r.copy) {
    const MB = (b: number) => (b / 1e6).toFixed(1);
    console.log(`\nmemory floors (issue 36): device-to-device copy of ${MB(r.copy.bytes)} MB in ${f1(r.copy.us)} µs = ${r.copy.GBps.toFixed(0)} GB/s read + write, this run; the bytes of every rank of the group (they share GPU 0); design = as the kernels move them, min = what the op must move at least; time = b2b (loop where no b2b)`);
    console.log(`${'ranks'.padStart(5)} ${'op'.padEnd(42)} ${'read MB'.padStart(8)} ${'write MB'.padStart(9)} ${'floor'.padStart(7)} ${'min rd'.padStart(7)} ${'min wr'.padStart(7)} ${'min fl'.padStart(7)} ${'time'.padStart(7)} ${'/floor'.padStart(7)} ${'/min'.padStart(6)}`);
    for (const f of r.floors)
      console.log(`${String(f.ranks).padStart(5)} ${f.op.padEnd(42)} ${MB(f.read).padStart(8)} ${MB(f.write).padStart(9)} ${f1(f.floorUs).padStart(7)} ${MB(f.minRead).padStart(7)} ${MB(f.minWrite).padStart(7)} ${f1(f.minUs).padStart(7)} ${f1(f.us).padStart(7)} ${(f.ofFloor.toFixed(2) + 'x').padStart(7)} ${(f.ofMin.toFixed(2) + 'x').padStart(6)}`);
  }
  const targets36: Array<[string, string]> = [];
  const check36 = (what: string, ok: boolean, got: string) => targets36.push([what, `${ok ? 'met' : 'NOT met'}: ${got}`]);
  const fl = (W: number, op: string) => r.floors.find((f) => f.ranks === W && f.op === op);
  for (const op of ['dispatch (cached, outputs in buffer)', 'dispatch fp8 (cached, outputs in buffer)']) {
    const f = fl(1, op);
    if (f && sel) check36(`1 rank: ${op} 4096 b2b <= 1.1x index_select`, f.us <= 1.1 * sel.device_us, ratio(f.us, sel.device_us));
  }
  const c1 = fl(1, 'combine');
  if (c1) check36('1 rank: combine 4096 <= 1.2x the copy of its bytes', c1.ofMin <= 1.2, `${f1(c1.us)} vs ${f1(c1.minUs)} (${c1.ofMin.toFixed(2)}x)`);
  for (const W of [2, 4])
    for (const op of ['dispatch (cached, outputs in buffer)', 'dispatch fp8 (cached, outputs in buffer)', 'combine']) {
      const f = fl(W, op);
      if (f) check36(`${W} ranks sharing GPU 0: ${op} 4096 <= 1.2x its floor (min)`, f.ofMin <= 1.2, `${f1(f.us)} vs ${f1(f.minUs)} (${f.ofMin.toFixed(2)}x)`);
    }
  console.log('\ntargets (issue 36)');
  for (const [w, v] of targets36) console.log(`  ${w.padEnd(72)} ${v}`);
  lines.push(...targets36);
  console.log('\ntargets (issue 16)');
  for (const [w, v] of lines) console.log(`  ${w.padEnd(72)} ${v}`);
  return lines;
}

/** µs per round trip of a bare Atomics.wait/notify ping-pong between two worker threads. */
async function pingPong(n: number): Promise<number> {
  const sab = new SharedArrayBuffer(8);
  const code = `
    const { workerData, parentPort } = require('node:worker_threads');
    const w = new Int32Array(workerData.sab);
    const me = workerData.me, n = workerData.n;
    let t0 = 0;
    for (let i = 0; i < n; i++) {
      if (i === 100) t0 = performance.now();
      if (me === 0) {
        Atomics.store(w, 0, 2 * i + 1); Atomics.notify(w, 0);
        while (Atomics.load(w, 1) !== 2 * i + 1) Atomics.wait(w, 1, Atomics.load(w, 1));
      } else {
        while (Atomics.load(w, 0) !== 2 * i + 1) Atomics.wait(w, 0, Atomics.load(w, 0));
        Atomics.store(w, 1, 2 * i + 1); Atomics.notify(w, 1);
      }
    }
    parentPort.postMessage((performance.now() - t0) * 1e3 / (n - 100));`;
  const run = (me: number) => new Promise<number>((resolve, reject) => {
    const wk = new Worker(code, { eval: true, workerData: { sab, me, n } });
    wk.once('message', resolve);
    wk.once('error', reject);
  });
  const [a] = await Promise.all([run(0), run(1)]);
  return a!;
}

async function hostRun() {
  const res: Record<string, OverheadFigure[]> = {};
  for (const ranks of [1, 2]) {
    const g = await createGroup({ backend: 'host', ranks, buffer: { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 2 * ranks } });
    try {
      const per = await g.run<OverheadFigure[]>(new URL('./programs/op-overhead.js', import.meta.url), { iters, warmup });
      res[`${ranks} rank${ranks > 1 ? 's' : ''}`] = per[0]!.map((f, i) => ({ op: f.op, p50: Math.max(...per.map((p) => p[i]!.p50)), p99: Math.max(...per.map((p) => p[i]!.p99)), mean: Math.max(...per.map((p) => p[i]!.mean)) }));
    } finally {
      await g.destroy();
    }
  }
  const pp = await pingPong(Math.max(iters, 2000));
  console.log('host backend, rank program (wall µs per awaited call)');
  for (const [name, figs] of Object.entries(res))
    for (const f of figs) console.log(`  ${name.padEnd(8)} ${f.op.padEnd(22)} p50 ${f.p50.toFixed(1).padStart(8)}  p99 ${f.p99.toFixed(1).padStart(8)}`);
  const b2 = res['2 ranks']!.find((f) => f.op === 'barrier')!.p50;
  console.log(`bare Atomics.wait/notify ping-pong between two workers: ${pp.toFixed(1)} µs per round trip`);
  console.log(`target: 2-rank barrier p50 within 3x of the ping-pong: ${b2 <= 3 * pp ? 'met' : 'NOT met'} (${(b2 / pp).toFixed(2)}x)`);
  return { groups: res, pingPongUs: pp, ratio: b2 / pp };
}

const backend = flags.backend === 'host' ? 'host' : 'cuda';
const result = await (backend === 'cuda' ? cudaRun() : hostRun()).catch((e: Error) => {
  console.error(`hot-path: ${e.message}`);  // e.g. no GPU here: said once, no stack
  process.exit(1);
});
const targets = backend === 'cuda' ? printCuda(result as Awaited<ReturnType<typeof cudaRun>>) : undefined;
const date = new Date().toISOString();
const file = path.join(flags.out!, `hot-path-${backend}-${date.slice(0, 10)}.json`);
mkdirSync(flags.out!, { recursive: true });
writeFileSync(file, JSON.stringify({
  date, commit: commit(), machine: machine(),
  command: command(), iters, warmup, result, targets,
}, null, 1) + '\n');
console.log(`wrote ${file}`);
