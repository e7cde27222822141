// One process of the scale-out benchmark (bench/scaleout.ts forks it): hosts `ranks` ranks of a world
// on node `nodeId`, times dispatch + combine rounds in a rank program (programs/moe-loop.ts), and
// measures the traffic of one dispatch and one combine in driver mode; reports over IPC.
import { createGroup, tensor, type Group } from '../actors/index.js';
import type { MoeLoopArgs, MoeLoopResult } from './programs/moe-loop.js';

interface Args { url: string; worldSize: number; rankOffset: number; ranks: number; nodeId: string; moe: Omit<MoeLoopArgs, 'seed'> }

const a = JSON.parse(process.argv[2]!) as Args;
const send = (m: unknown): Promise<void> => new Promise((resolve) => process.send!(m, () => resolve()));

const snapshot = (g: Group) => g.traffic();
const delta = (before: ReturnType<Group['traffic']>, after: ReturnType<Group['traffic']>) =>
  after.map((t, i) => ({ rank: t.rank, up: t.scaleUpBytes - before[i]!.scaleUpBytes, out: t.scaleOutBytes - before[i]!.scaleOutBytes, outSeconds: t.scaleOutSeconds - before[i]!.scaleOutSeconds }));

const { moe } = a;
const group = await createGroup({
  ranks: a.ranks, backend: 'host',
  buffer: { maxTokensPerRank: moe.tokens, hidden: moe.hidden, topk: moe.topk, numExperts: moe.experts },
  timeouts: { cpuSeconds: 300, gpuSeconds: 300 },
  world: { size: a.worldSize, rankOffset: a.rankOffset, rendezvous: a.url, nodeId: a.nodeId },
});
try {
  const before = snapshot(group);
  const loop = await group.run<MoeLoopResult>(new URL('./programs/moe-loop.js', import.meta.url), { ...moe, seed: 1 } satisfies MoeLoopArgs);
  const looped = delta(before, snapshot(group));
  // One dispatch and one combine in driver mode, the same routing as the loop's, with the counters read between.
  const inputs = group.ranks.map((h) => {
    let s = (1 + h.rank * 7919) >>> 0;
    const rng = (): number => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296);
    const topkIdx = new Int32Array(moe.tokens * moe.topk);
    for (let t = 0; t < moe.tokens; t++) {
      const picked = new Set<number>();
      while (picked.size < moe.topk) picked.add(Math.floor(rng() * moe.experts));
      [...picked].forEach((e, k) => (topkIdx[t * moe.topk + k] = e));
    }
    return { x: tensor('bf16', [moe.tokens, moe.hidden]), topkIdx, topkWeights: new Float32Array(moe.tokens * moe.topk).fill(1 / moe.topk) };
  });
  const t0 = snapshot(group);
  const d = await group.dispatch(inputs);
  const t1 = snapshot(group);
  await group.combine(d.map((o) => ({ x: o.x as never, handle: o.handle })));
  const t2 = snapshot(group);
  await send({ kind: 'result', loop, looped, dispatch: delta(t0, t1), combine: delta(t1, t2) });
} finally {
  await group.destroy();
}
process.disconnect();
