/**
 * The handle registry (actors/core/handles.ts) keeps exactly the MAX_LIVE_HANDLES most recently used
 * handles, as the native side does: checked against a plain array model (least recently used first;
 * add appends a new handle and drops the first past the cap, a use moves a live handle to the end,
 * an add of a live handle or a use of a dead one changes nothing), after every step of random
 * sequences of adds and uses, and through checkHandle (a use of a live handle, EINVAL for a dead one).
 */
import { describe, expect, test } from 'vitest';

import { HandleRegistry, MAX_LIVE_HANDLES } from '../actors/core/handles.js';
import { checkHandle, type DispatchHandle } from '../actors/core/validate.js';
import { prng } from './helpers/moe-reference.js';

const handle = (id: number): DispatchHandle => Object.freeze({ group: 'g', rank: 0, id, seq: id, numTokens: 1, numRecv: 1 });

class Model {
  live: DispatchHandle[] = [];
  add(h: DispatchHandle): void {
    if (this.live.includes(h)) return;
    this.live.push(h);
    if (this.live.length > MAX_LIVE_HANDLES) this.live.shift();
  }
  touch(h: DispatchHandle): boolean {
    const i = this.live.indexOf(h);
    if (i < 0) return false;
    this.live.splice(i, 1);
    this.live.push(h);
    return true;
  }
}

describe('handle registry: least recently used out', () => {
  test('a handle used before the 257th add stays; the oldest unused one goes', () => {
    const reg = new HandleRegistry();
    const hs = Array.from({ length: MAX_LIVE_HANDLES + 2 }, (_, i) => handle(i));
    for (const h of hs.slice(0, MAX_LIVE_HANDLES)) reg.add(h);
    expect(hs.slice(0, MAX_LIVE_HANDLES).every((h) => reg.has(h))).toBe(true);
    expect(reg.touch(hs[0]!)).toBe(true);
    reg.add(hs[MAX_LIVE_HANDLES]!);
    expect(reg.has(hs[0])).toBe(true);
    expect(reg.has(hs[1])).toBe(false);
    expect(reg.touch(hs[1]!)).toBe(false);  // a dead handle stays dead
    expect(reg.has(hs[1])).toBe(false);
    reg.add(hs[MAX_LIVE_HANDLES + 1]!);
    expect(reg.has(hs[2])).toBe(false);
    expect(reg.has(hs[0])).toBe(true);
    expect(reg.has({ ...hs[0]! })).toBe(false);
    expect(reg.has(null)).toBe(false);
    expect(reg.has(7)).toBe(false);
  });

  test.each([1, 2, 3])('random adds and uses (seed %i): the live set after every step is the model\'s', (seed) => {
    const rng = prng(seed);
    const pool = Array.from({ length: 700 }, (_, i) => handle(i));
    const reg = new HandleRegistry();
    const model = new Model();
    let next = 0;
    for (let step = 0; step < 6000; step++) {
      const u = rng();
      if (u < 0.3 && next < pool.length) {
        const h = pool[next++]!;
        reg.add(h);
        model.add(h);
      } else if (u < 0.35 && next > 0) {
        const h = pool[Math.floor(rng() * next)]!;  // an add of an old handle, live or not
        reg.add(h);
        model.add(h);
      } else if (next > 0) {
        // mostly recent handles (as a model's layers use theirs), sometimes any handle made so far
        const back = u < 0.9 ? Math.floor(rng() * Math.min(next, 300)) : Math.floor(rng() * next);
        const h = pool[next - 1 - back]!;
        expect(reg.touch(h)).toBe(model.touch(h));
      }
      if (step % 50 === 0 || step > 5900) expect(pool.filter((h) => reg.has(h))).toEqual(pool.filter((h) => model.live.includes(h)));
    }
    // the order too: adding MAX new handles pushes the live ones out oldest first
    for (const h of [...model.live]) {
      const fresh = handle(-1 - next++);
      reg.add(fresh);
      model.add(fresh);
      expect(reg.has(h)).toBe(false);
      expect(pool.filter((p) => reg.has(p))).toEqual(pool.filter((p) => model.live.includes(p)));
    }
  });

  test('checkHandle: a live handle passes and becomes the most recently used; an expired one is EINVAL and moves nothing', () => {
    const reg = new HandleRegistry();
    const hs = Array.from({ length: MAX_LIVE_HANDLES + 1 }, (_, i) => handle(i));
    for (const h of hs.slice(0, MAX_LIVE_HANDLES)) reg.add(h);
    checkHandle('input.handle', hs[0], 0, 'g', reg);
    reg.add(hs[MAX_LIVE_HANDLES]!);
    expect(reg.has(hs[0])).toBe(true);
    expect(() => checkHandle('input.handle', hs[1], 0, 'g', reg)).toThrow(/^input\.handle: is not a handle a dispatch of rank 0 returned .*expired/);
    expect(() => checkHandle('input.handle', { ...hs[0]! }, 0, 'g', reg)).toThrow(/a copy or a made-up object/);
    expect(hs.filter((h) => reg.has(h)).map((h) => h.id)).toEqual([0, ...hs.slice(2).map((h) => h.id)]);
  });
});
