/**
 * The JS/native ABI has one source per number: TypeScript keeps literal copies (actors/core/addon.ts,
 * for its types and so that the hot path reads constants), the addon reports its own (addon.abi, made
 * from binding/context.hpp and kernels/protocol.hpp), and this test fails on any word that differs.
 * The phase names come from one list (RF_PHASES) for the enum, the errors and addon.abi.phases.
 */
import { describe, expect, test } from 'vitest';
import { ABORT, COMBINE_ARG, DISPATCH_ARG, DISPATCH_DEVICE_ALLOC, DISPATCH_HOST, DISPATCH_IN_BUFFER, DISPATCH_PENDING, SCRATCH, loadAddon } from '../actors/core/addon.js';
import { createGroup } from '../actors/index.js';

const abi = loadAddon().abi;

describe('the JS/native ABI', () => {
  test('scratch words, dispatch and combine argument words, dispatch modes', () => {
    expect(abi.scratch).toEqual({ ...SCRATCH });
    expect(abi.dispatchArg).toEqual({ ...DISPATCH_ARG });
    expect(abi.combineArg).toEqual({ ...COMBINE_ARG });
    expect(abi.dispatchModes).toEqual({ host: DISPATCH_HOST, deviceAlloc: DISPATCH_DEVICE_ALLOC, inBuffer: DISPATCH_IN_BUFFER, pending: DISPATCH_PENDING });
  });

  test('argument words are distinct and inside the args block; the scratch regions do not overlap', () => {
    for (const words of [Object.values(DISPATCH_ARG), Object.values(COMBINE_ARG)]) {
      expect(new Set(words).size).toBe(words.length);
      for (const w of words) expect(w).toBeLessThan(SCRATCH.tokensPerExpert - SCRATCH.args);
    }
    expect(SCRATCH.addresses + 8).toBeLessThanOrEqual(SCRATCH.args);
    expect(SCRATCH.graphOps).toBeLessThan(SCRATCH.addresses);
  });

  test('abort words: every index and offset (the native span is ABORT.span; ABORT.bytes is the page pair JS makes)', () => {
    const { span, bytes, ...words } = ABORT;
    const native = { ...abi.abortWords };
    expect(native.bytes).toBe(span);
    delete (native as Partial<typeof native>).bytes;
    expect(native).toEqual(words);
    expect(bytes).toBeGreaterThanOrEqual(span + 4096);
  });

  test('phase names: one per id, unique, "none" first', () => {
    expect(abi.phases[0]).toBe('none');
    expect(abi.phases.length).toBeGreaterThan(10);
    expect(new Set(abi.phases).size).toBe(abi.phases.length);
    for (const p of ['barrier', 'dispatch notify', 'combine data', 'allGather', 'session reduceScatter', 'scale-out connect']) expect(abi.phases).toContain(p);
  });

  test("a wait's error names its phase from that list (a barrier a peer never joins, host, 0.2 s)", async () => {
    await using g = await createGroup({ ranks: 2, backend: 'host', buffer: { maxTokensPerRank: 4, hidden: 128, topk: 1, numExperts: 2 }, timeouts: { cpuSeconds: 0.2 } });
    const lonely = new URL('./fixtures/abi-lonely-barrier.mjs', import.meta.url).href;
    const err = (await g.run(lonely, {}).catch((e: unknown) => e)) as { code: string; phase?: string; cause?: { code?: string; phase?: string } };
    const timeout = err.code === 'TIMEOUT_CPU' ? err : err.cause;
    expect(timeout).toMatchObject({ code: 'TIMEOUT_CPU', phase: 'barrier' });
    expect(abi.phases).toContain(timeout!.phase);
  });
});
