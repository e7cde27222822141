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
// Issue 36: each 4096-token op (tokens >= a.floorTokens) also carries the bytes it reads and writes on
// this rank (`bytes`: the kernels' design; `min`: what the op must move at least where every rank
// shares the GPU), an fp8 cached dispatch (scales beside) runs beside the bf16 one, and with `copyBytes`
// the program first times a device-to-device copy of that many bytes (rank.benchPeerCopy, a group of
// one rank: into its own window), the bandwidth the bench's floors divide by.
import type { RankProgramHandle } from '../../actors/index.js';

export interface HotPathArgs { hidden: number; topk: number; experts: number; tokens: number[]; iters: number; warmup: number; fp8?: boolean; copyBytes?: number; floorTokens?: number }
/** Bytes one op reads and writes on one rank: as the kernels do it, and at least (`min`). */
export interface OpBytes { read: number; write: number; minRead: number; minWrite: number }
export interface HotFigure { op: string; tokens?: number; call_p50_us?: number; call_p99_us?: number; submit_p50_us?: number; loop_us?: number; device_us?: number; b2b_device_us?: number; host_us?: number; cpu_ref_us?: number; bytes?: OpBytes; copy_bytes?: number; copy_us?: number }

/**
 * The bytes of a dispatch and of a combine on this rank, from its routing: rows of `row` bytes (x; fp8: the
 * scales with them), T tokens, `sent` (token, receiver) pairs, R rows received, `own` of them my own.
 * Dispatch: x read once, every pair's row stored, with its topk ids and weights (8 bytes each), source token
 * and rank; the routing read (mask 8, slots 4 W, topk 8 K per token); the state keeps R source tokens and
 * R K weights (read back from the buffer). Its minimum is the same (one read per token, one write per row).
 * Combine as the kernels do it: the R - own rows of other ranks sent back (read + write), then the reduce
 * reads every pair's row (`sent`) and writes T rows and T K weights. Its minimum, ranks sharing one GPU:
 * the reduce reading each pair's row where it lies (no copy), writing T rows.
 */
export function opBytes(kind: 'dispatch' | 'combine', r: { T: number; sent: number; R: number; own: number; row: number; W: number; K: number; scaleBytes?: number }): OpBytes {
  const { T, sent, R, own, row, W, K } = r;
  if (kind === 'dispatch') {
    const sb = r.scaleBytes ?? 0;
    const read = T * (row + sb) + T * (8 + 4 * W + 8 * K) + R * (4 + 4 * K);
    const write = sent * (row + sb + 8 * K + 8) + R * (4 + 4 * K);
    return { read, write, minRead: read, minWrite: write };
  }
  const meta = T * (8 + 4 * W), wts = sent * 4 * K;
  const minRead = sent * row + meta + wts, minWrite = T * (row + 4 * K);
  return { read: minRead + (R - own) * (row + 4 * K), write: minWrite + (R - own) * (row + 4 * K), minRead, minWrite };
}

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
  if (a.copyBytes) {
    const ms = await rank.benchPeerCopy(a.copyBytes, a.iters, a.warmup);
    out.push({ op: 'device-to-device copy', copy_bytes: a.copyBytes, copy_us: ms * 1e3, b2b_device_us: ms * 1e3 });
  }

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
  async function op(name: string, tokens: number, fn: () => Promise<unknown>, backToBack = false, bytes?: OpBytes) {
    const cpu_ref_us = cpuRef();
    const { us: calls, submit } = await timed(fn, () => rank.sync());
    out.push({
      op: name, tokens, cpu_ref_us, call_p50_us: p(calls, 0.5), call_p99_us: p(calls, 0.99), submit_p50_us: p(submit, 0.5), loop_us: await loop(fn),
      device_us: await device(fn), ...(backToBack ? { b2b_device_us: await b2b(fn) } : {}), ...(bytes ? { bytes } : {}),
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
    // The routing's pairs: token t goes to the ranks owning its experts (experts / W per rank).
    const W = rank.worldSize, epr = a.experts / W;
    let sent = 0, own = 0;
    for (let t = 0; t < T; t++) {
      let mask = 0n;
      for (let k = 0; k < a.topk; k++) mask |= 1n << BigInt(Math.floor(idx[t * a.topk + k]! / epr));
      for (let q = 0; q < W; q++) if ((mask >> BigInt(q)) & 1n) sent++;
      if ((mask >> BigInt(rank.rank)) & 1n) own++;
    }
    const floors = T >= (a.floorTokens ?? 4096);
    const shape = { T, sent, R, own, row: a.hidden * 2, W, K: a.topk };
    const dBytes = floors ? opBytes('dispatch', shape) : undefined, cBytes = floors ? opBytes('combine', shape) : undefined;
    // A fresh handle (same routing) before each op: a rank keeps the last 256 dispatches' handles.
    const fresh = async () => {
      d0.free();
      d0 = await rank.dispatch({ x, topkIdx, topkWeights });
    };
    const cx = rank.tensor('bf16', [R, a.hidden]);
    await op('dispatch (no CPU sync, outputs in buffer)', T, () => rank.dispatch({ x, topkIdx, topkWeights }, { outputsInBuffer: true }), true, dBytes);
    await fresh();
    await op('dispatch (cached, outputs in buffer)', T, () => rank.dispatch({ x, handle: d0.handle }, { outputsInBuffer: true }), true, dBytes);
    if (a.fp8) {
      // fp8e4m3 rows (a fixed finite pattern) with a scale per 128 values, on the same routing.
      const S = a.hidden / 128;
      const x8 = rank.tensor('fp8e4m3', [T, a.hidden], Uint8Array.from({ length: T * a.hidden }, (_, i) => 0x30 + (i % 64)));
      const scales = rank.tensor('fp32', [T, S], new Float32Array(T * S).fill(0.5));
      const b8 = floors ? opBytes('dispatch', { ...shape, row: a.hidden, scaleBytes: S * 4 }) : undefined;
      await op('dispatch fp8 (cached, outputs in buffer)', T, () => rank.dispatch({ x: x8, scales, handle: d0.handle }, { outputsInBuffer: true }), true, b8);
      x8.free();
      scales.free();
    }
    await op('dispatch (CPU sync, outputs allocated)', T, async () => (await rank.dispatch({ x, topkIdx, topkWeights })).free());
    await fresh();
    await op('combine', T, async () => {
      const c = await rank.combine({ x: cx, handle: d0.handle });
      c.x.free();
      c.topkWeights.free();
    }, floors, cBytes);
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
