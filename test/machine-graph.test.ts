/**
 * describeMachine: an xstate v5 machine as the plain { states, transitions } the inspector draws.
 */
import { describe, expect, test } from 'vitest';
import { fromPromise, setup } from 'xstate';
import { assertMachineDescription, describeMachine } from '../actors/observe/machine-graph.js';

const machine = setup({
    actors: { open: fromPromise(async () => undefined) },
    delays: { patience: 100 }
}).createMachine({
    id: 'rank',
    initial: 'init',
    states: {
        init: { always: 'ready' },
        ready: { on: { OPEN: 'session', PING: {} } },
        session: {
            initial: 'opening',
            states: {
                opening: { invoke: { src: 'open', onDone: 'open', onError: '#rank.failed' } },
                open: { after: { patience: 'opening' }, on: { CLOSE: '#rank.ready' } }
            }
        },
        failed: { type: 'final' }
    }
});

describe('describeMachine', () => {
    test('lists every state as a dotted path, parents before children, in document order', () => {
        expect(describeMachine(machine).states).toEqual(['init', 'ready', 'session', 'session.opening', 'session.open', 'failed']);
    });

    test('lists transitions by the event names the group reports, leaving out targetless ones', () => {
        expect(describeMachine(machine).transitions).toEqual([
            { from: 'init', to: 'ready', event: '' },
            { from: 'ready', to: 'session', event: 'OPEN' },
            { from: 'session.opening', to: 'session.open', event: 'xstate.done.actor.0.rank.session.opening' },
            { from: 'session.opening', to: 'failed', event: 'xstate.error.actor.0.rank.session.opening' },
            { from: 'session.open', to: 'ready', event: 'CLOSE' },
            { from: 'session.open', to: 'session.opening', event: 'xstate.after.patience.rank.session.open' }
        ]);
    });

    test('gives a description that passes its own check', () => {
        expect(() => assertMachineDescription(describeMachine(machine))).not.toThrow();
        expect(() => assertMachineDescription({ states: ['a'], transitions: [{ from: 'a' }] })).toThrow(/transitions/);
    });
});
