/**
 * What a cuda rank program's device dispatch returns, on the JS side: the program handle, op table
 * and runner (as bench/js-path.ts drives them) over a native stub that writes the scratch as the cuda
 * backend does. Checked against values computed here: outputsInBuffer gives the buffer's regions
 * (addresses = window + workspace + the addon's layout offsets; x as fp8 for fp8 input, scales only
 * then, the keys in one order), numRecv and tokensPerExpert as the scratch said (a fresh array each
 * call, its own to mutate), a new frozen handle per call that a copy of cannot pass, free() that
 * frees no view; the allocated path frees exactly its own outputs; each op is one transition pair.
 */
import { describe, expect, test } from 'vitest';

import { DISPATCH_ARG, SCRATCH, loadAddon, type NativeContext } from '../actors/core/addon.js';
import { DeviceTensor } from '../actors/core/device-tensor.js';
import type { DispatchHandle } from '../actors/core/validate.js';
import type { RankInit, WorkerMessage } from '../workers/protocol.js';
import { programHandle } from '../workers/program.js';
import { RankOps } from '../workers/ops/index.js';
import { EVENTS, RankRunner } from '../workers/runner.js';
import { TransitionDecoder } from '../workers/transition-log.js';

const W = 4, WINDOW = 1n << 40n, WORKSPACE = 1 << 21;

function setup(fp8Dispatch: boolean) {
  const buffer = { maxTokensPerRank: 16, hidden: 256, topk: 4, numExperts: 32, fp8Dispatch };
  const local = buffer.numExperts / W;
  const scratch = new ArrayBuffer(4096);
  const f64 = new Float64Array(scratch), u64 = new BigUint64Array(scratch);
  let layouts = 0, allocs = 0;
  const freed: bigint[] = [];
  /** what the next dispatch reports: rows received (-1: not known, no CPU sync) and counts */
  const next = { numRecv: 10, counts: Array.from({ length: local }, (_, e) => e * 3 + 1) };
  const native = {
    scratch,
    seq: () => 0,
    info: () => ({ window: WINDOW, workspaceBytes: WORKSPACE }),
    dispatch: () => {
      const handle = f64[SCRATCH.args + DISPATCH_ARG.handle]!, mode = f64[SCRATCH.args + DISPATCH_ARG.mode]!;
      f64[SCRATCH.layoutId] = handle || ++layouts;
      f64[SCRATCH.numRecv] = next.numRecv;
      next.counts.forEach((c, e) => (f64[SCRATCH.tokensPerExpert + e] = c));
      if (mode === 1) for (let i = 0; i < 6; i++) u64[SCRATCH.addresses + i] = BigInt(0x1000 * (++allocs));
      return undefined;
    },
    combine: () => undefined,
    barrier: () => undefined,
    deviceAlloc: () => BigInt(0x1000 * (++allocs)),
    deviceFree: (p: bigint) => void freed.push(p),
  } as unknown as NativeContext;
  const messages: WorkerMessage[] = [];
  const runner = new RankRunner(0, { cpuSeconds: 5, gpuSeconds: 5 }, { postMessage: (m) => messages.push(m as WorkerMessage) }, false);
  runner.run(EVENTS.register, () => undefined);
  const init = { rank: 0, worldSize: W, ranksPerNode: W, groupId: 'g', buffer, cpuSeconds: 5, gpuSeconds: 5, inspect: false, backend: 'cuda', abort: new SharedArrayBuffer(8192) } as RankInit;
  const rank = programHandle(new RankOps(init, native, runner));
  const dev = (dtype: 'bf16' | 'fp8e4m3' | 'int32' | 'fp32', shape: number[]) => new DeviceTensor(native, dtype, shape, 1n << 32n, false);
  const T = 8;
  const inputs = {
    x: dev(fp8Dispatch ? 'fp8e4m3' : 'bf16', [T, buffer.hidden]), scales: fp8Dispatch ? dev('fp32', [T, buffer.hidden / 128]) : undefined,
    topkIdx: dev('int32', [T, buffer.topk]), topkWeights: dev('fp32', [T, buffer.topk]),
  };
  const dec = new TransitionDecoder();
  const transitions = () => {
    runner.flush();
    const out: Array<{ from: string; to: string; event: string; phases?: readonly string[] }> = [];
    const take = (m: WorkerMessage): void => {
      if (m.kind === 'batch') m.messages.forEach(take);
      else if (m.kind === 'transitions') dec.decode(m, (t) => out.push({ from: t.from, to: t.to, event: t.event, ...(t.phases ? { phases: t.phases } : {}) }));
    };
    messages.splice(0).forEach(take);
    return out;
  };
  transitions();
  const rows = W * buffer.maxTokensPerRank;
  const layout = loadAddon().layout(buffer, W).buffer;
  const at = (off: number) => WINDOW + BigInt(WORKSPACE) + BigInt(off);
  const views = {
    x: { dtype: fp8Dispatch ? 'fp8e4m3' : 'bf16', shape: [rows, buffer.hidden], ptr: at(layout.x) },
    ...(fp8Dispatch ? { scales: { dtype: 'fp32', shape: [rows, buffer.hidden / 128], ptr: at(layout.scales) } } : {}),
    topkIdx: { dtype: 'int32', shape: [rows, buffer.topk], ptr: at(layout.topkIdx) },
    topkWeights: { dtype: 'fp32', shape: [rows, buffer.topk], ptr: at(layout.topkWeights) },
    srcRank: { dtype: 'int32', shape: [rows], ptr: at(layout.srcRank) },
    srcToken: { dtype: 'int32', shape: [rows], ptr: at(layout.srcToken) },
  };
  return { rank, inputs, next, freed, transitions, views, buffer };
}

