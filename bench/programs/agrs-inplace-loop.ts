// Rank program of bench/agrs-inplace.ts (host and cuda alike). Two figures:
//  - allGather in place vs copied, per size: sessions of K collectives each; "copy" gathers an
//    ordinary tensor (copied into the buffer, the result copied out), "in place" a session tensor
//    with { async: true } (no local copy; the result is a view). Host: wall time per op (the slower
//    ranks wait in it); cuda: CUDA events around the K ops on the rank's stream (rank.timeIt).
//  - engram fetch overlap: a fetch and a fixed amount of CPU work (the rank's own compute between
//    issue and wait), one after the other (wait, then work) vs started together (issue, work, wait).
import type { RankProgramHandle, RankSession } from '../../actors/index.js';

export interface InplaceLoopArgs {
  sizes: number[];
  opsPerSize: number;
  fetch: { rows: number; entriesPerRank: number; hidden: number; workMs: number; iters: number } | null;
}
export interface GatherFigures { bytes: number; copyUs: number[]; inplaceUs: number[] }
export interface FetchFigures { fetchMs: number[]; workMs: number[]; serialMs: number[]; overlapMs: number[]; rows: number; rowBytes: number }
export interface InplaceLoopResult { rank: number; backend: string; gather: GatherFigures[]; fetch: FetchFigures | null }

type Session = RankSession;

/**
 * ops of one size in sessions of at most `k` ops (each op takes a fresh region of W * bytes); `extra`
 * more collectives per session for the body's own use (a small allGather that lines the ranks up).
 * The first session is a warm-up and not counted (the runner learns each state and count of ops in
 * flight once, through the xstate actor; later ones replay it).
 */
async function sessions(rank: RankProgramHandle, bytes: number, ops: number, body: (s: Session, k: number) => Promise<number[]>, extra = 0): Promise<number[]> {
  const room = Math.floor((rank.info().bufferBytes - (4 << 20)) / (Math.ceil((rank.worldSize * bytes) / 256) * 256));
  const k = Math.max(1, Math.min(ops, room - extra));
  const out: number[] = [];
  for (let done = -k; done < ops; done += k) {
    if (done < 0) {
      const s = await rank.openSession({ maxBytes: bytes, maxAllGathers: k + extra });
      try {
        await body(s, k);
      } finally {
        await s.close();
      }
      continue;
    }
    const s = await rank.openSession({ maxBytes: bytes, maxAllGathers: k + extra });
    try {
      out.push(...(await body(s, Math.min(k, ops - done))));
    } finally {
      await s.close();
    }
  }
  return out;
}

async function gatherHost(rank: RankProgramHandle, bytes: number, ops: number): Promise<GatherFigures> {
  const n = bytes / 4;
  const x = rank.hostTensor('int32', [n], Int32Array.from({ length: n }, (_, i) => i ^ rank.rank));
  const copyUs = await sessions(rank, bytes, ops, async (s, k) => {
    const us: number[] = [];
    for (let i = 0; i < k; i++) {
      const t0 = performance.now();
      await s.allGather(x);
      us.push((performance.now() - t0) * 1000);
    }
    return us;
  });
  const inplaceUs = await sessions(rank, bytes, ops, async (s, k) => {
    const ts = Array.from({ length: k }, () => {
      const t = s.tensor('int32', [n]);
      t.data.set(x.data); // the producer's write into the buffer: where its output goes in place of x
      return t;
    });
    const us: number[] = [];
    for (const t of ts) {
      const t0 = performance.now();
      await s.allGather(t, { async: true }).wait();
      us.push((performance.now() - t0) * 1000);
    }
    return us;
  });
  return { bytes, copyUs, inplaceUs };
}

