// Rank program of test/gpu/elastic.test.mjs (elastic-graph-cases.mjs): CUDA graphs of an elastic
// group, kept on globalThis from one run to the next. g1: a dispatch without a handle (outputsInBuffer:
// its notify is in the graph, so each replay routes among the ranks then serving); g2: the same
// dispatch, a combine of it, a barrier and an allGather. phase 'capture': both captured, each replayed
// once and read back; 'loop': g2 replayed until an op fails or `ms` passed (a rank is killed meanwhile);
// 'replay': both replayed again and read back (after a rank left, the graphs made before it).
// Reads back the whole buffer views (the test slices them by the host oracle's counts).
import { cxPattern, gatherPart } from '../fixtures/elastic-graph-inputs.mjs';

const host = (t) => t.toHost().data;
const now = () => performance.timeOrigin + performance.now();

async function capture(rank, { list, hidden, topk, rows }) {
  const d = list[rank.rank];
  const T = d.x.shape[0];
  const x = rank.tensor('bf16', [T, hidden], d.x.data);
  const topkIdx = rank.tensor('int32', [T, topk], d.topkIdx);
  const topkWeights = rank.tensor('fp32', [T, topk], d.topkWeights);
  const cx = rank.tensor('bf16', [rows, hidden], cxPattern(rank.rank, rows, hidden));
  const part = rank.tensor('fp32', [4], gatherPart(rank.rank));
  const s = { tensors: [x, topkIdx, topkWeights, cx, part] };
  s.g1 = await rank.capture(async () => {
    s.view = await rank.dispatch({ x, topkIdx, topkWeights }, { outputsInBuffer: true });
  });
  s.g2 = await rank.capture(async () => {
    const k = await rank.dispatch({ x, topkIdx, topkWeights }, { outputsInBuffer: true });
    s.combined = await rank.combine({ x: cx, handle: k.handle });
    await rank.barrier();
    s.gathered = await rank.allGather(part);
  });
  globalThis.rfElasticGraphs = s;
  return s;
}

async function replayBoth(rank, s) {
  await s.g1.replay();
  await rank.sync();
  const v = s.view;
  const out = { x: host(v.x), topkIdx: host(v.topkIdx), topkWeights: host(v.topkWeights), srcRank: host(v.srcRank), srcToken: host(v.srcToken) };
  await s.g2.replay();
  await rank.sync();
  return { ...out, combineX: host(s.combined.x), combineW: host(s.combined.topkWeights), gathered: host(s.gathered) };
}

export default async function elasticGraph(rank, args) {
  const { phase } = args;
  if (phase === 'capture' || phase === 'fresh') {
    globalThis.rfElasticGraphs?.g1.free();
    globalThis.rfElasticGraphs?.g2.free();
    const s = await capture(rank, args);
    return { rank: rank.rank, ...(await replayBoth(rank, s)) };
  }
  const s = globalThis.rfElasticGraphs;
  if (phase === 'replay') return { rank: rank.rank, ...(await replayBoth(rank, s)) };
  // 'loop': replays until one fails (the kill) or args.ms passed; says how many went through and how it ended.
  const end = now() + args.ms;
  let replays = 0;
  try {
    while (now() < end) {
      await s.g2.replay();
      await rank.sync();
      replays++;
    }
    return { rank: rank.rank, replays, code: null, at: now() };
  } catch (e) {
    return { rank: rank.rank, replays, code: e.code ?? String(e), message: e.message, at: now() };
  }
}
