// Interop with the application's own GPU work (workers/interop.ts): on host every method is EINVAL
// saying it needs backend 'cuda', and the rank stays ready; the checks of wrapDevice that come before
// the GPU (address, alignment, dtype, shape) and that rankflow never frees external memory, against a
// stand-in for the rank's native memory. The GPU side is test/gpu/interop.test.mjs.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { createGroup, DeviceTensor, RankflowError, type Group } from '../actors/index.js';
import { externalTensor, type ExternalMemory } from '../actors/core/device-tensor.js';

describe('interop methods on host', () => {
  let group: Group;
  beforeAll(async () => {
    group = await createGroup({ ranks: 2, backend: 'host', buffer: { maxTokensPerRank: 4, hidden: 128, topk: 2, numExperts: 8 } });
  });
  afterAll(() => group.destroy());

  it("are EINVAL naming the method and backend 'cuda' (every cuda-only method of the rank handle); the ranks stay ready", async () => {
    const answers = await group.run<Record<string, { code?: string; message?: string; ok?: boolean }>>(
      new URL('./fixtures/programs/interop-host.mjs', import.meta.url));
    for (const a of answers) {
      for (const name of ['cudaStream', 'cudaContext', 'wrapDevice', 'waitEvent', 'recordEvent', 'sync', 'elapsedMs', 'destroyEvent', 'timeIt',
        'benchAlltoAll', 'benchPeerCopy', 'benchAgrs', 'lastOpDeviceMs', 'timeOps', 'occupySms', 'capture']) {
        expect(a[name], name).toEqual({ code: 'EINVAL', message: `${name}: needs backend 'cuda' (device tensors, streams and CUDA events)` });
      }
    }
    expect(group.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
  });
});

/** The rank's native memory, recording what externalTensor asks of it. */
function fakeMemory(refuse?: string) {
  const calls: Array<[string, ...unknown[]]> = [];
  const mem: ExternalMemory = {
    deviceAlloc: (bytes) => (calls.push(['alloc', bytes]), 0x1000n),
    deviceFree: (ptr) => void calls.push(['free', ptr]),
    deviceUpload: (ptr, data) => void calls.push(['upload', ptr, data.byteLength]),
    deviceZero: (ptr, bytes) => void calls.push(['zero', ptr, bytes]),
    deviceDownload: (ptr, bytes) => (calls.push(['download', ptr, bytes]), new Uint8Array(bytes)),
    deviceCheck: (ptr, bytes) => {
      calls.push(['check', ptr, bytes]);
      if (refuse) throw Object.assign(new Error(refuse), { code: 'EINVAL' });
    },
  };
  return { mem, calls };
}

describe('wrapDevice checks (externalTensor)', () => {
  const ptr = 0x7f00_0000_0100n;

  it('checks the whole byte range with the native side and wraps it', () => {
    const { mem, calls } = fakeMemory();
    const t = externalTensor(mem, ptr, 'bf16', [3, 128]);
    expect(t).toBeInstanceOf(DeviceTensor);
    expect([t.dtype, t.shape, t.bytes, t.ptr]).toEqual(['bf16', [3, 128], 768, ptr]);
    expect(calls).toEqual([['check', ptr, 768]]);
  });

  it('never frees the memory; free() lets go of the owner and forgets the address', () => {
    const { mem, calls } = fakeMemory();
    const owner = { name: 'the application buffer' };
    const t = externalTensor(mem, ptr, 'fp32', [8], { owner });
    expect(Reflect.get(t, 'owner')).toBe(owner);
    t.free();
    t.free();
    expect(Reflect.get(t, 'owner')).toBeUndefined();
    expect(calls.filter((c) => c[0] === 'free')).toEqual([]);
    expect(() => t.ptr).toThrow(/freed/);
  });

  it.each([
    ['a number', 0x7f0000000100, /^ptr: must be a device address as a BigInt/],
    ['0n', 0n, /^ptr: must be a device address/],
    ['a negative BigInt', -16n, /^ptr: must be a device address/],
    ['2^64', 1n << 64n, /^ptr: must be a device address/],
    ['an address not 16-byte aligned', ptr + 8n, /^ptr: 0x7f0000000108 is not 16-byte aligned/],
  ])('refuses %s as ptr with EINVAL, before asking the GPU', (_what, bad, message) => {
    const { mem, calls } = fakeMemory();
    expect(() => externalTensor(mem, bad, 'bf16', [1])).toThrow(expect.objectContaining({ code: 'EINVAL', message: expect.stringMatching(message) }));
    expect(calls).toEqual([]);
  });

  it('refuses a bad dtype, shape or options with EINVAL naming it', () => {
    const { mem } = fakeMemory();
    expect(() => externalTensor(mem, ptr, 'fp16' as never, [1])).toThrow(/^dtype: must be one of/);
    expect(() => externalTensor(mem, ptr, 'bf16', [2, -1])).toThrow(/^shape: must be a list of non-negative integers/);
    expect(() => externalTensor(mem, ptr, 'bf16', [2], null as never)).toThrow(/^options: must be \{ owner\? \}/);
  });

  it("passes on the native side's refusal as a RankflowError", () => {
    const { mem } = fakeMemory('wrapDevice: ptr 0x7f0000000100 is memory of GPU 1; this rank runs on GPU 0');
    let error: unknown;
    try {
      externalTensor(mem, ptr, 'bf16', [1]);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(RankflowError);
    expect(error).toMatchObject({ code: 'EINVAL', message: 'wrapDevice: ptr 0x7f0000000100 is memory of GPU 1; this rank runs on GPU 0' });
  });
});
