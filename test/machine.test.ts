/**
 * The rank machine alone (machines/rank.ts): no worker, no addon. The test plays the worker: it sends
 * an op's event, and DONE / FAILED for its end, and checks where the machine goes and what it
 * refuses. One op is one transition in and one out; a dispatch's CPU sync is a state only while it lasts.
 */
import { describe, expect, test } from 'vitest';
import { createActor } from 'xstate';

import { rankMachine, statePath, type FailureInfo, type RankEvent } from '../machines/index.js';

function rank(input = { rank: 2, cpuSeconds: 7, gpuSeconds: 3 }) {
  const actor = createActor(rankMachine, { input });
  const paths: string[] = [];
  actor.subscribe((s) => {
    const p = statePath(s.value);
    if (paths[paths.length - 1] !== p) paths.push(p);
  });
  actor.start();
  return {
    actor,
    paths,
    state: () => statePath(actor.getSnapshot().value),
    context: () => actor.getSnapshot().context,
    send: (e: RankEvent) => actor.send(e),
    /** whether the machine takes `e` now (what the worker asks before it runs an op) */
    takes: (e: RankEvent) => actor.getSnapshot().can(e),
  };
}
type Rank = ReturnType<typeof rank>;

function ready(): Rank {
  const r = rank();
  r.send({ type: 'REGISTER' });
  r.send({ type: 'DONE' });
  return r;
}

const einval: FailureInfo = { code: 'EINVAL', message: 'x: bad' };
const timeout: FailureInfo = { code: 'TIMEOUT_GPU', message: 'device-phase wait of rank 2 timed out', rank: 1, phase: 'barrier' };

describe('lifecycle', () => {
  test('starts in init with the timeouts it was given, or 300 s CPU and 100 s GPU', () => {
    expect(rank().state()).toBe('init');
    expect(rank().context()).toMatchObject({ rank: 2, cpuSeconds: 7, gpuSeconds: 3, seq: 0, op: null, error: null });
    const d = createActor(rankMachine, { input: { rank: 0 } }).start();
    expect(d.getSnapshot().context).toMatchObject({ cpuSeconds: 300, gpuSeconds: 100 });
  });

  test('REGISTER -> registerWindow -> ready on DONE; a failed registration fails the rank', () => {
    const r = rank();
    r.send({ type: 'REGISTER' });
    expect(r.state()).toBe('registerWindow');
    r.send({ type: 'DONE' });
    expect(r.state()).toBe('ready');
    const f = rank();
    f.send({ type: 'REGISTER' });
    f.send({ type: 'FAILED', error: timeout });
    expect(f.state()).toBe('failed');
    expect(f.context().error).toEqual(timeout);
  });

  test('DESTROY ends destroyed from init, ready, an open session and failed; destroyed is final', () => {
    for (const setup of [
      (r: Rank) => r,
      (r: Rank) => (r.send({ type: 'REGISTER' }), r.send({ type: 'DONE' }), r),
      (r: Rank) => (r.send({ type: 'REGISTER' }), r.send({ type: 'DONE' }), r.send({ type: 'SESSION_OPEN' }), r.send({ type: 'DONE' }), r),
      (r: Rank) => (r.send({ type: 'REGISTER' }), r.send({ type: 'FAILED', error: timeout }), r),
    ]) {
      const r = setup(rank());
      r.send({ type: 'DESTROY' });
      expect(r.state()).toBe('destroying');
      r.send({ type: 'DONE' });
      expect(r.state()).toBe('destroyed');
      expect(r.actor.getSnapshot().status).toBe('done');
    }
  });

  test('a destroy that throws still ends destroyed', () => {
    const r = ready();
    r.send({ type: 'DESTROY' });
    r.send({ type: 'FAILED', error: timeout });
    expect(r.state()).toBe('destroyed');
  });
});

