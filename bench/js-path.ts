// What the JavaScript side of a rank program's op costs (node dist/bench/js-path.js [--iters 200000]
// [--out DIR]): the real program handle, op table and rank runner (machine steps, transition log)
// over a native stub whose calls return at once, on the thread that runs it. A cuda rank program's
// call is this plus the native call (bench/call-profile.ts, bench/hot-path.ts measure the whole).
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { SCRATCH, type NativeContext } from '../actors/core/addon.js';
import { DeviceTensor } from '../actors/core/device-tensor.js';
import type { RankInit } from '../workers/protocol.js';
import { programHandle } from '../workers/program.js';
import { RankOps } from '../workers/ops/index.js';
import { EVENTS, RankRunner } from '../workers/runner.js';
import { provenance } from './provenance.js';

const { values: flags } = parseArgs({ options: { iters: { type: 'string', default: '200000' }, out: { type: 'string' } } });
const iters = Number(flags.iters);

const buffer = { maxTokensPerRank: 128, hidden: 7168, topk: 8, numExperts: 256 };
const scratch = new ArrayBuffer(4096);
const f64 = new Float64Array(scratch);
let layouts = 0;
// Only what a cached dispatch, a combine and a barrier of device tensors reach.
const native = {
  scratch,
  seq: () => 0,
  info: () => ({ window: 1n << 40n, workspaceBytes: 1 << 21 }),
  dispatch: () => {
    f64[SCRATCH.layoutId] = ++layouts;
    f64[SCRATCH.numRecv] = buffer.maxTokensPerRank;
    return undefined;
  },
  combine: () => undefined,
  barrier: () => undefined,
  deviceAlloc: () => 1n << 30n,
  deviceFree: () => {},
} as unknown as NativeContext;
const init = {
  rank: 0, worldSize: 1, ranksPerNode: 1, groupId: 'js-path', buffer, cpuSeconds: 5, gpuSeconds: 5, inspect: false, backend: 'cuda',
  abort: new SharedArrayBuffer(8192),
} as RankInit;
const runner = new RankRunner(0, { cpuSeconds: 5, gpuSeconds: 5 }, { postMessage: () => {} }, false);
runner.run(EVENTS.register, () => undefined);  // init -> ready, as a rank's registration leaves it
const rank = programHandle(new RankOps(init, native, runner));
const view = (dtype: 'bf16' | 'int32' | 'fp32', shape: number[]) => new DeviceTensor(native, dtype, shape, 1n << 32n, false);
const x = view('bf16', [128, 7168]), topkIdx = view('int32', [128, 8]), topkWeights = view('fp32', [128, 8]);
const first = await rank.dispatch({ x, topkIdx, topkWeights });

async function perCall(fn: () => Promise<unknown>): Promise<number> {
  for (let i = 0; i < Math.min(iters, 20000); i++) await fn();
  const t0 = performance.now();
  for (let i = 0; i < iters; i++) await fn();
  return ((performance.now() - t0) * 1e3) / iters;
}

const result = [
  { op: 'dispatch (cached, outputs in buffer)', us: await perCall(() => rank.dispatch({ x, handle: first.handle }, { outputsInBuffer: true })) },
  { op: 'combine', us: await perCall(() => rank.combine({ x, handle: first.handle })) },
  { op: 'barrier', us: await perCall(() => rank.barrier()) },
  { op: 'an empty async function (the floor)', us: await perCall(async () => {}) },
];
console.log(`JS of a rank program's op on a native stub, µs per awaited call (${iters} back to back)`);
for (const r of result) console.log(`${r.op.padEnd(40)} ${r.us.toFixed(2).padStart(7)}`);
if (flags.out) {
  mkdirSync(flags.out, { recursive: true });
  const file = path.join(flags.out, `js-path-${new Date().toISOString().slice(0, 19).replace(/:/g, '-')}.json`);
  writeFileSync(file, JSON.stringify({ ...provenance(), iters, result }, null, 2) + '\n');
  console.log(`wrote ${file}`);
}
