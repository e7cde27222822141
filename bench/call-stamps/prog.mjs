// The rank program of run.mjs: per op, median µs of the segments between the native stamps (scratch
// words 300.., CLOCK_MONOTONIC ns, from stamps.patch) and the program's own clock (performance.now(),
// put on the same origin as the stamps by the closest of 20000 readings of both). Each op runs 2 x
// `iters` times, the first pass a warm-up; then 300 more with rank.timeOps(true) for its device time.
export default async function (rank, { hidden, topk, numExperts, iters }) {
  const S = new Float64Array(rank.__scratch);
  const now = () => performance.now() * 1e6;  // ns, same origin below
  // offset: native CLOCK_MONOTONIC ns - performance.now() ns
  let off = 0;
  { let best = Infinity; for (let i = 0; i < 20000; i++) { const a = now(); const h = Number(process.hrtime.bigint()); const b = now(); if (b - a < best) { best = b - a; off = h - (a + b) / 2; } } }
  const med = (xs) => { if (xs.length === 0) return NaN; const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };
  const out = {};
  const T = 128;
  const x = rank.tensor('bf16', [T, hidden]);
  const idx = new Int32Array(T * topk);
  for (let i = 0; i < idx.length; i++) idx[i] = (i * 37 + (i >> 3) * 11) % numExperts;
  const topkIdx = rank.tensor('int32', [T, topk], idx);
  const topkWeights = rank.tensor('fp32', [T, topk], new Float32Array(T * topk).fill(0.5));
  const d0 = await rank.dispatch({ x, topkIdx, topkWeights });
  const cx = rank.tensor('bf16', [d0.numRecv, hidden]);
  const ops = {
    barrier: [() => rank.barrier(), false],
    dispatch: [() => rank.dispatch({ x, handle: d0.handle }, { outputsInBuffer: true }), true],
    combine: [async () => { const c = await rank.combine({ x: cx, handle: d0.handle }); c.x.free(); c.topkWeights.free(); }, true],
  };
  for (const [name, [fn, sync]] of Object.entries(ops)) {
    const seg = {};
    const add = (k, v) => (seg[k] ??= []).push(v / 1e3);
    for (let rep = 0; rep < 2; rep++) {
      for (let i = 0; i < iters; i++) {
        for (let k = 0; k < 16; k++) S[300 + k] = 0;
        const t0 = now();
        await fn();
        const t1 = now();
        const S0 = S.slice(300, 316);
        if (sync) await rank.sync();
        const t2 = now();
        if (rep === 0) continue;
        add('call', t2 - t0); add('submit', t1 - t0);
        const N = (k) => (S0[k] ? S0[k] - off : NaN), M = (k) => (S[300 + k] ? S[300 + k] - off : NaN);
        const pre = N(0) - t0; if (pre > -50e3 && pre < 50e3) add('js pre', pre);  // ns: a stamp from an earlier call is far off
        add('native entry -> launch()', N(3) - N(0));
        if (N(1)) add('  of it entry -> begin/op', N(1) - N(0));
        if (N(2)) add('  of it begin', N(2) - N(1));
        add('launch() -> cuGraphLaunch', N(4) - N(3));
        add('cuGraphLaunch', N(5) - N(4));
        add('launch return -> native exit', (N(7) || N(6)) - N(5));
        if (!sync) add('launch return -> flag seen', N(12) - N(5));
        if (sync) {
          add('writeValue', M(11) - M(10));
          add('flag wait', M(12) - M(11));
          add('launch return -> flag seen', M(12) - N(5));
          add('flag seen -> sync exit', M(13) - M(12));
        }
        add('critical: t0 -> launch return', N(5) - t0);
        add('critical: flag seen -> JS', t2 - (sync ? M(12) : N(12)));
      }
    }
    out[name] = Object.fromEntries(Object.entries(seg).map(([k, v]) => [k, +med(v.filter((x) => !Number.isNaN(x))).toFixed(2)]));
    if (name === 'barrier') continue;
    rank.timeOps(true);
    const dev = [];
    for (let i = 0; i < 300; i++) { await fn(); dev.push(rank.lastOpDeviceMs() * 1e3); }
    rank.timeOps(false);
    out[name].device = +med(dev).toFixed(2);
  }
  return out;
}