async function gatherCuda(rank: RankProgramHandle<'cuda'>, bytes: number, ops: number): Promise<GatherFigures> {
  const n = bytes / 4;
  const host = Int32Array.from({ length: n }, (_, i) => i ^ rank.rank);
  const x = rank.tensor('int32', [n], host);
  const copyUs = await sessions(rank, bytes, ops, async (s, k) => {
    const outs: Array<{ free(): void }> = [];
    const ms = await rank.timeIt(async () => void outs.push(await s.allGather(x)), k);
    for (const o of outs) o.free();
    return Array(k).fill(ms * 1000);
  });
  const line = rank.tensor('int32', [4], Int32Array.of(1, 2, 3, 4));
  const inplaceUs = await sessions(rank, bytes, ops, async (s, k) => {
    const ts = Array.from({ length: k }, () => {
      const t = s.tensor('int32', [n]);
      t.upload(host);
      return t;
    });
    // The uploads (staged through pinned memory by the CPU: ~ms each at 16 MiB) end at different times on the ranks: a
    // small gather lines them up first, or the earlier rank's timed ops would wait for the later one.
    (await s.allGather(line)).free();
    const hs: Array<{ wait(): Promise<unknown> }> = [];
    const ms = await rank.timeIt(async (i) => void hs.push(s.allGather(ts[i]!, { async: true })), k);
    for (const h of hs) await h.wait();
    return Array(k).fill(ms * 1000);
  }, 1);
  line.free();
  x.free();
  return { bytes, copyUs, inplaceUs };
}

/** CPU work of a fixed size: `units` passes over a 64 KiB array (the sum is kept, so none is optimised away). */
let sink = 0;
function work(buf: Float64Array, units: number): void {
  let acc = 0;
  for (let u = 0; u < units; u++) for (let i = 0; i < buf.length; i++) acc += buf[i]! * (u + 1);
  sink += acc;
}

/** Units of work() that take about `ms` on this thread (after warming the function up). */
function calibrate(buf: Float64Array, ms: number): number {
  for (let i = 0; i < 20; i++) work(buf, 8);
  let units = 8;
  for (;;) {
    const t0 = performance.now();
    work(buf, units);
    const took = performance.now() - t0;
    if (took >= ms / 2 || units >= 1 << 24) return Math.max(1, Math.round((units * ms) / Math.max(took, 1e-3)));
    units *= 2;
  }
}

async function fetchOverlap(rank: RankProgramHandle, f: NonNullable<InplaceLoopArgs['fetch']>): Promise<FetchFigures> {
  const table = rank.hostTensor('bf16', [f.entriesPerRank, f.hidden]);
  for (let i = 0; i < table.data.length; i++) table.data[i] = (i * 7 + rank.rank) & 0x3fff;
  await rank.engramWrite(table);
  const ids = Int32Array.from({ length: f.rows }, (_, i) => (i * 7919 + rank.rank * 104729) % (rank.worldSize * f.entriesPerRank));
  const buf = new Float64Array(8192).map((_, i) => i * 1e-3);
  const units = calibrate(buf, f.workMs);
  const fetched = async (p: { wait(): Promise<unknown> }): Promise<void> => {
    const t = (await p.wait()) as { device?: boolean; free?: () => void };
    if (t.device) t.free!();
  };
  const out: FetchFigures = { fetchMs: [], workMs: [], serialMs: [], overlapMs: [], rows: f.rows, rowBytes: f.hidden * 2 };
  for (let it = 0; it < f.iters + 1; it++) {
    const keep = it > 0; // the first round warms up
    let t0 = performance.now();
    await fetched(rank.engramFetch(ids, { async: true }));
    const fetchMs = performance.now() - t0;
    t0 = performance.now();
    work(buf, units);
    const workMs = performance.now() - t0;
    t0 = performance.now();
    await fetched(rank.engramFetch(ids, { async: true }));
    work(buf, units);
    const serialMs = performance.now() - t0;
    t0 = performance.now();
    const h = rank.engramFetch(ids, { async: true });
    work(buf, units);
    await fetched(h);
    const overlapMs = performance.now() - t0;
    if (keep) (out.fetchMs.push(fetchMs), out.workMs.push(workMs), out.serialMs.push(serialMs), out.overlapMs.push(overlapMs));
  }
  return out;
}

export default async function agrsInplaceLoop(rank: RankProgramHandle, a: InplaceLoopArgs): Promise<InplaceLoopResult> {
  const gather: GatherFigures[] = [];
  const one = (bytes: number, ops: number) => (rank.backend === 'cuda' ? gatherCuda(rank, bytes, ops) : gatherHost(rank, bytes, ops));
  await one(a.sizes[0]!, 2); // warm-up
  for (const bytes of a.sizes) gather.push(await one(bytes, a.opsPerSize));
  const fetch = a.fetch ? await fetchOverlap(rank, a.fetch) : null;
  return { rank: rank.rank, backend: rank.backend, gather, fetch, ...(sink === 1 ? { sink } : {}) };
}
