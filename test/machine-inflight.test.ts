/**
 * The rank machine with asynchronous ops (machines/rank.ts, no worker): an op issued with
 * { async: true } ends its pass with ISSUED and keeps the rank in its state until COMPLETED; while
 * only in-flight ops hold it there, the state takes what its home state takes (the session's
 * collectives; outside a session every ready op but SESSION_OPEN and ENGRAM_WRITE).
 */
import { describe, expect, test } from 'vitest';
import { createActor } from 'xstate';

import { rankMachine, statePath, type FailureInfo, type RankEvent } from '../machines/index.js';

function ready() {
  const actor = createActor(rankMachine, { input: { rank: 0 } });
  const paths: string[] = [];
  actor.subscribe((s) => {
    const p = statePath(s.value);
    if (paths[paths.length - 1] !== p) paths.push(p);
  });
  actor.start();
  actor.send({ type: 'REGISTER' });
  actor.send({ type: 'DONE' });
  return {
    paths,
    state: () => statePath(actor.getSnapshot().value),
    context: () => actor.getSnapshot().context,
    send: (e: RankEvent) => actor.send(e),
    takes: (e: RankEvent) => actor.getSnapshot().can(e),
  };
}

const einval: FailureInfo = { code: 'EINVAL', message: 'x: bad' };
const timeout: FailureInfo = { code: 'TIMEOUT_GPU', message: 'timed out', rank: 1 };

function inSession() {
  const r = ready();
  r.send({ type: 'SESSION_OPEN' });
  r.send({ type: 'DONE' });
  return r;
}

describe('session collectives in flight', () => {
  test('ISSUED keeps session.gathering until COMPLETED; meanwhile close is refused, collectives are taken', () => {
    const r = inSession();
    r.send({ type: 'SESSION_ALL_GATHER' });
    r.send({ type: 'ISSUED', kind: 'gather' });
    expect(r.state()).toBe('session.gathering');
    expect(r.context()).toMatchObject({ op: null, inflight: { gather: 1, reduce: 0, fetch: 0 } });
    expect(r.takes({ type: 'SESSION_CLOSE' })).toBe(false);
    expect(r.takes({ type: 'BARRIER', withCpuSync: false })).toBe(false);
    // a second async allGather, then a synchronous reduceScatter: reducing, back to gathering
    r.send({ type: 'SESSION_ALL_GATHER' });
    r.send({ type: 'ISSUED', kind: 'gather' });
    r.send({ type: 'SESSION_REDUCE_SCATTER' });
    expect(r.state()).toBe('session.reducing');
    expect(r.takes({ type: 'SESSION_ALL_GATHER' })).toBe(false); // an op runs: nothing else
    r.send({ type: 'DONE' });
    expect(r.state()).toBe('session.gathering');
    r.send({ type: 'COMPLETED', kind: 'gather' });
    expect(r.state()).toBe('session.gathering');
    r.send({ type: 'COMPLETED', kind: 'gather' });
    expect(r.state()).toBe('session.open');
    expect(r.context().inflight.gather).toBe(0);
    expect(r.context().seq).toBe(4); // open + 3 collectives
    r.send({ type: 'SESSION_CLOSE' });
    r.send({ type: 'DONE' });
    expect(r.state()).toBe('ready');
  });

  test('with both kinds in flight the state follows what is left; a refusal goes back to it', () => {
    const r = inSession();
    r.send({ type: 'SESSION_REDUCE_SCATTER' });
    r.send({ type: 'ISSUED', kind: 'reduce' });
    r.send({ type: 'SESSION_ALL_GATHER' });
    r.send({ type: 'ISSUED', kind: 'gather' });
    expect(r.state()).toBe('session.gathering');
    r.send({ type: 'SESSION_ALL_GATHER' });
    r.send({ type: 'FAILED', error: einval });
    expect(r.state()).toBe('session.gathering');
    r.send({ type: 'COMPLETED', kind: 'gather' });
    expect(r.state()).toBe('session.reducing');
    r.send({ type: 'COMPLETED', kind: 'reduce' });
    expect(r.state()).toBe('session.open');
    expect(r.paths.slice(-5)).toEqual(['session.open', 'session.reducing', 'session.gathering', 'session.reducing', 'session.open']);
  });

  test('a wait that fails (FAILED, not EINVAL) fails the rank; DESTROY is taken while only in-flight ops hold it', () => {
    const r = inSession();
    r.send({ type: 'SESSION_ALL_GATHER' });
    r.send({ type: 'ISSUED', kind: 'gather' });
    expect(r.takes({ type: 'DESTROY' })).toBe(true);
    r.send({ type: 'FAILED', error: timeout });
    expect(r.state()).toBe('failed');
    expect(r.context().error).toEqual(timeout);
  });
});

describe('engram fetches in flight', () => {
  test('engram.fetching while fetches are in flight; other ops run and come back to it; COMPLETED of the last one -> ready', () => {
    const r = ready();
    r.send({ type: 'ENGRAM_FETCH' });
    r.send({ type: 'ISSUED', kind: 'fetch' });
    r.send({ type: 'ENGRAM_FETCH' });
    r.send({ type: 'ISSUED', kind: 'fetch' });
    expect(r.state()).toBe('engram.fetching');
    expect(r.context().inflight.fetch).toBe(2);
    for (const [e, s] of [
      [{ type: 'BARRIER', withCpuSync: true }, 'barrier'], [{ type: 'DISPATCH' }, 'dispatching.running'], [{ type: 'COMBINE' }, 'combining'],
      [{ type: 'ALL_GATHER' }, 'allGathering'], [{ type: 'PP_EXCHANGE' }, 'pipeline'], [{ type: 'REPLAY', ops: 1 }, 'replaying'], [{ type: 'ENGRAM_FETCH' }, 'engram.fetching'],
    ] as Array<[RankEvent, string]>) {
      r.send(e);
      expect(r.state()).toBe(s);
      r.send({ type: 'DONE' });
      expect(r.state()).toBe('engram.fetching');
    }
    r.send({ type: 'DISPATCH' });
    r.send({ type: 'FAILED', error: einval });
    expect(r.state()).toBe('engram.fetching');
    expect(r.takes({ type: 'SESSION_OPEN' })).toBe(false);
    expect(r.takes({ type: 'ENGRAM_WRITE' })).toBe(false);
    r.send({ type: 'COMPLETED', kind: 'fetch' });
    expect(r.state()).toBe('engram.fetching');
    r.send({ type: 'COMPLETED', kind: 'fetch' });
    expect(r.state()).toBe('ready');
    expect(r.takes({ type: 'SESSION_OPEN' })).toBe(true);
  });

  test('a synchronous fetch is one pass as before: engram.fetching -> ready', () => {
    const r = ready();
    r.send({ type: 'ENGRAM_FETCH' });
    expect(r.takes({ type: 'BARRIER', withCpuSync: false })).toBe(false);
    r.send({ type: 'DONE' });
    expect(r.state()).toBe('ready');
  });
});
