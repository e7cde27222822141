// Rank program of bench/hot-path.ts: what one operation costs through a rank program, beside what its
// kernels take on the device, in one run. Per op: `call` = wall µs of one awaited call followed by a
// stream sync (p50; what a step that needs the result pays), `loop` = wall µs per call of `iters` calls
// back to back then one sync (throughput), `device` = median µs between the CUDA events the addon
// records around the op's launches (rank.timeOps(true), in a pass of its own: call and loop run without them),
// and for the dispatches with outputs in the buffer `b2b` = device µs per op between two events around
// `iters` ops back to back (rank.timeIt: torch's way in bench/index_select.py, launch latency hidden)
// and a combine (device µs per replay from events around `iters` replays, host µs per replay() call),
// and the 4096-token dispatch with outputs in the buffer. `cpu_ref` = µs of a fixed piece of JavaScript on
// the rank's thread just before the op's figures (median of 7): the host's speed at that time, which moves
// by up to ~2x from run to run on the one-H200 machine (bench/results/hot-path-ab-2026-12-02.md).
import type { RankProgramHandle } from '../../actors/index.js';

export interface HotPathArgs { hidden: number; topk: number; experts: number; tokens: number[]; iters: number; warmup: number }
export interface HotFigure { op: string; tokens?: number; call_p50_us?: number; call_p99_us?: number; submit_p50_us?: number; loop_us?: number; device_us?: number; b2b_device_us?: number; host_us?: number; cpu_ref_us?: number }

const p = (xs: number[], q: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * q))]!;

const refData = new Float64Array(1024);
let refSink = 0;
/** µs of a fixed arithmetic loop on this thread (median of 7): what the CPU gives this thread now. */
function cpuRef(): number {
  const us: number[] = [];
  for (let r = 0; r < 7; r++) {
    const t0 = performance.now();
    let acc = 0;
    for (let pass = 0; pass < 20; pass++)
      for (let i = 0; i < refData.length; i++) acc += (refData[i] = refData[i]! * 0.5 + i) * 1e-9;
    refSink += acc;
    us.push((performance.now() - t0) * 1e3);
  }
  return p(us, 0.5);
}

function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296);
}

