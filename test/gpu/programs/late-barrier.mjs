// Rank program for the failure tests: rank 0 enters the collective at once; rank 1 sleeps `sleepMs`
// first (the test terminates it meanwhile), so rank 0's kernel waits on the GPU for it.
// op: 'barrier' | 'barrierCpuSync' | 'allGather'.
export default async function (rank, { sleepMs, op = 'barrier' }) {
  if (rank.rank === 1) await new Promise((r) => setTimeout(r, sleepMs));
  if (op === 'allGather') await rank.allGather({ dtype: 'int32', shape: [1024], data: new Int32Array(1024).fill(rank.rank) });
  else await rank.barrier({ withCpuSync: op === 'barrierCpuSync' });
  return rank.rank;
}
