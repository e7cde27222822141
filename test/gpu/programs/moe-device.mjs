// Rank program of test/gpu/moe.test.mjs: dispatch and combine of device-resident tensors on cuda,
// with CPU sync, with the outputs left in the buffer, and cached; results read back with toHost().
import { MOE_BUFFER, biasInput, combineInput, moeInput, deviceMoeInput } from '../moe-inputs.mjs';

const host = (t) => t.toHost().data;

export default async function (rank, { seed, tokens }) {
  const T = tokens[rank.rank];
  const { hidden, topk } = MOE_BUFFER;
  const inp = moeInput(seed, rank.rank, T);
  const { x, topkIdx, topkWeights } = deviceMoeInput(rank, inp, T);

  const d = await rank.dispatch({ x, topkIdx, topkWeights });
  const R = d.numRecv;
  const out = {
    isDevice: d.x.device === true,
    numRecv: R,
    tokensPerExpert: d.tokensPerExpert,
    x: host(d.x), topkIdx: host(d.topkIdx), topkWeights: host(d.topkWeights), srcRank: host(d.srcRank), srcToken: host(d.srcToken),
  };
  const ci = combineInput(seed, rank.rank, R);
  const cx = rank.tensor('bf16', [R, hidden], ci.x);
  const cw = rank.tensor('fp32', [R, topk], ci.w);
  const bias = rank.tensor('bf16', [T, hidden], biasInput(seed, rank.rank, T));
  const c = await rank.combine({ x: cx, handle: d.handle, topkWeights: cw, bias });
  out.combineX = host(c.x);
  out.combineW = host(c.topkWeights);
  // The same combine into tensors of the caller's (options.out: nothing allocated per call); a wrong
  // shape is refused before any rank moves.
  const ox = rank.tensor('bf16', [T, hidden]), ow = rank.tensor('fp32', [T, topk]);
  const c2 = await rank.combine({ x: cx, handle: d.handle, topkWeights: cw, bias }, { out: { x: ox, topkWeights: ow } });
  out.outIsMine = c2.x === ox && c2.topkWeights === ow;
  out.combineOutX = host(ox);
  out.combineOutW = host(ow);
  const wrong = rank.tensor('bf16', [T + 1, hidden]);
  out.outShapeRefused = await rank.combine({ x: cx, handle: d.handle }, { out: { x: wrong, topkWeights: ow } }).then(() => 'accepted', (e) => e.code);
  for (const t of [ox, ow, wrong]) t.free();

  // The zero-copy path: no CPU sync, outputs in the buffer (worst-case rows; the first R are the tokens).
  const b = await rank.dispatch({ x, topkIdx, topkWeights }, { outputsInBuffer: true });
  await rank.sync();
  out.inBuffer = {
    numRecv: b.numRecv, rows: b.x.shape[0], x: host(b.x).slice(0, R * hidden), srcToken: host(b.srcToken).slice(0, R), srcRank: host(b.srcRank).slice(0, R),
  };
  // Every in-buffer dispatch returns the same views of the buffer (nothing allocated per call).
  const b2 = await rank.dispatch({ x, handle: b.handle }, { outputsInBuffer: true });
  await rank.sync();
  out.inBuffer.sameViews = b2.x === b.x && b2.srcToken === b.srcToken && b2.topkWeights === b.topkWeights;
  let refused = '';
  try {
    await rank.combine({ x: b.x, handle: b.handle });
  } catch (e) {
    refused = e.code;
  }
  out.combineFromBufferRefused = refused;

  // Cached: the routing of the first dispatch, new x.
  const x2 = rank.tensor('bf16', [T, hidden], moeInput(seed + 1, rank.rank, T).x);
  const k = await rank.dispatch({ x: x2, handle: d.handle });
  out.cached = { numRecv: k.numRecv, x: host(k.x), topkWeights: host(k.topkWeights) };

  // Events: a positive duration around a barrier.
  out.timedMs = await rank.timeIt(() => rank.barrier(), 3);
  for (const t of [x, topkIdx, topkWeights, cx, cw, bias, x2, c.x, c.topkWeights]) t.free();
  d.free();
  k.free();
  b.free();
  return out;
}
