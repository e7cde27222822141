// Rank program: the per-op cost of a rank program's collectives when the collective itself is nearly
// free (a barrier: on cuda a ~5 µs kernel; on host a few slot writes): wall µs per awaited call,
// p50/p99 over `iters` after `warmup`, for the barrier alone and with its CPU-sync round.
export interface OverheadArgs { iters: number; warmup: number }
export interface OverheadFigure { op: string; p50: number; p99: number; mean: number }

interface Rank { barrier(o?: { withCpuSync?: boolean }): Promise<void> }

export default async function opOverhead(rank: Rank, a: OverheadArgs): Promise<OverheadFigure[]> {
  const figures: OverheadFigure[] = [];
  const cases: Array<[string, () => Promise<unknown>]> = [
    ['barrier', () => rank.barrier()],
    ['barrier (CPU sync)', () => rank.barrier({ withCpuSync: true })],
  ];
  for (const [op, fn] of cases) {
    for (let i = 0; i < a.warmup; i++) await fn();
    const us: number[] = [];
    for (let i = 0; i < a.iters; i++) {
      const t0 = performance.now();
      await fn();
      us.push((performance.now() - t0) * 1e3);
    }
    const mean = us.reduce((s, x) => s + x, 0) / us.length;
    us.sort((p, q) => p - q);
    figures.push({ op, p50: us[Math.floor(us.length * 0.5)]!, p99: us[Math.min(us.length - 1, Math.floor(us.length * 0.99))]!, mean });
  }
  return figures;
}
