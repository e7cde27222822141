// Rank program of test/gpu/moe.test.mjs: a dispatch without a CPU sync (outputsInBuffer), which cuda
// runs as one kernel (notify and data: rf_dispatch_fused in kernels/dispatch.cu) unless
// RANKFLOW_FUSED_DISPATCH=0, then a combine through its handle. Returns the first recv[rank] rows of
// every output view (the test knows them from the host group) and the combines' results (their inputs
// have the worst case of `rows` rows, the first recv[rank] of them the host group's). numSms sets the
// dispatch's grid (1: one block routes and copies every token). The second combine (`plain`) has no
// weights and no bias.
import { MOE_BUFFER, biasInput, combineInput, moeInput } from '../moe-inputs.mjs';

const host = (t) => t.toHost().data;

export default async function (rank, { seed, tokens, recv, rows, numSms, fp8, routing }) {
  const T = tokens[rank.rank], R = recv[rank.rank];
  const { hidden, topk } = MOE_BUFFER;
  const inp = moeInput(seed, rank.rank, T, { fp8, routing });
  const x = rank.tensor(fp8 ? 'fp8e4m3' : 'bf16', [T, hidden], inp.x);
  const scales = fp8 ? rank.tensor('fp32', [T, hidden / 128], inp.scales) : undefined;
  const topkIdx = rank.tensor('int32', [T, topk], inp.topkIdx);
  const topkWeights = rank.tensor('fp32', [T, topk], inp.topkWeights);
  const d = await rank.dispatch({ x, ...(scales ? { scales } : {}), topkIdx, topkWeights }, { outputsInBuffer: true, ...(numSms ? { numSms } : {}) });
  const out = {
    numRecv: d.numRecv,
    x: host(d.x).slice(0, R * hidden),
    scales: d.scales ? host(d.scales).slice(0, R * (hidden / 128)) : null,
    topkIdx: host(d.topkIdx).slice(0, R * topk),
    topkWeights: host(d.topkWeights).slice(0, R * topk),
    srcRank: host(d.srcRank).slice(0, R),
    srcToken: host(d.srcToken).slice(0, R),
  };
  // The same routing again, cached (the handle's state; one rank: rf_dispatch_local): the same outputs,
  // and the combines below run on its state.
  const k = await rank.dispatch({ x, ...(scales ? { scales } : {}), handle: d.handle }, { outputsInBuffer: true });
  out.cached = {
    x: host(k.x).slice(0, R * hidden),
    scales: k.scales ? host(k.scales).slice(0, R * (hidden / 128)) : null,
    topkIdx: host(k.topkIdx).slice(0, R * topk),
    topkWeights: host(k.topkWeights).slice(0, R * topk),
    srcRank: host(k.srcRank).slice(0, R),
    srcToken: host(k.srcToken).slice(0, R),
  };
  const ci = combineInput(seed, rank.rank, R);
  const px = new Uint16Array(rows * hidden), pw = new Float32Array(rows * topk);
  px.set(ci.x);
  pw.set(ci.w);
  const cx = rank.tensor('bf16', [rows, hidden], px);
  const cw = rank.tensor('fp32', [rows, topk], pw);
  const bias = rank.tensor('bf16', [T, hidden], biasInput(seed, rank.rank, T));
  const c = await rank.combine({ x: cx, handle: d.handle, topkWeights: cw, bias });
  out.combineX = host(c.x);
  out.combineW = host(c.topkWeights);
  // Again with neither weights nor bias: the dispatch's weights (the handle's state) and, for a token
  // with one source row, the reduce's one-row path.
  const c2 = await rank.combine({ x: cx, handle: d.handle });
  out.plainX = host(c2.x);
  out.plainW = host(c2.topkWeights);
  c2.x.free();
  c2.topkWeights.free();
  out.fusedDispatches = (await rank.info()).device.fusedDispatches;
  for (const t of [x, scales, topkIdx, topkWeights, cx, cw, bias, c.x, c.topkWeights]) t?.free();
  return out;
}
