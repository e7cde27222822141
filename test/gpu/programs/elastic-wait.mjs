// Rank program of test/gpu/elastic.test.mjs: every rank but `late` enters a barrier at once, so that
// their barrier kernels wait on the GPU for `late`, which enters only after `lateMs` (the test kills
// another rank meanwhile, while its kernel waits on peers). Each rank returns how its barrier ended
// and when (epoch ms), instead of throwing.
const now = () => performance.timeOrigin + performance.now();

export default async function elasticWait(rank, { late, lateMs }) {
  if (rank.rank === late) await new Promise((r) => setTimeout(r, lateMs));
  const t0 = now();
  try {
    await rank.barrier();
    return { rank: rank.rank, code: null, t0, at: now() };
  } catch (e) {
    return { rank: rank.rank, code: e.code ?? String(e), message: e.message, t0, at: now() };
  }
}
