// Stress of moe.test.mjs's captured-graph program: W ranks sharing GPU 0, `runs` group.run calls of
// test/gpu/programs/moe-graph.mjs (5 replays of two graphs each); a failure is counted with its
// error, the group destroyed and made again. Knobs by environment (actors/core/config.ts):
// RANKFLOW_GRAPH_LAUNCH=0, RANKFLOW_COOPERATIVE=0, CUDA_DEVICE_MAX_CONNECTIONS. Results:
// bench/results/shared-gpu-launch-2026-12-02.md. node bench/shared-gpu/stress.mjs <runs> <W> [label]
// (after npm run build; needs a GPU)
import { createGroup } from '../../dist/actors/index.js';
import { MOE_BUFFER } from '../../test/gpu/moe-inputs.mjs';

const runs = Number(process.argv[2] ?? 30), W = Number(process.argv[3] ?? 2), label = process.argv[4] ?? '';
const tokens = W === 2 ? [100, 77] : [100, 77, 0, 128];
const program = new URL('../../test/gpu/programs/moe-graph.mjs', import.meta.url);
const make = () => createGroup({ backend: 'cuda', ranks: W, devices: Array(W).fill(0), buffer: MOE_BUFFER, timeouts: { gpuSeconds: 2 } });
let g = await make();
let fails = 0;
const t0 = performance.now();
const seen = new Map();
for (let i = 0; i < runs; i++) {
  try {
    await g.run(program, { seed: 12 + i, tokens, replays: 5 });
  } catch (e) {
    fails++;
    let c = e; while (c.cause) c = c.cause;
    const k = `${e.code} / ${String(c.message).slice(0, 110)}`;
    seen.set(k, (seen.get(k) ?? 0) + 1);
    await g.destroy().catch(() => {});
    g = await make();
  }
}
await g.destroy();
console.log(`${label} W=${W}: ${fails} of ${runs} runs failed in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
for (const [k, n] of seen) console.log(`  ${n}x ${k}`);
