// Rank program of test/gpu/elastic.test.mjs ('a kill during device combines', elastic-graph-cases.mjs):
// large device-tensor dispatches and combines in a loop, so that a rank killed meanwhile likely dies
// while its peers' combines read its tensors (pull mode, kernels/combine.cu: ranks of one process on
// one GPU read each other's x where it lies). Runs args.iters rounds (every rank the same collectives)
// or until an op fails; says how many combines went through and how the loop ended.
import { lcg } from '../moe-inputs.mjs';

const now = () => performance.timeOrigin + performance.now();
const free = (...ts) => ts.forEach((t) => t?.free?.());

function input(rank, { T, hidden, topk, experts, seed }) {
  const rng = lcg(seed * 7919 + rank.rank * 104729 + 3);
  const x = new Uint16Array(T * hidden);
  for (let i = 0; i < x.length; i++) x[i] = (Math.floor(rng() * 0x3e00) + 0x0100) | (rng() < 0.5 ? 0x8000 : 0);
  const topkIdx = new Int32Array(T * topk), topkWeights = new Float32Array(T * topk);
  for (let t = 0; t < T; t++) {
    const picked = new Set();
    while (picked.size < topk) picked.add(Math.floor(rng() * experts));
    [...picked].forEach((e, k) => ((topkIdx[t * topk + k] = e), (topkWeights[t * topk + k] = rng())));
  }
  return {
    x: rank.tensor('bf16', [T, hidden], x),
    topkIdx: rank.tensor('int32', [T, topk], topkIdx),
    topkWeights: rank.tensor('fp32', [T, topk], topkWeights),
  };
}

export default async function elasticPull(rank, args) {
  const inp = input(rank, args);
  let combines = 0;
  try {
    while (combines < args.iters) {
      const d = await rank.dispatch(inp);
      const c = await rank.combine({ x: d.x, handle: d.handle, topkWeights: d.topkWeights });
      await rank.sync();
      free(d.x, d.topkIdx, d.topkWeights, d.srcRank, d.srcToken, c.x, c.topkWeights);
      combines++;
    }
    return { rank: rank.rank, combines, code: null, at: now() };
  } catch (e) {
    return { rank: rank.rank, combines, code: e.code ?? String(e), message: e.message, at: now() };
  } finally {
    free(inp.x, inp.topkIdx, inp.topkWeights);
  }
}
