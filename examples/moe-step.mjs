// One MoE step across 4 ranks, checked against the same step done densely: node examples/moe-step.mjs [host|cuda|auto]
import { createGroup, fromBf16, tensor, toBf16 } from 'rankflow';

const backend = process.argv[2] === 'cuda' || process.argv[2] === 'auto' ? process.argv[2] : 'host';  // host runs anywhere
const buffer = { maxTokensPerRank: 64, hidden: 256, topk: 2, numExperts: 8 };
const { hidden, topk, numExperts } = buffer;
const group = await createGroup({ ranks: backend === 'host' ? 4 : undefined, backend, buffer, timeouts: { cpuSeconds: 60 } });
const W = group.size, E = numExperts / W;                   // rank r owns experts [r*E, (r+1)*E)
let transitions = 0;
group.on('transition', () => transitions++);
group.on('failed', ({ rank, error }) => console.error(`rank ${rank} failed:`, error.code, error.message));

await group.barrier({ withCpuSync: true });
const gathered = await group.allGather(group.ranks.map((_, r) => tensor('fp32', [2], Float32Array.of(r, r * 10))));
console.log('allGather:', gathered[0].shape, Array.from(gathered[0].data).join(' '));

// Each rank routes its tokens to `topk` distinct experts; expert e's "computation" multiplies by (e + 1) / 8.
const tokens = group.ranks.map((_, r) => [48, 64, 0, 17][r % 4]);   // a rank may have none
const inputs = tokens.map((T, r) => {
  const x = toBf16(Array.from({ length: T * hidden }, (_, i) => Math.sin(i + r)));
  const topkIdx = Int32Array.from({ length: T * topk }, (_, i) => (Math.floor(i / topk) * 3 + r + (i % topk) * 5) % numExperts);
  const topkWeights = Float32Array.from({ length: T * topk }, (_, i) => (i % topk === 0 ? 0.75 : 0.25));
  return { x: tensor('bf16', [T, hidden], x), topkIdx, topkWeights };
});
const out = await group.dispatch(inputs);                    // out[r]: the rows rank r received, and their routing
const back = await group.combine(out.map((o, r) => {
  const x = fromBf16(/** @type {Uint16Array} */ (o.x.data)), y = new Float32Array(x.length);
  for (let i = 0; i < o.x.shape[0]; i++) {
    let s = 0;                                               // this rank's slots of row i: local ids, -1 elsewhere
    for (let k = 0; k < topk; k++) if (o.topkIdx[i * topk + k] >= 0) s += o.topkWeights[i * topk + k] * (r * E + o.topkIdx[i * topk + k] + 1) / 8;
    for (let j = 0; j < hidden; j++) y[i * hidden + j] = x[i * hidden + j] * s;
  }
  return { x: tensor('bf16', o.x.shape, toBf16(y)), handle: o.handle };
}));
let worst = 0;                                               // against the dense step: sum_k w_k * (e_k + 1) / 8 * x
back.forEach((b, r) => {
  const x = fromBf16(inputs[r].x.data), y = fromBf16(b.x.data), { topkIdx: e, topkWeights: w } = inputs[r];
  for (let t = 0; t < tokens[r]; t++) {
    const s = Array.from({ length: topk }, (_, k) => w[t * topk + k] * (e[t * topk + k] + 1) / 8).reduce((a, b) => a + b);
    for (let j = 0; j < hidden; j++) worst = Math.max(worst, Math.abs(y[t * hidden + j] - s * x[t * hidden + j]));
  }
});
console.log(`dispatch: ${out.map((o) => o.x.shape[0]).join(', ')} rows received; combine: max |error| ${worst.toFixed(4)} vs dense`);

const session = await group.openSession({ maxBytes: 4096, maxAllGathers: 2 });
const parts = await session.allGather(group.ranks.map((_, r) => tensor('int32', [1], Int32Array.of(r + 1))));
const sums = await session.reduceScatter(group.ranks.map((_, r) => tensor('fp32', [W * 2], new Float32Array(W * 2).fill(r + 1))));
await session.close();                                       // sums[r][i] = 1 + 2 + ... + W
console.log('session:', Array.from(parts[0].data).join(' '), '|', Array.from(sums[0].data).join(' '));

await group.destroy();                                       // every rank 'destroyed', memory and fds freed
const ok = worst < 0.01 && sums.every((s) => s.data.every((v) => v === (W * (W + 1)) / 2));
console.log(`${ok ? 'ok' : 'MISMATCH'}: ${W} ranks on '${group.backend}', ${transitions} transitions, ${group.ranks.map((h) => h.state).join(' ')}`);
process.exitCode = ok ? 0 : 1;