export default async function hotPath(rank: RankProgramHandle<'cuda'>, a: HotPathArgs): Promise<HotFigure[]> {
  const out: HotFigure[] = [];
  const now = () => performance.now() * 1e3;
  for (let i = 0; i < 5; i++) cpuRef();  // optimised before its first figure (interpreted, it is ~40x slower)

  /** µs of awaited calls, each followed by `after` (`us`), and of the awaited call alone (`submit`), after warm-up. */
  async function timed(fn: () => Promise<unknown>, after: () => Promise<unknown> = async () => {}): Promise<{ us: number[]; submit: number[] }> {
    for (let i = 0; i < a.warmup; i++) await fn(), await after();
    await rank.barrier();
    const us: number[] = [], submit: number[] = [];
    for (let i = 0; i < a.iters; i++) {
      const t0 = now();
      await fn();
      const t1 = now();
      await after();
      us.push(now() - t0);
      submit.push(t1 - t0);
    }
    return { us, submit };
  }
  async function loop(fn: () => Promise<unknown>): Promise<number> {
    await rank.sync();
    await rank.barrier();
    const t0 = now();
    for (let i = 0; i < a.iters; i++) await fn();
    await rank.sync();
    return (now() - t0) / a.iters;
  }
  async function device(fn: () => Promise<unknown>): Promise<number> {
    // Events only here: recording them costs the CPU a few µs per op, which the call figures leave out.
    const dev: number[] = [];
    rank.timeOps(true);
    for (let i = 0; i < Math.min(a.iters, 200); i++) {
      await fn();
      dev.push(rank.lastOpDeviceMs() * 1e3);
    }
    rank.timeOps(false);
    return p(dev, 0.5);
  }
  async function b2b(fn: () => Promise<unknown>): Promise<number> {
    await rank.sync();
    await rank.barrier();
    const ms = await rank.timeIt(fn, a.iters);
    await rank.sync();
    return ms * 1e3;
  }
  async function op(name: string, tokens: number, fn: () => Promise<unknown>, backToBack = false) {
    const cpu_ref_us = cpuRef();
    const { us: calls, submit } = await timed(fn, () => rank.sync());
    out.push({
      op: name, tokens, cpu_ref_us, call_p50_us: p(calls, 0.5), call_p99_us: p(calls, 0.99), submit_p50_us: p(submit, 0.5), loop_us: await loop(fn),
      device_us: await device(fn), ...(backToBack ? { b2b_device_us: await b2b(fn) } : {}),
    });
  }

  for (const [name, fn] of [['barrier', () => rank.barrier()], ['barrier (CPU sync)', () => rank.barrier({ withCpuSync: true })]] as const) {
    const cpu_ref_us = cpuRef();
    const { us } = await timed(fn);
    out.push({ op: name, cpu_ref_us, call_p50_us: p(us, 0.5), call_p99_us: p(us, 0.99) });
  }

  for (const T of a.tokens) {
    const rng = lcg(17 + rank.rank * 7919 + T);
    const xs = new Uint16Array(T * a.hidden);
    for (let i = 0; i < xs.length; i++) xs[i] = 0x3f80 + (i % 64);
    const idx = new Int32Array(T * a.topk);
    for (let t = 0; t < T; t++) {
      const picked = new Set<number>();
      while (picked.size < a.topk) picked.add(Math.floor(rng() * a.experts));
      [...picked].forEach((e, k) => (idx[t * a.topk + k] = e));
    }
    const x = rank.tensor('bf16', [T, a.hidden], xs);
    const topkIdx = rank.tensor('int32', [T, a.topk], idx);
    const topkWeights = rank.tensor('fp32', [T, a.topk], new Float32Array(T * a.topk).fill(1 / a.topk));
    let d0 = await rank.dispatch({ x, topkIdx, topkWeights });
    const R = d0.numRecv!;
    // A fresh handle (same routing) before each op: a rank keeps the last 256 dispatches' handles.
    const fresh = async () => {
      d0.free();
      d0 = await rank.dispatch({ x, topkIdx, topkWeights });
    };
    const cx = rank.tensor('bf16', [R, a.hidden]);
    await op('dispatch (no CPU sync, outputs in buffer)', T, () => rank.dispatch({ x, topkIdx, topkWeights }, { outputsInBuffer: true }), true);
    await fresh();
    await op('dispatch (cached, outputs in buffer)', T, () => rank.dispatch({ x, handle: d0.handle }, { outputsInBuffer: true }), true);
    await op('dispatch (CPU sync, outputs allocated)', T, async () => (await rank.dispatch({ x, topkIdx, topkWeights })).free());
    await fresh();
    await op('combine', T, async () => {
      const c = await rank.combine({ x: cx, handle: d0.handle });
      c.x.free();
      c.topkWeights.free();
    });
    await fresh();
    if (T <= 512) {
      // A decode step's pair as one graph: cached dispatch (outputs in the buffer) and a combine.
      const g = await rank.capture(async () => {
        const k = await rank.dispatch({ x, handle: d0.handle }, { outputsInBuffer: true });
        await rank.combine({ x: cx, handle: k.handle });
      });
      const cpu_ref_us = cpuRef();
      for (let i = 0; i < a.warmup; i++) await g.replay();
      await rank.sync();
      await rank.barrier();
      const ms = await rank.timeIt(() => g.replay(), a.iters);
      await rank.sync();
      await rank.barrier();
      let host = 0;
      for (let i = 0; i < a.iters; i++) {
        const t0 = now();
        await g.replay();
        host += now() - t0;
        if (i % 16 === 15) await rank.sync();  // keep the queue short
      }
      await rank.sync();
      out.push({ op: 'graph replay (cached dispatch + combine)', tokens: T, cpu_ref_us, device_us: ms * 1e3, host_us: host / a.iters });
      g.free();
    }
    d0.free();
    for (const t of [x, topkIdx, topkWeights, cx]) t.free();
    await rank.barrier();
  }
  return out;
}
