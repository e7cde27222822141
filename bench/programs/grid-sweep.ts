// Rank program of bench/grid-sweep.ts: the device time of a cached dispatch (outputs in the buffer)
// and of a combine at a fixed token count, for each grid size (options.numSms), and of barriers, so
// that what a block costs (its arrival, its fence) shows apart from what the data costs.
import type { RankProgramHandle } from '../../actors/index.js';

export interface GridSweepArgs { hidden: number; topk: number; experts: number; tokens: number; grids: number[]; iters: number }
export interface GridFigure { op: string; grid: number; device_us: number }

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;

export default async function gridSweep(rank: RankProgramHandle<'cuda'>, a: GridSweepArgs): Promise<GridFigure[]> {
  const T = a.tokens;
  const xs = new Uint16Array(T * a.hidden);
  for (let i = 0; i < xs.length; i++) xs[i] = 0x3f80 + (i % 64);
  const idx = new Int32Array(T * a.topk);
  for (let t = 0; t < T; t++) for (let k = 0; k < a.topk; k++) idx[t * a.topk + k] = (t * 37 + k * 11 + rank.rank * 5) % a.experts;
  const x = rank.tensor('bf16', [T, a.hidden], xs);
  const topkIdx = rank.tensor('int32', [T, a.topk], idx);
  const topkWeights = rank.tensor('fp32', [T, a.topk], new Float32Array(T * a.topk).fill(1 / a.topk));
  const d0 = await rank.dispatch({ x, topkIdx, topkWeights });
  const cx = rank.tensor('bf16', [d0.numRecv!, a.hidden]);
  const out: GridFigure[] = [];
  const device = async (fn: () => Promise<unknown>) => {
    const us: number[] = [];
    rank.timeOps(true);
    for (let i = 0; i < 10; i++) await fn();
    for (let i = 0; i < a.iters; i++) {
      await fn();
      us.push(rank.lastOpDeviceMs() * 1e3);
    }
    rank.timeOps(false);
    return median(us);
  };
  for (const grid of a.grids) {
    await rank.barrier();
    out.push({ op: 'dispatch (cached, outputs in buffer)', grid, device_us: await device(() => rank.dispatch({ x, handle: d0.handle }, { outputsInBuffer: true, numSms: grid })) });
    await rank.barrier();
    out.push({
      op: 'combine', grid, device_us: await device(async () => {
        const c = await rank.combine({ x: cx, handle: d0.handle }, { numSms: grid });
        c.x.free();
        c.topkWeights.free();
      }),
    });
  }
  await rank.sync();
  await rank.barrier();
  out.push({ op: 'barrier (timeIt, per call)', grid: 1, device_us: (await rank.timeIt(() => rank.barrier(), a.iters)) * 1e3 });
  d0.free();
  for (const t of [x, topkIdx, topkWeights, cx]) t.free();
  return out;
}
