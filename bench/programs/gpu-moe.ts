// Rank program of the GPU benchmark (bench/gpu.ts): device-resident tensors, CUDA-event timing after
// warm-up, every rank measuring the same collectives at the same time (a barrier and a stream sync
// before each). Per case: dispatch with CPU sync (outputs copied out), without CPU sync (outputs in the
// buffer), cached (outputs in the buffer) and combine; ncclAlltoAll of the same bytes; a copy-engine
// copy of the remote bytes into the peer's buffer; optionally an SM sweep.
import type { RankProgramHandle } from '../../actors/index.js';

export interface GpuCase { name: string; tokens: number; fp8: boolean; sweep: boolean }
export interface GpuMoeArgs { hidden: number; topk: number; experts: number; iters: number; warmup: number; seed: number; cases: GpuCase[]; sms: number[] }
export interface GpuFigure { case: string; op: string; sms: number; ms: number; deviceMs?: number; bytes: number; remoteBytes: number }
export interface GpuMoeResult { rank: number; smCount: number; figures: GpuFigure[] }

function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296);
}

export default async function gpuMoe(rank: RankProgramHandle<'cuda'>, a: GpuMoeArgs): Promise<GpuMoeResult> {
  const figures: GpuFigure[] = [];
  const W = rank.worldSize;
  for (const c of a.cases) {
    const rng = lcg(a.seed + rank.rank * 7919 + c.tokens);
    const T = c.tokens;
    const elem = c.fp8 ? 1 : 2;
    const xs = c.fp8 ? new Uint8Array(T * a.hidden) : new Uint16Array(T * a.hidden);
    for (let i = 0; i < xs.length; i++) xs[i] = c.fp8 ? (i * 37) & 0x7e : 0x3f80 + (i % 64);
    const idx = new Int32Array(T * a.topk);
    for (let t = 0; t < T; t++) {
      const picked = new Set<number>();
      while (picked.size < a.topk) picked.add(Math.floor(rng() * a.experts));
      [...picked].forEach((e, k) => (idx[t * a.topk + k] = e));
    }
    const x = rank.tensor(c.fp8 ? 'fp8e4m3' : 'bf16', [T, a.hidden], xs as never);
    const scales = c.fp8 ? rank.tensor('fp32', [T, a.hidden / 128], new Float32Array(T * (a.hidden / 128)).fill(1)) : undefined;
    const topkIdx = rank.tensor('int32', [T, a.topk], idx);
    const topkWeights = rank.tensor('fp32', [T, a.topk], new Float32Array(T * a.topk).fill(1 / a.topk));
    const input = { x, topkIdx, topkWeights, ...(scales ? { scales } : {}) };

    let d0 = await rank.dispatch(input);
    const R = d0.numRecv!;
    const srcRank = d0.srcRank.toHost().data as Int32Array;
    const local = srcRank.filter((p) => p === rank.rank).length;
    const bytes = R * a.hidden * elem;
    const remoteBytes = (R - local) * a.hidden * elem;
    const cx = rank.tensor('bf16', [R, a.hidden]);
    // Every rank moves the same NCCL bytes: the largest receive of the group.
    const all = await rank.allGather(rank.hostTensor('int32', [1], Int32Array.of(R)));
    const maxBytes = Math.max(...(all.data as Int32Array)) * a.hidden * elem;
    const remoteAll = await rank.allGather(rank.hostTensor('int32', [1], Int32Array.of(R - local)));
    const ceBytes = Math.max(...(remoteAll.data as Int32Array)) * a.hidden * elem;

    const measure = async (op: string, sms: number, fn: () => Promise<unknown>, figBytes = bytes, figRemote = remoteBytes) => {
      // A fresh handle (same routing): the rank keeps only the last 256 layouts.
      d0.free();
      d0 = await rank.dispatch(input);
      for (let i = 0; i < a.warmup; i++) await fn();
      await rank.sync();
      await rank.barrier();
      const ms = await rank.timeIt(fn, a.iters);
      // Device time per op (events recorded natively around its launches), median of a second pass.
      const dev: number[] = [];
      rank.timeOps(true);
      for (let i = 0; i < a.iters; i++) {
        await fn();
        dev.push(rank.lastOpDeviceMs());
      }
      rank.timeOps(false);
      dev.sort((p, q) => p - q);
      figures.push({ case: c.name, op, sms, ms, deviceMs: dev[dev.length >> 1]!, bytes: figBytes, remoteBytes: figRemote });
    };
    const ops = (sms: number) => ({
      cpuSync: async () => (await rank.dispatch(input, { numSms: sms })).free(),
      inBuffer: () => rank.dispatch(input, { outputsInBuffer: true, numSms: sms }),
      cached: () => rank.dispatch({ x, ...(scales ? { scales } : {}), handle: d0.handle }, { outputsInBuffer: true, numSms: sms }),
      combine: async () => {
        const r = await rank.combine({ x: cx, handle: d0.handle }, { numSms: sms });
        r.x.free();
        r.topkWeights.free();
      },
    });
    const o = ops(0);
    await measure('dispatch (CPU sync, outputs copied out)', 0, o.cpuSync);
    await measure('dispatch (no CPU sync, outputs in buffer)', 0, o.inBuffer);
    await measure('dispatch (cached, outputs in buffer)', 0, o.cached);
    if (!c.fp8) await measure('combine', 0, o.combine);
    await rank.sync();
    await rank.barrier();
    figures.push({ case: c.name, op: 'NCCL ncclAlltoAll (same bytes)', sms: 0, ms: await rank.benchAlltoAll(maxBytes, a.iters, a.warmup), bytes: maxBytes, remoteBytes: maxBytes * (W - 1) / W });
    await rank.barrier();
    figures.push({ case: c.name, op: 'copy engine (remote bytes into the peer, both ways)', sms: 0, ms: await rank.benchPeerCopy(ceBytes, a.iters, a.warmup), bytes: ceBytes, remoteBytes: ceBytes });
    await rank.barrier();
    if (c.sweep) {
      for (const sms of a.sms) {
        const s = ops(sms);
        await measure('dispatch (cached, outputs in buffer)', sms, s.cached);
        await measure('dispatch (no CPU sync, outputs in buffer)', sms, s.inBuffer);
        if (!c.fp8) await measure('combine', sms, s.combine);
      }
    }
    await rank.sync();
    d0.free();
    for (const t of [x, topkIdx, topkWeights, cx, ...(scales ? [scales] : [])]) t.free();
    await rank.barrier();
  }
  return { rank: rank.rank, smCount: 0, figures };
}
