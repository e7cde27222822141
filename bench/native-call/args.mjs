// Runs bench/native-call/args.cc's three ways of taking a dispatch's arguments side by side, in
// alternating rounds (node bench/native-call/args.mjs [calls per round, 2000000]); µs per call,
// best and median of 6 rounds each. Build args.node first (args.cc says how).
import { createRequire } from 'node:module';

const m = createRequire(import.meta.url)('./args.node');
const n = Number(process.argv[2] ?? 2e6);
const scratch = new ArrayBuffer(64);
const f64 = new Float64Array(scratch);
m.setScratch(scratch);
const x = 1n << 40n, idx = 1n << 41n, w = 1n << 42n;
const ways = {
  wrapped: () => { for (let i = 0; i < n; i++) m.wrapped(x, undefined, idx, w, 128, 2, 1, 7, 0, 2); },
  direct: () => { for (let i = 0; i < n; i++) m.direct(x, undefined, idx, w, 128, 2, 1, 7, 0, 2); },
  scratch: () => {
    for (let i = 0; i < n; i++) {
      f64[0] = 128; f64[1] = 2; f64[2] = 1; f64[3] = 7; f64[4] = 0; f64[5] = 2;
      m.scratch(x, undefined, idx, w);
    }
  },
};
const us = Object.fromEntries(Object.keys(ways).map((k) => [k, []]));
for (let round = 0; round < 6; round++) {
  for (const [k, run] of Object.entries(ways)) {
    const t0 = performance.now();
    run();
    us[k].push(((performance.now() - t0) * 1e3) / n);
  }
}
console.log(`a dispatch's arguments through Node-API, µs per call (${n} calls per round, 6 rounds each, alternating)`);
for (const [k, v] of Object.entries(us)) {
  v.sort((a, b) => a - b);
  console.log(`${k.padEnd(8)} best ${v[0].toFixed(3)}  median ${v[3].toFixed(3)}`);
}
