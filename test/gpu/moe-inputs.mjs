// Deterministic MoE inputs shared by test/gpu/moe.test.mjs and its rank program: the same (seed, rank)
// gives the same tensors in the test process and in a rank's worker.
export const MOE_BUFFER = { maxTokensPerRank: 128, hidden: 256, topk: 8, numExperts: 256, fp8Dispatch: true, bytes: 64 << 20 };

export function lcg(seed) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 4294967296);
}

/**
 * routing: 'random' (top-8 of 256, about one slot in five -1), 'one' (every token to expert 5 only),
 * 'none' (every slot -1). Returns host arrays: x (bf16 bits or fp8 bytes), scales (fp8), topkIdx, topkWeights.
 */
export function moeInput(seed, rank, tokens, { fp8 = false, routing = 'random' } = {}) {
  const { hidden, topk, numExperts } = MOE_BUFFER;
  const rng = lcg(seed * 7919 + rank * 104729 + 1);
  const x = fp8 ? new Uint8Array(tokens * hidden) : new Uint16Array(tokens * hidden);
  for (let i = 0; i < x.length; i++) x[i] = fp8 ? Math.floor(rng() * 256) & 0x7e : (Math.floor(rng() * 0x3f00) + 0x0080) & 0xbfff;
  const scales = fp8 ? Float32Array.from({ length: tokens * (hidden / 128) }, () => rng() * 4 + 0.25) : undefined;
  const topkIdx = new Int32Array(tokens * topk).fill(-1);
  const topkWeights = new Float32Array(tokens * topk);
  for (let t = 0; t < tokens; t++) {
    if (routing === 'none') continue;
    if (routing === 'one') {
      topkIdx[t * topk] = 5;
      topkWeights[t * topk] = 1;
      continue;
    }
    const picked = new Set();
    while (picked.size < topk) picked.add(Math.floor(rng() * numExperts));
    [...picked].forEach((e, k) => {
      if (rng() < 0.2) return;
      topkIdx[t * topk + k] = e;
      topkWeights[t * topk + k] = rng();
    });
  }
  return { x, scales, topkIdx, topkWeights };
}

/** A bf16 moeInput of `tokens` tokens as the device tensors a cuda rank program dispatches. */
export function deviceMoeInput(rank, inp, tokens) {
  const { hidden, topk } = MOE_BUFFER;
  return {
    x: rank.tensor('bf16', [tokens, hidden], inp.x),
    topkIdx: rank.tensor('int32', [tokens, topk], inp.topkIdx),
    topkWeights: rank.tensor('fp32', [tokens, topk], inp.topkWeights),
  };
}

/** bf16 rows for combine: [rows, hidden] (finite values), and per-row weights. */
export function combineInput(seed, rank, rows) {
  const { hidden, topk } = MOE_BUFFER;
  const rng = lcg(seed * 31337 + rank * 17 + 5);
  const x = new Uint16Array(rows * hidden);
  for (let i = 0; i < x.length; i++) x[i] = (Math.floor(rng() * 0x3e00) + 0x0100) | (rng() < 0.5 ? 0x8000 : 0);
  const w = Float32Array.from({ length: rows * topk }, () => rng() * 2 - 1);
  return { x, w };
}

export function biasInput(seed, rank, tokens) {
  const rng = lcg(seed * 101 + rank * 13 + 9);
  return Uint16Array.from({ length: tokens * MOE_BUFFER.hidden }, () => Math.floor(rng() * 0x3e00) + 0x0100);
}

/** FNV-1a (32 bits) of a typed array's bytes: what a rank program returns for outputs too many to send back each step. */
export function digest(a) {
  const b = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  let h = 0x811c9dc5;
  for (let i = 0; i < b.length; i++) h = Math.imul(h ^ b[i], 0x01000193) >>> 0;
  return h;
}
