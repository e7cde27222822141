// Rank program for the failure tests: rank 0 enters the collective at once; rank 1 sleeps `sleepMs`
// first (the test terminates it meanwhile), so rank 0's kernel (or its CPU sync) waits for it. With
// `end` ('throw' | 'return'), rank 1's program then throws a TypeError or returns instead of joining.
// op: 'barrier' | 'barrierCpuSync' | 'allGather' | 'dispatch' | 'combine' (both ranks dispatch first,
// then rank 1 sleeps before the combine).
import { MOE_BUFFER, combineInput, moeInput } from '../moe-inputs.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export default async function (rank, { sleepMs, op = 'barrier', end }) {
  const late = async () => {
    await sleep(sleepMs);
    if (end === 'throw') throw new TypeError(`boom at ${performance.timeOrigin + performance.now()}`);
    return end === 'return';
  };
  const { hidden, topk } = MOE_BUFFER;
  const moe = () => {
    const i = moeInput(1, rank.rank, 16);
    return { x: rank.hostTensor('bf16', [16, hidden], i.x), topkIdx: i.topkIdx, topkWeights: i.topkWeights };
  };
  if (op === 'combine') {
    const d = await rank.dispatch(moe());
    const R = d.x.shape[0];
    if (rank.rank === 1 && (await late())) return 'returned';
    await rank.combine({ x: rank.hostTensor('bf16', [R, hidden], combineInput(1, rank.rank, R).x), handle: d.handle, topkWeights: new Float32Array(R * topk) });
    return rank.rank;
  }
  if (rank.rank === 1 && (await late())) return 'returned';
  if (op === 'allGather') await rank.allGather({ dtype: 'int32', shape: [1024], data: new Int32Array(1024).fill(rank.rank) });
  else if (op === 'dispatch') await rank.dispatch(moe());
  else await rank.barrier({ withCpuSync: op === 'barrierCpuSync' });
  return rank.rank;
}