describe('operations', () => {
  const OPS: Array<[RankEvent, string]> = [
    [{ type: 'BARRIER', withCpuSync: false }, 'barrier'],
    [{ type: 'BARRIER', withCpuSync: true }, 'barrier'],
    [{ type: 'ALL_GATHER' }, 'allGathering'],
    [{ type: 'DISPATCH' }, 'dispatching.running'],
    [{ type: 'COMBINE' }, 'combining'],
    [{ type: 'ENGRAM_WRITE' }, 'engram.writing'],
    [{ type: 'ENGRAM_FETCH' }, 'engram.fetching'],
    [{ type: 'PP_EXCHANGE' }, 'pipeline'],
    [{ type: 'REPLAY', ops: 2 }, 'replaying'],
  ];
  for (const [event, state] of OPS) {
    test(`${event.type}: ready -> ${state} -> ready, one transition in and one out`, () => {
      const r = ready();
      const before = r.paths.length;
      r.send(event);
      expect(r.state()).toBe(state);
      expect(r.context().op).not.toBeNull();
      r.send({ type: 'DONE', phases: ['device'] });
      expect(r.state()).toBe('ready');
      expect(r.paths.slice(before)).toEqual([state, 'ready']);
      expect(r.context().op).toBeNull();
    });
  }

  test('a dispatch whose CPU sync waits shows dispatching.cpuSync only while it waits', () => {
    const r = ready();
    r.send({ type: 'DISPATCH' });
    r.send({ type: 'WAITING' });
    expect(r.state()).toBe('dispatching.cpuSync');
    r.send({ type: 'DONE' });
    expect(r.state()).toBe('ready');
    expect(r.paths.slice(-3)).toEqual(['dispatching.running', 'dispatching.cpuSync', 'ready']);
  });

  test('a session: open -> gathering / reducing -> open, outside ops refused, close -> ready', () => {
    const r = ready();
    r.send({ type: 'SESSION_OPEN' });
    expect(r.state()).toBe('session.opening');
    r.send({ type: 'DONE' });
    expect(r.state()).toBe('session.open');
    expect(r.takes({ type: 'BARRIER', withCpuSync: false })).toBe(false);
    expect(r.takes({ type: 'DISPATCH' })).toBe(false);
    r.send({ type: 'SESSION_ALL_GATHER' });
    expect(r.state()).toBe('session.gathering');
    r.send({ type: 'DONE' });
    r.send({ type: 'SESSION_REDUCE_SCATTER' });
    expect(r.state()).toBe('session.reducing');
    r.send({ type: 'FAILED', error: einval });  // a refused collective leaves the session open
    expect(r.state()).toBe('session.open');
    r.send({ type: 'SESSION_CLOSE' });
    r.send({ type: 'DONE' });
    expect(r.state()).toBe('ready');
    expect(r.takes({ type: 'SESSION_ALL_GATHER' })).toBe(false);
  });

  test('seq counts collectives, one per started operation and a replay\'s ops; REGISTER and DESTROY count none', () => {
    const r = ready();
    expect(r.context().seq).toBe(0);
    r.send({ type: 'BARRIER', withCpuSync: true });
    r.send({ type: 'DONE' });
    r.send({ type: 'DISPATCH' });
    r.send({ type: 'DONE' });
    r.send({ type: 'REPLAY', ops: 3 });
    r.send({ type: 'DONE' });
    expect(r.context().seq).toBe(5);
    r.send({ type: 'DESTROY' });
    expect(r.context().seq).toBe(5);
  });

  test('an op is taken only from its state: nothing but REGISTER or DESTROY from init, no second op during one', () => {
    const r = rank();
    expect(r.takes({ type: 'BARRIER', withCpuSync: false })).toBe(false);
    expect(r.takes({ type: 'DONE' })).toBe(false);
    r.send({ type: 'REGISTER' });
    r.send({ type: 'DONE' });
    r.send({ type: 'COMBINE' });
    expect(r.takes({ type: 'DISPATCH' })).toBe(false);
    expect(r.takes({ type: 'DESTROY' })).toBe(false);
    expect(r.takes({ type: 'WAITING' })).toBe(false);
  });
});

describe('failures', () => {
  test('EINVAL from an op is a refusal: back where it came from, the rank usable', () => {
    const r = ready();
    r.send({ type: 'DISPATCH' });
    r.send({ type: 'FAILED', error: einval });
    expect(r.state()).toBe('ready');
    expect(r.context().error).toBeNull();
  });

  test('BACKEND_UNAVAILABLE from an op is a refusal too (an op this backend does not run in this world): the rank usable', () => {
    const r = ready();
    r.send({ type: 'BARRIER', withCpuSync: false });
    r.send({ type: 'DONE' });
    r.send({ type: 'DISPATCH' });
    r.send({ type: 'FAILED', error: { code: 'BACKEND_UNAVAILABLE', message: "dispatch does not run across nodes on backend 'cuda' yet" } });
    expect(r.state()).toBe('ready');
    expect(r.context()).toMatchObject({ error: null, seq: 1 });
    r.send({ type: 'SESSION_OPEN' });
    r.send({ type: 'FAILED', error: { code: 'BACKEND_UNAVAILABLE', message: "session open does not run across nodes on backend 'cuda' yet" } });
    expect(r.state()).toBe('ready');
  });

  test('a refusal gives the op\'s number back, unless the native side says it took it (a kernel refused the op)', () => {
    const r = ready();
    r.send({ type: 'BARRIER', withCpuSync: false });
    r.send({ type: 'DONE' });
    expect(r.context().seq).toBe(1);
    r.send({ type: 'DISPATCH' });
    expect(r.context().seq).toBe(2);
    r.send({ type: 'FAILED', error: einval });  // refused before it launched: no number taken
    expect(r.context().seq).toBe(1);
    r.send({ type: 'DISPATCH' });
    r.send({ type: 'FAILED', error: einval, seq: 2 });  // refused by the kernel: the op ran with #2
    expect(r.state()).toBe('ready');
    expect(r.context().seq).toBe(2);
    r.send({ type: 'COMBINE' });
    expect(r.context().seq).toBe(3);
  });

  test('any other error fails the rank and keeps the error', () => {
    const r = ready();
    r.send({ type: 'BARRIER', withCpuSync: false });
    r.send({ type: 'FAILED', error: timeout });
    expect(r.state()).toBe('failed');
    expect(r.context().error).toEqual(timeout);
    expect(r.takes({ type: 'BARRIER', withCpuSync: false })).toBe(false);
  });

  test('PEER_FAILED fails the rank from any live state; a later one does not replace the first error', () => {
    const r = ready();
    r.send({ type: 'ALL_GATHER' });
    r.send({ type: 'PEER_FAILED', error: { code: 'RANK_FAILED', message: 'rank 1 failed', rank: 1 } });
    expect(r.state()).toBe('failed');
    r.send({ type: 'PEER_FAILED', error: { code: 'RANK_FAILED', message: 'rank 3 failed', rank: 3 } });
    expect(r.context().error?.rank).toBe(1);
  });

  test('PEER_FAILED while destroying changes nothing; the rank still ends destroyed', () => {
    const r = ready();
    r.send({ type: 'DESTROY' });
    r.send({ type: 'PEER_FAILED', error: { code: 'RANK_FAILED', message: 'rank 1 failed', rank: 1 } });
    expect(r.state()).toBe('destroying');
    r.send({ type: 'DONE' });
    expect(r.state()).toBe('destroyed');
  });
});

