// Rank program of test/gpu/moe.test.mjs: past 256 live handles, each new handle takes over the
// expiring one's layout and device blocks (native/src/runtime/context.cc add_layout,
// native/src/backends/cuda/moe.cc new_layout_state). Routings take turns, two handles per step: a
// dispatch without a CPU sync (one kernel, with a routing block of its own) and a cached dispatch of
// its handle with new x (a receive block only), both with outputs in the buffer, then a combine
// through the cached handle. Returns per step the digests of the first recv[set][rank] rows of each
// dispatch's outputs and of the combine's results (the test has the host group's).
import { MOE_BUFFER, combineInput, deviceMoeInput, digest, moeInput } from '../moe-inputs.mjs';

export default async function (rank, { seed, tokens, recv, rows, steps }) {
  const { hidden, topk } = MOE_BUFFER;
  const sets = tokens.map((perRank, s) => {
    const T = perRank[rank.rank], R = recv[s][rank.rank];
    const px = new Uint16Array(rows * hidden);
    px.set(combineInput(seed + s, rank.rank, R).x);
    return {
      ...deviceMoeInput(rank, moeInput(seed + s, rank.rank, T), T), R,
      x2: rank.tensor('bf16', [T, hidden], moeInput(seed + 100 + s, rank.rank, T).x),
      cx: rank.tensor('bf16', [rows, hidden], px),
    };
  });
  // toHost() copies after the rank's queued work: the dispatch has ended.
  const rowsOf = (d, R) => [
    digest(d.x.toHost().data.subarray(0, R * hidden)), digest(d.topkIdx.toHost().data.subarray(0, R * topk)),
    digest(d.topkWeights.toHost().data.subarray(0, R * topk)), digest(d.srcRank.toHost().data.subarray(0, R)),
    digest(d.srcToken.toHost().data.subarray(0, R)),
  ];
  const was = (await rank.info()).device.fusedDispatches;
  const out = [];
  for (let step = 0; step < steps; step++) {
    const set = step % sets.length, k = sets[set];
    const f = await rank.dispatch({ x: k.x, topkIdx: k.topkIdx, topkWeights: k.topkWeights }, { outputsInBuffer: true });
    const fresh = rowsOf(f, k.R);
    const c = await rank.dispatch({ x: k.x2, handle: f.handle }, { outputsInBuffer: true });
    const cached = rowsOf(c, k.R);
    const m = await rank.combine({ x: k.cx, handle: c.handle });
    out.push({ set, fresh, cached, combine: [digest(m.x.toHost().data), digest(m.topkWeights.toHost().data)] });
    m.x.free();
    m.topkWeights.free();
  }
  for (const k of sets) for (const t of [k.x, k.topkIdx, k.topkWeights, k.x2, k.cx]) t.free();
  return { steps: out, fusedDispatches: (await rank.info()).device.fusedDispatches - was };
}
