// Rank program of test/gpu/moe.test.mjs: every rank dispatches device tensors of `tokens` rows, more
// than buffer.maxTokensPerRank. The program handle checks shapes only; the runtime refuses the count
// (native ops/dispatch.cc) before the rank enters the op, with and without a CPU sync. Per rank: the
// two refusals' codes and messages.
import { moeInput, deviceMoeInput } from '../moe-inputs.mjs';

export default async function (rank, { tokens }) {
  const { x, topkIdx, topkWeights } = deviceMoeInput(rank, moeInput(23, rank.rank, tokens), tokens);
  const out = [];
  for (const opts of [{}, { outputsInBuffer: true }]) {
    try {
      await rank.dispatch({ x, topkIdx, topkWeights }, opts);
      out.push({ code: 'none' });
    } catch (e) {
      out.push({ code: e.code, message: e.message });
    }
  }
  for (const t of [x, topkIdx, topkWeights]) t.free();
  return { refusals: out };
}
