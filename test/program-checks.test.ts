// Rank programs skip the main thread, so the rank checks their inputs itself: EINVAL naming the
// argument, and the rank stays ready for the next call.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { createGroup, type Group } from '../actors/index.js';

const program = new URL('./fixtures/programs/bad-input.mjs', import.meta.url);
let group: Group;
beforeAll(async () => {
  group = await createGroup({ ranks: 2, backend: 'host', buffer: { maxTokensPerRank: 4, hidden: 128, topk: 2, numExperts: 8 } });
});
afterAll(() => group.destroy());

describe('rank-program input checks', () => {
  it.each([
    ['barrier', /^withCpuSync: must be a boolean/],
    ['allGather', /^input\.data: has 2 elements/],
    ['dispatch', /^input\.topkIdx\[0\]: 99 is outside \[0, 8\)/],
    ['engramFetch', /^indices: must be a Int32Array/],
    ['ppExchange', /^input\.data: must be a Int32Array/],
    ['openSession', /^maxBytes: must be a positive integer/],
    ['openSessionArray', /^options: must be an object \{ maxBytes, maxAllGathers \}/],
    ['barrierNumber', /^options: must be \{ withCpuSync\? \}/],
    // A key no option is named is refused, with the nearest known one, not ignored.
    ['barrierKey', /^options\.withCpuSnc: is not an option \(did you mean 'withCpuSync'\?\); options takes withCpuSync$/],
    ['dispatchKey', /^input\.expertAlignmnt: is not an option \(did you mean 'expertAlignment'\?\)/],
    ['engramFetchKey', /^options\.asynk: is not an option \(did you mean 'async'\?\)/],
    ['openSessionKey', /^options\.maxAllGather: is not an option \(did you mean 'maxAllGathers'\?\)/],
    ['tensorDtype', /^dtype: must be one of bf16, fp32, fp8e4m3, int32 \(got "float16"\)/],
    ['tensorLength', /^data: has 3 elements; shape \[2, 2\] needs 4/],
  ])('%s with a bad argument is EINVAL naming it, and the ranks stay ready', async (call, message) => {
    const answers = await group.run<{ code?: string; message?: string }>(program, { call });
    for (const a of answers) expect(a).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(message) });
    expect(group.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
    await group.barrier();
  });
});

describe('session slots', () => {
  it('refuses the collective past maxAllGathers on the main thread with EINVAL naming maxAllGathers', async () => {
    const s = await group.openSession({ maxBytes: 64, maxAllGathers: 1 });
    const t = { dtype: 'fp32' as const, shape: [2], data: new Float32Array(2) };
    await s.allGather([t, t]);
    await expect(s.allGather([t, t])).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^maxAllGathers: this session allows 1/) });
    expect(group.snapshot().map((x) => x.state)).toEqual(['session.open', 'session.open']);
    await s.close();
  });
});
