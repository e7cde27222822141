/**
 * machines/ops.ts is the one list of the collectives: the machine and the runner derive theirs from it.
 * For every op of the table, the machine takes its event exactly where `from` says (and refuses it
 * elsewhere), runs it in its state, names it in the context, counts one sequence number, and settles
 * where a plain op settles; the runner's events, hot set and state-to-op map say the same.
 */
import { describe, expect, test } from 'vitest';
import { createActor } from 'xstate';

import { HOT_EVENTS, OP_TABLE, opOfState, rankMachine, statePath, type OpDescriptor, type RankEvent } from '../machines/index.js';
import { EVENTS } from '../workers/runner.js';

const ops = Object.entries(OP_TABLE) as Array<[string, OpDescriptor]>;
const eventOf = (d: OpDescriptor): RankEvent =>
  (d.event === 'BARRIER' ? { type: 'BARRIER', withCpuSync: false } : d.event === 'REPLAY' ? { type: 'REPLAY', ops: 1 } : { type: d.event }) as RankEvent;

/** A rank driven into `where`: ready, engram.fetching with one fetch in flight and no op running, session.open. */
function rankIn(where: 'ready' | 'fetching' | 'session') {
  const a = createActor(rankMachine, { input: { rank: 0 } }).start();
  a.send({ type: 'REGISTER' });
  a.send({ type: 'DONE' });
  if (where === 'fetching') {
    a.send({ type: 'ENGRAM_FETCH' });
    a.send({ type: 'ISSUED', kind: 'fetch' });
  }
  if (where === 'session') {
    a.send({ type: 'SESSION_OPEN' });
    a.send({ type: 'DONE' });
  }
  return a;
}
const WHERE: Record<string, string> = { ready: 'ready', fetching: 'engram.fetching', session: 'session.open' };
const TAKEN_IN: Record<OpDescriptor['from'], Array<'ready' | 'fetching' | 'session'>> = {
  ready: ['ready', 'fetching'], readyAlone: ['ready'], session: ['session'], sessionAlone: ['session'],
};

describe('machines/ops.ts: one descriptor per op', () => {
  test.each(ops)('%s: taken where `from` says, refused elsewhere; runs in its state, named and counted', (name, d) => {
    for (const where of ['ready', 'fetching', 'session'] as const) {
      const a = rankIn(where);
      expect(statePath(a.getSnapshot().value)).toBe(WHERE[where]);
      const before = a.getSnapshot();
      a.send(eventOf(d));
      const after = a.getSnapshot();
      if (!TAKEN_IN[d.from].includes(where)) {
        expect(after, `${name} from ${where}`).toBe(before);
        continue;
      }
      expect(statePath(after.value).startsWith(d.state), `${name} from ${where}: ${statePath(after.value)}`).toBe(true);
      expect(after.context.op).toBe(name);
      expect(after.context.seq).toBe(before.context.seq + 1);
      expect(opOfState(statePath(after.value))).toBe(name);
      if (!d.custom) {
        a.send({ type: 'DONE' });
        expect(statePath(a.getSnapshot().value)).toBe(WHERE[where]);
        expect(a.getSnapshot().context.op).toBeNull();
      }
    }
  });

  test('plain ops are top-level states; no two ops share an event or a state', () => {
    for (const [, d] of ops) if (!d.custom) expect(d.state).not.toContain('.');
    expect(new Set(ops.map(([, d]) => d.event)).size).toBe(ops.length);
    expect(new Set(ops.map(([, d]) => d.state)).size).toBe(ops.length);
  });

  test("the runner's tables are the table's: one event per op, the hot set, the lifecycle's ops", () => {
    for (const [name, d] of ops) {
      if (name !== 'barrier' && name !== 'replay') expect((EVENTS as Record<string, RankEvent>)[name]).toEqual({ type: d.event });
      expect(HOT_EVENTS.has(d.event)).toBe(d.hot);
    }
    expect(EVENTS.barrierCpuSync).toEqual({ type: 'BARRIER', withCpuSync: true });
    for (const e of ['WAITING', 'DONE', 'ISSUED', 'COMPLETED']) expect(HOT_EVENTS.has(e)).toBe(true);
    expect(opOfState('registerWindow')).toBe('register');
    expect(opOfState('recovering')).toBe('recover');
    expect(opOfState('dispatching.cpuSync')).toBe('dispatch');
    expect(opOfState('session.open')).toBeUndefined();
    expect(opOfState('ready')).toBeUndefined();
  });
});
