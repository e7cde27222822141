// Rank program of test/gpu/interop.test.mjs: the example addon (examples/interop-addon) works on a
// dispatch's device outputs beside rankflow, three ways at once:
//   A. in place, on the rank's own stream (rank.cudaStream()), delayed on the GPU: ordered by the stream;
//   B. from those rows into memory of its own (a DeviceBuffer), on a stream of its own that waits for
//      an event recorded on the rank's stream after A (rank.recordEvent()), delayed again; the rank's
//      stream waits for the addon's event (rank.waitEvent()) before combining the buffer, wrapped as a
//      device tensor (rank.wrapDevice(..., { owner })).
// Then A's rows are combined too. Returns both combines, what the handles were, and the refusals.
import { createRequire } from 'node:module';

import { MOE_BUFFER, moeInput, deviceMoeInput } from '../moe-inputs.mjs';
import { factorA, factorB, factors } from '../interop-inputs.mjs';

const DELAY_NS = 50e6;
const codeOf = (fn) => {
  try {
    fn();
    return 'ok';
  } catch (e) {
    return `${e.code}: ${e.message}`;
  }
};

export default async function (rank, { seed, tokens, addonPath }) {
  const addon = createRequire(import.meta.url)(addonPath);
  const { hidden } = MOE_BUFFER;
  const T = tokens[rank.rank];
  const inp = moeInput(seed, rank.rank, T);
  const { x, topkIdx, topkWeights } = deviceMoeInput(rank, inp, T);
  const stream = rank.cudaStream();
  const handles = {
    stream: stream !== 0n && rank.cudaStream() === stream,
    contextIsCurrent: addon.currentContext() === rank.cudaContext(),
    streamContext: addon.streamContext(stream) === rank.cudaContext(),
  };

  const d = await rank.dispatch({ x, topkIdx, topkWeights });
  const R = d.numRecv;
  const srcRank = d.srcRank.toHost().data, srcToken = d.srcToken.toHost().data;
  const fA = rank.tensor('fp32', [R], factors(factorA, srcRank, srcToken));
  const fB = rank.tensor('fp32', [R], factors((_, t) => factorB(t), srcRank, srcToken));

  // A: in place on the rank's stream, after the dispatch's kernels.
  addon.scaleRows(d.x.ptr, d.x.ptr, fA.ptr, R, hidden, stream, DELAY_NS);
  // B: on the addon's stream, after A (an event on the rank's stream), into the addon's memory.
  const mine = addon.createStream();
  const buf = new addon.DeviceBuffer(R * hidden * 2, mine);
  addon.syncStream(mine);  // the stream-ordered allocation done: any stream may use it
  const afterA = rank.recordEvent();
  addon.streamWaitEvent(mine, afterA);
  addon.scaleRows(buf.ptr, d.x.ptr, fB.ptr, R, hidden, mine, DELAY_NS);
  const doneB = addon.createEvent();
  addon.recordEvent(doneB, mine);
  rank.waitEvent(doneB);
  const xB = rank.wrapDevice(buf.ptr, 'bf16', [R, hidden], { owner: buf });
  const cB = await rank.combine({ x: xB, handle: d.handle });
  const cA = await rank.combine({ x: d.x, handle: d.handle });
  const out = { numRecv: R, handles, combineA: cA.x.toHost().data, combineB: cB.x.toHost().data };

  // What wrapDevice refuses, on the GPU's word: memory CUDA does not know; an address not 16-byte aligned.
  out.refused = {
    unknown: codeOf(() => rank.wrapDevice(0x100000n, 'bf16', [1, hidden])),
    misaligned: codeOf(() => rank.wrapDevice(buf.ptr + 8n, 'bf16', [1, 8])),
  };
  await rank.barrier();  // still usable

  await rank.sync();
  xB.free();
  buf.free();
  addon.syncStream(mine);
  addon.destroyEvent(doneB);
  addon.destroyStream(mine);
  rank.destroyEvent(afterA);
  for (const t of [x, topkIdx, topkWeights, fA, fB, cA.x, cA.topkWeights, cB.x, cB.topkWeights]) t.free();
  d.free();
  return out;
}
