// Rank program of test/gpu/scaleout.test.mjs (a cuda world over simulated nodes): the 'dispatch.bf16'
// and 'combine.plain' cases of test/fixtures/scaleout-cases.mjs on device tensors (with a CPU sync),
// read back in the cases' report format, for the test to compare with the one-node host group; then a
// dispatch without a CPU sync (outputsInBuffer), which cuda refuses across nodes (BACKEND_UNAVAILABLE)
// before anything moves, and a barrier to show the rank usable after it. On backend 'host' (a check of
// the harness without a GPU) the inputs are the host arrays themselves.
import { HIDDEN, TOPK, caseRows, dispatchInput } from '../../fixtures/scaleout-cases.mjs';

const b64 = (a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString('base64');
const host = (t) => (typeof t.toHost === 'function' ? t.toHost().data : (t.data ?? t));

export default async function (rank) {
  const g = rank.rank;
  const inp = dispatchInput(g, 'dispatch.bf16');
  const T = inp.topkIdx.length / TOPK;
  const x = rank.tensor('bf16', [T, HIDDEN], inp.x.data);
  const onDevice = x.device === true;
  const topkIdx = onDevice ? rank.tensor('int32', [T, TOPK], inp.topkIdx) : inp.topkIdx;
  const topkWeights = onDevice ? rank.tensor('fp32', [T, TOPK], inp.topkWeights) : inp.topkWeights;
  const d = await rank.dispatch({ x, topkIdx, topkWeights });
  const dispatched = {
    x: b64(host(d.x)), topkIdx: b64(host(d.topkIdx)), topkWeights: b64(host(d.topkWeights)),
    srcRank: Array.from(host(d.srcRank)), srcToken: Array.from(host(d.srcToken)), tokensPerExpert: d.tokensPerExpert,
  };
  const R = d.numRecv ?? d.x.shape[0];
  const cx = rank.tensor('bf16', [R, HIDDEN], caseRows(g, 'combine.plain', R).data);
  const c = await rank.combine({ x: cx, handle: d.handle });
  const combined = { x: b64(host(c.x)), topkWeights: b64(host(c.topkWeights)) };
  const nosync = await rank.dispatch({ x, topkIdx, topkWeights }, { outputsInBuffer: true }).then(() => null, (e) => ({ code: e.code, message: e.message }));
  await rank.barrier({ withCpuSync: true });
  if (onDevice) {
    for (const t of [x, topkIdx, topkWeights, cx, c.x, c.topkWeights]) t.free();
    d.free();
  }
  return { dispatched, combined, nosync };
}