describe("a run's release and the group's recovery", () => {
  const release: FailureInfo = { code: 'ABORTED', message: "rank 1's program threw: TypeError: boom (rank 2 was released from barrier, collective #4)", rank: 1, phase: 'barrier' };

  test.each([
    ['barrier', { type: 'BARRIER', withCpuSync: false } as RankEvent, 'barrier'],
    ['dispatch (its CPU sync)', { type: 'DISPATCH' } as RankEvent, 'dispatching.cpuSync'],
    ['a session open', { type: 'SESSION_OPEN' } as RankEvent, 'session.opening'],
  ])('an op released in %s (FAILED with ABORTED) ends in released, not failed; it refuses every op until RECOVER', (_, event, inOp) => {
    const r = ready();
    r.send(event);
    if (inOp === 'dispatching.cpuSync') r.send({ type: 'WAITING' });
    expect(r.state()).toBe(inOp);
    r.send({ type: 'FAILED', error: release });
    expect(r.state()).toBe('released');
    expect(r.context()).toMatchObject({ error: release, op: null });
    for (const e of [{ type: 'BARRIER', withCpuSync: false }, { type: 'DISPATCH' }, { type: 'SESSION_OPEN' }, { type: 'ENGRAM_FETCH' }] as RankEvent[]) expect(r.takes(e)).toBe(false);
    r.send({ type: 'RECOVER', seq: 9 });
    expect(r.state()).toBe('recovering');
    r.send({ type: 'DONE' });
    expect(r.state()).toBe('ready');
    expect(r.context()).toMatchObject({ seq: 9, seqBefore: 9, error: null, op: null, inflight: { gather: 0, reduce: 0, fetch: 0 } });
  });

  test('RECOVER also from ready, an open session, and with async ops in flight (what a program left); not in the middle of an op', () => {
    const fromReady = ready();
    fromReady.send({ type: 'RECOVER', seq: 3 });
    expect(fromReady.paths.slice(-1)).toEqual(['recovering']);
    const inSession = ready();
    inSession.send({ type: 'SESSION_OPEN' });
    inSession.send({ type: 'DONE' });
    inSession.send({ type: 'SESSION_ALL_GATHER' });
    inSession.send({ type: 'ISSUED', kind: 'gather' });
    expect(inSession.state()).toBe('session.gathering');
    inSession.send({ type: 'RECOVER', seq: 5 });
    inSession.send({ type: 'DONE' });
    expect(inSession.state()).toBe('ready');
    expect(inSession.context().inflight).toEqual({ gather: 0, reduce: 0, fetch: 0 });
    const busy = ready();
    busy.send({ type: 'BARRIER', withCpuSync: false });
    expect(busy.takes({ type: 'RECOVER', seq: 1 })).toBe(false);
  });

  test("a peer's failure replaces a release as the rank's error; a failed rank cannot be recovered", () => {
    const r = ready();
    r.send({ type: 'BARRIER', withCpuSync: false });
    r.send({ type: 'FAILED', error: release });
    r.send({ type: 'PEER_FAILED', error: timeout });
    expect(r.state()).toBe('failed');
    expect(r.context().error).toEqual(timeout);
    expect(r.takes({ type: 'RECOVER', seq: 1 })).toBe(false);
    const own = ready();
    own.send({ type: 'BARRIER', withCpuSync: false });
    own.send({ type: 'FAILED', error: timeout });
    own.send({ type: 'PEER_FAILED', error: release });
    expect(own.context().error).toEqual(timeout);
  });

  test('a recovery that fails fails the rank', () => {
    const r = ready();
    r.send({ type: 'RECOVER', seq: 2 });
    r.send({ type: 'FAILED', error: timeout });
    expect(r.state()).toBe('failed');
  });
});
