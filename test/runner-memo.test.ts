/**
 * The runner's memoised steps (workers/runner.ts) against the machine itself: the same sequence of
 * calls, as the op table makes them, through a runner that memoises and one with `inspect` (every
 * event to the xstate actor), must report the same transitions (from, to, event, op, seq) and leave
 * the same state and seq after every call: with and without ops in flight (sessions issuing and
 * completing asynchronous gathers and reduces, engram fetches issued before others complete).
 */
import { describe, expect, test } from 'vitest';

import { EVENTS, PHASES, RankRunner } from '../workers/runner.js';
import { TransitionDecoder } from '../workers/transition-log.js';
import type { TransitionEvent, WorkerMessage } from '../workers/protocol.js';

type Seen = Pick<TransitionEvent, 'from' | 'to' | 'event' | 'op' | 'seq'>;

function runner(inspect: boolean) {
  const seen: Seen[] = [];
  const decoder = new TransitionDecoder();
  const onMessage = (m: WorkerMessage): void => {
    if (m.kind === 'batch') m.messages.forEach(onMessage);
    else if (m.kind === 'transitions') decoder.decode(m, (t) => seen.push({ from: t.from, to: t.to, event: t.event, op: t.op, seq: t.seq }));
    else if (m.kind === 'transition') seen.push({ from: m.transition.from, to: m.transition.to, event: m.transition.event, op: m.transition.op, seq: m.transition.seq });
  };
  const r = new RankRunner(0, { cpuSeconds: 5, gpuSeconds: 5 }, { postMessage: (m) => onMessage(m as WorkerMessage) }, inspect);
  return { r, seen };
}

/** What the op table does for each kind of call. */
const calls = {
  barrier: (r: RankRunner) => r.run(EVENTS.barrier, () => undefined, PHASES.barrier),
  gatherAsync: (r: RankRunner) => {
    r.enter(EVENTS.sessionAllGather);
    r.inflight({ type: 'ISSUED', kind: 'gather' });
  },
  reduceAsync: (r: RankRunner) => {
    r.enter(EVENTS.sessionReduceScatter);
    r.inflight({ type: 'ISSUED', kind: 'reduce' });
  },
  gatherSync: (r: RankRunner) => r.run(EVENTS.sessionAllGather, () => undefined),
  waitGather: (r: RankRunner) => r.inflight({ type: 'COMPLETED', kind: 'gather' }),
  waitReduce: (r: RankRunner) => r.inflight({ type: 'COMPLETED', kind: 'reduce' }),
  fetchAsync: (r: RankRunner) => {
    r.enter(EVENTS.engramFetch);
    r.inflight({ type: 'ISSUED', kind: 'fetch' });
  },
  waitFetch: (r: RankRunner) => r.inflight({ type: 'COMPLETED', kind: 'fetch' }),
  dispatch: (r: RankRunner) => r.run(EVENTS.dispatch, () => undefined, PHASES.dispatchCached),
  open: (r: RankRunner) => r.run(EVENTS.sessionOpen, () => undefined),
  close: (r: RankRunner) => r.run(EVENTS.sessionClose, () => undefined),
  engramWrite: (r: RankRunner) => r.run(EVENTS.engramWrite, () => undefined),
} as const;
type Call = keyof typeof calls;

// Twice over, so that the second round takes the memoised steps the first one taught.
const round: Call[] = [
  'barrier', 'open', 'gatherAsync', 'gatherAsync', 'reduceAsync', 'gatherSync', 'waitGather', 'reduceAsync', 'waitReduce',
  'waitGather', 'waitReduce', 'gatherAsync', 'waitGather', 'close', 'engramWrite', 'fetchAsync', 'fetchAsync', 'dispatch',
  'waitFetch', 'barrier', 'waitFetch', 'fetchAsync', 'waitFetch', 'dispatch',
];

describe('the runner\'s memoised steps', () => {
  test('report what the machine reports, with ops in flight and without, call by call', () => {
    const a = runner(false), b = runner(true);
    for (const x of [a, b]) x.r.run(EVENTS.register, () => undefined);
    const states: Array<[string, number]> = [];
    for (const call of [...round, ...round, ...round]) {
      calls[call](a.r);
      calls[call](b.r);
      expect([a.r.state(), a.r.seq()], call).toEqual([b.r.state(), b.r.seq()]);
      states.push([a.r.state(), a.r.seq()]);
    }
    a.r.flush();
    b.r.flush();
    expect(a.seen.length).toBeGreaterThan(60);
    expect(a.seen).toEqual(b.seen);
    // The states the in-flight ops keep the rank in are there (the sequence is not trivially flat).
    expect(new Set(states.map(([s]) => s))).toEqual(new Set(['ready', 'session.open', 'session.gathering', 'session.reducing', 'engram.fetching']));
    a.r.stop();
    b.r.stop();
  });

  test('a refusal while ops are in flight goes through the machine and leaves the same state as it does', () => {
    const a = runner(false), b = runner(true);
    for (const x of [a, b]) {
      x.r.run(EVENTS.register, () => undefined);
      for (const c of ['open', 'gatherAsync', 'gatherAsync', 'waitGather', 'gatherAsync'] as const) calls[c](x.r);
      x.r.enter(EVENTS.sessionAllGather);
      expect(() => x.r.fail(Object.assign(new Error('tensors: bad'), { code: 'EINVAL' }))).toThrow(/bad/);
      for (const c of ['waitGather', 'gatherAsync', 'waitGather', 'waitGather', 'close'] as const) calls[c](x.r);
      x.r.flush();
    }
    expect(a.r.state()).toBe('ready');
    expect([a.r.state(), a.r.seq()]).toEqual([b.r.state(), b.r.seq()]);
    expect(a.seen).toEqual(b.seen);
    a.r.stop();
    b.r.stop();
  });
});