const tensorOf = (t: unknown) => {
  const d = t as DeviceTensor;
  return { dtype: d.dtype, shape: d.shape, ptr: d.ptr };
};

describe('device dispatch results (JS side, native stub)', () => {
  test.each([false, true])('outputsInBuffer (fp8 %s): the buffer views, the scratch counts in a fresh array, a new frozen handle each call', async (fp8) => {
    const { rank, inputs, next, freed, transitions, views } = setup(fp8);
    next.numRecv = -1;
    const first = await rank.dispatch(inputs, { outputsInBuffer: true });
    expect(Object.keys(first)).toEqual([...Object.keys(views), 'numRecv', 'tokensPerExpert', 'handle', 'free']);
    for (const k of Object.keys(views) as Array<keyof typeof views>) expect(tensorOf(first[k as 'x'])).toEqual(views[k]);
    expect(first.numRecv).toBeNull();
    expect(first.tokensPerExpert).toBeNull();
    expect(first.handle).toEqual({ group: 'g', rank: 0, id: 1, seq: 1, numTokens: 8, numRecv: -1 });
    expect(Object.isFrozen(first.handle)).toBe(true);
    expect(transitions()).toEqual([
      { from: 'ready', to: 'dispatching.running', event: 'DISPATCH' },
      { from: 'dispatching.running', to: 'ready', event: 'DONE', phases: ['notify', 'data'] },
    ]);

    next.numRecv = 10;
    const results = [];
    for (let i = 0; i < 3; i++) {
      next.counts = next.counts.map((c) => c + i);
      const r = await rank.dispatch({ x: inputs.x, scales: inputs.scales, handle: first.handle }, { outputsInBuffer: true });
      expect(r.numRecv).toBe(10);
      expect(r.tokensPerExpert).toEqual(next.counts);
      expect(Array.isArray(r.tokensPerExpert)).toBe(true);
      expect(r.handle).toEqual({ group: 'g', rank: 0, id: 1, seq: 2 + i, numTokens: 8, numRecv: 10 });
      expect(Object.isFrozen(r.handle)).toBe(true);
      results.push(r);
    }
    const [a, b] = results as [(typeof results)[0], (typeof results)[0]];
    expect(a.tokensPerExpert).not.toBe(b.tokensPerExpert);
    a.tokensPerExpert![0] = -5;  // the caller's own array: the next result is not touched
    expect(b.tokensPerExpert![0]).not.toBe(-5);
    expect(a.handle).not.toBe(b.handle);
    expect(a.x).toBe(b.x);  // the same views every call
    a.free();
    expect(freed).toEqual([]);
    expect(tensorOf(a.x)).toEqual(views.x);  // free() of a result in the buffer forgets nothing
    expect(transitions()).toEqual(Array.from({ length: 3 }, () => [
      { from: 'ready', to: 'dispatching.running', event: 'DISPATCH' },
      { from: 'dispatching.running', to: 'ready', event: 'DONE', phases: ['data'] },
    ]).flat());

    // a copy of a live handle is refused; the handle itself combines
    const copy = { ...b.handle } as DispatchHandle;
    await expect(rank.dispatch({ x: inputs.x, scales: inputs.scales, handle: copy }, { outputsInBuffer: true })).rejects.toMatchObject({ code: 'EINVAL' });
    const y = new DeviceTensor(null as never, 'bf16', [10, 256], 1n << 33n, false);
    await expect(rank.combine({ x: y, handle: copy })).rejects.toThrow(/^input\.handle: is not a handle a dispatch of rank 0 returned/);
    expect(transitions()).toEqual([]);
    await rank.combine({ x: y, handle: b.handle }, { out: { x: new DeviceTensor(null as never, 'bf16', [8, 256], 1n << 34n, false), topkWeights: new DeviceTensor(null as never, 'fp32', [8, 4], 1n << 35n, false) } });
    expect(transitions()).toEqual([
      { from: 'ready', to: 'combining', event: 'COMBINE' },
      { from: 'combining', to: 'ready', event: 'DONE' },
    ]);
  });

  test('allocated outputs: new device tensors of the received rows; free() frees those and only those', async () => {
    const { rank, inputs, next, freed, buffer } = setup(false);
    next.numRecv = 12;
    const r = await rank.dispatch(inputs);
    expect(Object.keys(r)).toEqual(['x', 'topkIdx', 'topkWeights', 'srcRank', 'srcToken', 'numRecv', 'tokensPerExpert', 'handle', 'free']);
    expect([r.x, r.topkIdx, r.topkWeights, r.srcRank, r.srcToken].map(tensorOf)).toEqual([
      { dtype: 'bf16', shape: [12, buffer.hidden], ptr: 0x1000n },
      { dtype: 'int32', shape: [12, buffer.topk], ptr: 0x3000n },
      { dtype: 'fp32', shape: [12, buffer.topk], ptr: 0x4000n },
      { dtype: 'int32', shape: [12], ptr: 0x5000n },
      { dtype: 'int32', shape: [12], ptr: 0x6000n },
    ]);
    expect(r.tokensPerExpert).toEqual(next.counts);
    r.free();
    expect(freed).toEqual([0x1000n, 0x3000n, 0x4000n, 0x5000n, 0x6000n]);
  });
});
