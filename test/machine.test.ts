/**
 * The rank machine alone (machines/rank.ts): no worker, no addon. Entering a phase state runs the
 * `startPhase` action, here a spy; the test plays the worker and answers with PHASE_DONE / PHASE_FAILED
 * for that call and phase. Replies are spies, and the `after` backstops run on a simulated clock.
 */
import { describe, expect, test, vi } from 'vitest';
import { createActor, SimulatedClock } from 'xstate';

import {
    BACKSTOP_MARGIN_SECONDS, PHASE_NAMES, rankMachine, statePath, type FailureInfo, type PhaseInput, type PhaseName, type RankEvent,
} from '../machines/index.js';

const GPU_SECONDS = 3;
const CPU_SECONDS = 7;
const DEVICE_MS = (GPU_SECONDS + BACKSTOP_MARGIN_SECONDS) * 1000;
const CPU_MS = (CPU_SECONDS + BACKSTOP_MARGIN_SECONDS) * 1000;

/**
 * A rank machine whose phases never settle on their own: `done(name, output)` and `fail(name, error)`
 * send the answer of the running phase `name` (PHASE_DONE / PHASE_FAILED with the call it started for);
 * `started` lists the phases in the order `startPhase` ran, with the call and op they serve.
 */
function rank(input: { rank: number; cpuSeconds?: number; gpuSeconds?: number } = { rank: 2, cpuSeconds: CPU_SECONDS, gpuSeconds: GPU_SECONDS }) {
    const running = new Map<PhaseName, number>();
    const startPhase = vi.fn<(p: { phase: PhaseName; input: PhaseInput }) => void>((p) => { running.set(p.phase, p.input.call); });
    const reply = vi.fn<(p: { call: number; output: unknown }) => void>();
    const replyError = vi.fn<(p: { call: number; error: FailureInfo }) => void>();
    const machine = rankMachine.provide({
        actions: {
            startPhase: ({ context }, { phase }) => startPhase({ phase, input: { call: context.call!, op: context.op! } }),
            reply: (_, p) => reply(p),
            replyError: (_, p) => replyError(p),
        },
    });
    const clock = new SimulatedClock();
    const actor = createActor(machine, { input, clock });
    actor.start();
    const answer = async (phase: PhaseName, answerWith: (call: number) => RankEvent): Promise<void> => {
        const call = running.get(phase);
        if (call === undefined) throw new Error(`phase ${phase} is not running`);
        running.delete(phase);
        actor.send(answerWith(call));
    };
    return {
        actor, clock, reply, replyError, startPhase,
        get started() { return startPhase.mock.calls.map(([p]) => p); },
        state: () => statePath(actor.getSnapshot().value),
        context: () => actor.getSnapshot().context,
        send: (e: RankEvent) => actor.send(e),
        can: (e: RankEvent) => actor.getSnapshot().can(e),
        done: (phase: PhaseName, output?: unknown) => answer(phase, (call) => ({ type: 'PHASE_DONE', call, phase, output })),
        fail: (phase: PhaseName, error: unknown) => answer(phase, (call) => ({ type: 'PHASE_FAILED', call, phase, error })),
    };
}
type Rank = ReturnType<typeof rank>;

async function ready(r: Rank = rank()): Promise<Rank> {
    r.send({ type: 'REGISTER', call: 1 });
    await r.done('registerWindow');
    r.reply.mockClear();
    return r;
}
async function inSession(r?: Rank): Promise<Rank> {
    const s = await ready(r);
    s.send({ type: 'SESSION_OPEN', call: 2 });
    await s.done('sessionOpen');
    s.reply.mockClear();
    return s;
}
async function failedByPeer(): Promise<Rank> {
    const r = await ready();
    r.send({ type: 'PEER_FAILED', error: peerError });
    r.replyError.mockClear();
    return r;
}

const peerError: FailureInfo = { code: 'RANK_FAILED', message: 'rank 3 failed: worker exited', rank: 3 };
const nativeError = (code: string, message = `${code} from the phase`) => Object.assign(new Error(message), { code, rank: 0, phase: 'barrier' });

/**
 * Every state of the machine that runs a phase: how to get there, the event that started it (with
 * its call id), the phase it runs, the op it serves, which timer backs it up, and where an EINVAL
 * from its phase goes (null: the rank fails, because peers may already have moved).
 */
interface OpState {
    state: string;
    phase: PhaseName;
    op: string;
    call: number;
    timer: 'device' | 'cpu';
    refusedTo: string | null;
    enter: () => Promise<Rank>;
}
const OP_STATES: OpState[] = [
    { state: 'registerWindow', phase: 'registerWindow', op: 'register', call: 1, timer: 'device', refusedTo: null,
        enter: async () => { const r = rank(); r.send({ type: 'REGISTER', call: 1 }); return r; } },
    { state: 'barrier.device', phase: 'barrierDevice', op: 'barrier', call: 5, timer: 'device', refusedTo: null,
        enter: async () => { const r = await ready(); r.send({ type: 'BARRIER', call: 5, withCpuSync: true }); return r; } },
    { state: 'barrier.cpuSync', phase: 'barrierCpuSync', op: 'barrier', call: 5, timer: 'cpu', refusedTo: null,
        enter: async () => { const r = await ready(); r.send({ type: 'BARRIER', call: 5, withCpuSync: true }); await r.done('barrierDevice'); return r; } },
    { state: 'allGathering', phase: 'allGather', op: 'allGather', call: 5, timer: 'device', refusedTo: 'ready',
        enter: async () => { const r = await ready(); r.send({ type: 'ALL_GATHER', call: 5 }); return r; } },
    { state: 'dispatching.notify', phase: 'dispatchNotify', op: 'dispatch', call: 5, timer: 'device', refusedTo: 'ready',
        enter: async () => { const r = await ready(); r.send({ type: 'DISPATCH', call: 5 }); return r; } },
    { state: 'dispatching.cpuSync', phase: 'dispatchCpuSync', op: 'dispatch', call: 5, timer: 'cpu', refusedTo: null,
        enter: async () => { const r = await ready(); r.send({ type: 'DISPATCH', call: 5 }); await r.done('dispatchNotify'); return r; } },
    { state: 'dispatching.data', phase: 'dispatchData', op: 'dispatch', call: 5, timer: 'device', refusedTo: null,
        enter: async () => {
            const r = await ready(); r.send({ type: 'DISPATCH', call: 5 }); await r.done('dispatchNotify'); await r.done('dispatchCpuSync'); return r;
        } },
    { state: 'combining', phase: 'combine', op: 'combine', call: 5, timer: 'device', refusedTo: 'ready',
        enter: async () => { const r = await ready(); r.send({ type: 'COMBINE', call: 5 }); return r; } },
    { state: 'session.opening', phase: 'sessionOpen', op: 'sessionOpen', call: 5, timer: 'device', refusedTo: 'ready',
        enter: async () => { const r = await ready(); r.send({ type: 'SESSION_OPEN', call: 5 }); return r; } },
    { state: 'session.gathering', phase: 'sessionAllGather', op: 'sessionAllGather', call: 5, timer: 'device', refusedTo: 'session.open',
        enter: async () => { const r = await inSession(); r.send({ type: 'SESSION_ALL_GATHER', call: 5 }); return r; } },
    { state: 'session.reducing', phase: 'sessionReduceScatter', op: 'sessionReduceScatter', call: 5, timer: 'device', refusedTo: 'session.open',
        enter: async () => { const r = await inSession(); r.send({ type: 'SESSION_REDUCE_SCATTER', call: 5 }); return r; } },
    { state: 'session.closing', phase: 'sessionClose', op: 'sessionClose', call: 5, timer: 'device', refusedTo: null,
        enter: async () => { const r = await inSession(); r.send({ type: 'SESSION_CLOSE', call: 5 }); return r; } },
    { state: 'engram.writing', phase: 'engramWrite', op: 'engramWrite', call: 5, timer: 'device', refusedTo: 'ready',
        enter: async () => { const r = await ready(); r.send({ type: 'ENGRAM_WRITE', call: 5 }); return r; } },
    { state: 'engram.fetching', phase: 'engramFetch', op: 'engramFetch', call: 5, timer: 'device', refusedTo: 'ready',
        enter: async () => { const r = await ready(); r.send({ type: 'ENGRAM_FETCH', call: 5 }); return r; } },
    { state: 'pipeline', phase: 'ppExchange', op: 'ppExchange', call: 5, timer: 'device', refusedTo: 'ready',
        enter: async () => { const r = await ready(); r.send({ type: 'PP_EXCHANGE', call: 5 }); return r; } },
];

/** The states with no phase running that a rank rests in, and how to get there. */
const RESTING: Array<{ state: string; enter: () => Promise<Rank> }> = [
    { state: 'init', enter: async () => rank() },
    { state: 'ready', enter: () => ready() },
    { state: 'session.open', enter: () => inSession() },
];

describe('lifecycle', () => {
    test('starts in init with the timeouts it was given, or 300 s CPU and 100 s GPU', () => {
        const r = rank({ rank: 4 });
        expect(r.state()).toBe('init');
        expect(r.context()).toMatchObject({ rank: 4, cpuSeconds: 300, gpuSeconds: 100, call: null, op: null, seq: 0, error: null });
    });

    test('REGISTER runs registerWindow for that call; its output answers the call and the rank is ready', async () => {
        const r = rank();
        r.send({ type: 'REGISTER', call: 1 });
        expect(r.state()).toBe('registerWindow');
        expect(r.started).toEqual([{ phase: 'registerWindow', input: { call: 1, op: 'register' } }]);
        await r.done('registerWindow', 'mapped');
        expect(r.state()).toBe('ready');
        expect(r.reply.mock.calls).toEqual([[{ call: 1, output: 'mapped' }]]);
        expect(r.context()).toMatchObject({ call: null, op: null, seq: 0 });
    });

    test('DESTROY from init skips registration: destroying, then destroyed, answering the call', async () => {
        const r = rank();
        r.send({ type: 'DESTROY', call: 9 });
        expect(r.state()).toBe('destroying');
        expect(r.started).toEqual([{ phase: 'destroy', input: { call: 9, op: 'destroy' } }]);
        await r.done('destroy');
        expect(r.state()).toBe('destroyed');
        expect(r.actor.getSnapshot().status).toBe('done');
        expect(r.reply.mock.calls).toEqual([[{ call: 9, output: undefined }]]);
    });

    test('DESTROY from ready ends destroyed', async () => {
        const r = await ready();
        r.send({ type: 'DESTROY', call: 9 });
        expect(r.state()).toBe('destroying');
        await r.done('destroy');
        expect(r.state()).toBe('destroyed');
        expect(r.reply).toHaveBeenCalledWith({ call: 9, output: undefined });
    });

    test('DESTROY from an open session ends destroyed', async () => {
        const r = await inSession();
        r.send({ type: 'DESTROY', call: 9 });
        expect(r.state()).toBe('destroying');
        await r.done('destroy');
        expect(r.state()).toBe('destroyed');
    });

    test('DESTROY from failed ends destroyed', async () => {
        const r = await failedByPeer();
        r.send({ type: 'DESTROY', call: 9 });
        expect(r.state()).toBe('destroying');
        await r.done('destroy');
        expect(r.state()).toBe('destroyed');
        expect(r.reply).toHaveBeenCalledWith({ call: 9, output: undefined });
    });

    test('a destroy phase that throws still ends destroyed, answering the call with the error', async () => {
        const r = await ready();
        r.send({ type: 'DESTROY', call: 9 });
        await r.fail('destroy', nativeError('EINVAL', 'munmap failed'));
        expect(r.state()).toBe('destroyed');
        expect(r.replyError.mock.calls).toEqual([[{ call: 9, error: expect.objectContaining({ code: 'EINVAL', message: 'munmap failed', state: 'destroying' }) }]]);
    });
});

describe('operations', () => {
    test('BARRIER without CPU sync: barrier.device, then ready, answering the call with its output', async () => {
        const r = await ready();
        r.send({ type: 'BARRIER', call: 5, withCpuSync: false });
        expect(r.state()).toBe('barrier.device');
        expect(r.context()).toMatchObject({ call: 5, op: 'barrier', seq: 1, withCpuSync: false });
        await r.done('barrierDevice', 'ok');
        expect(r.state()).toBe('ready');
        expect(r.reply.mock.calls).toEqual([[{ call: 5, output: 'ok' }]]);
        expect(r.started.map((s) => s.phase)).toEqual(['registerWindow', 'barrierDevice']);
    });

    test('BARRIER with CPU sync: barrier.device, barrier.cpuSync, then ready; the call is answered once, at the end', async () => {
        const r = await ready();
        r.send({ type: 'BARRIER', call: 5, withCpuSync: true });
        await r.done('barrierDevice', 'device');
        expect(r.state()).toBe('barrier.cpuSync');
        expect(r.reply).not.toHaveBeenCalled();
        await r.done('barrierCpuSync', 'cpu');
        expect(r.state()).toBe('ready');
        expect(r.reply.mock.calls).toEqual([[{ call: 5, output: 'cpu' }]]);
        expect(r.started.slice(1)).toEqual([
            { phase: 'barrierDevice', input: { call: 5, op: 'barrier' } },
            { phase: 'barrierCpuSync', input: { call: 5, op: 'barrier' } },
        ]);
    });

    test('DISPATCH: notify, cpuSync, data, then ready; the call is answered once, with the data phase output', async () => {
        const r = await ready();
        r.send({ type: 'DISPATCH', call: 5 });
        expect(r.state()).toBe('dispatching.notify');
        await r.done('dispatchNotify', 'layout');
        expect(r.state()).toBe('dispatching.cpuSync');
        await r.done('dispatchCpuSync', 'counts');
        expect(r.state()).toBe('dispatching.data');
        expect(r.reply).not.toHaveBeenCalled();
        await r.done('dispatchData', 'tokens');
        expect(r.state()).toBe('ready');
        expect(r.reply.mock.calls).toEqual([[{ call: 5, output: 'tokens' }]]);
        expect(r.started.slice(1).map((s) => s.input)).toEqual([
            { call: 5, op: 'dispatch' }, { call: 5, op: 'dispatch' }, { call: 5, op: 'dispatch' },
        ]);
    });

    test.each([
        { event: 'ALL_GATHER', state: 'allGathering', phase: 'allGather', op: 'allGather' },
        { event: 'COMBINE', state: 'combining', phase: 'combine', op: 'combine' },
        { event: 'ENGRAM_WRITE', state: 'engram.writing', phase: 'engramWrite', op: 'engramWrite' },
        { event: 'ENGRAM_FETCH', state: 'engram.fetching', phase: 'engramFetch', op: 'engramFetch' },
        { event: 'PP_EXCHANGE', state: 'pipeline', phase: 'ppExchange', op: 'ppExchange' },
    ] as const)('$event: $state runs $phase for the call, then ready', async ({ event, state, phase, op }) => {
        const r = await ready();
        r.send({ type: event, call: 5 });
        expect(r.state()).toBe(state);
        expect(r.context()).toMatchObject({ call: 5, op, seq: 1 });
        expect(r.started.at(-1)).toEqual({ phase, input: { call: 5, op } });
        await r.done(phase, 'out');
        expect(r.state()).toBe('ready');
        expect(r.reply.mock.calls).toEqual([[{ call: 5, output: 'out' }]]);
        expect(r.context()).toMatchObject({ call: null, op: null, seq: 1 });
    });

    test('a session: opening, open; allGather and reduceScatter return to open; close returns to ready', async () => {
        const r = await ready();
        r.send({ type: 'SESSION_OPEN', call: 5 });
        expect(r.state()).toBe('session.opening');
        await r.done('sessionOpen', 'opened');
        expect(r.state()).toBe('session.open');
        expect(r.context()).toMatchObject({ call: null, op: null });
        r.send({ type: 'SESSION_ALL_GATHER', call: 6 });
        expect(r.state()).toBe('session.gathering');
        await r.done('sessionAllGather', 'gathered');
        expect(r.state()).toBe('session.open');
        r.send({ type: 'SESSION_REDUCE_SCATTER', call: 7 });
        expect(r.state()).toBe('session.reducing');
        await r.done('sessionReduceScatter', 'reduced');
        expect(r.state()).toBe('session.open');
        r.send({ type: 'SESSION_CLOSE', call: 8 });
        expect(r.state()).toBe('session.closing');
        await r.done('sessionClose', 'closed');
        expect(r.state()).toBe('ready');
        expect(r.reply.mock.calls).toEqual([
            [{ call: 5, output: 'opened' }], [{ call: 6, output: 'gathered' }], [{ call: 7, output: 'reduced' }], [{ call: 8, output: 'closed' }],
        ]);
        expect(r.context().seq).toBe(4);
    });

    test('seq counts collectives, one per started operation; REGISTER and DESTROY count none', async () => {
        const r = await ready();
        expect(r.context().seq).toBe(0);
        r.send({ type: 'BARRIER', call: 2, withCpuSync: true });
        await r.done('barrierDevice');
        await r.done('barrierCpuSync');
        r.send({ type: 'DISPATCH', call: 3 });
        await r.done('dispatchNotify');
        await r.done('dispatchCpuSync');
        await r.done('dispatchData');
        r.send({ type: 'ALL_GATHER', call: 4 });
        expect(r.context().seq).toBe(3);
        await r.done('allGather');
        r.send({ type: 'DESTROY', call: 5 });
        await r.done('destroy');
        expect(r.context().seq).toBe(3);
    });
});

describe('startPhase', () => {
    test.each(OP_STATES)('entering $state runs startPhase once with $phase, for call $call and op $op', async (s) => {
        const r = await s.enter();
        expect(r.started.filter((p) => p.phase === s.phase)).toEqual([{ phase: s.phase, input: { call: s.call, op: s.op } }]);
        expect(r.started.at(-1)).toEqual({ phase: s.phase, input: { call: s.call, op: s.op } });
    });

    test.each([
        { state: 'init', enter: RESTING[0]!.enter, phases: [] },
        { state: 'ready', enter: RESTING[1]!.enter, phases: ['registerWindow'] },
        { state: 'session.open', enter: RESTING[2]!.enter, phases: ['registerWindow', 'sessionOpen'] },
    ])('entering $state starts no phase: only the ones on the way there ran ($phases)', async (s) => {
        const r = await s.enter();
        expect(r.state()).toBe(s.state);
        expect(r.started.map((p) => p.phase)).toEqual(s.phases);
    });
});

describe('failures', () => {
    test.each(OP_STATES)('PEER_FAILED in $state: failed, answering the pending call with the peer\'s error', async (s) => {
        const r = await s.enter();
        expect(r.state()).toBe(s.state);
        r.replyError.mockClear();
        r.send({ type: 'PEER_FAILED', error: peerError });
        expect(r.state()).toBe('failed');
        expect(r.context().error).toEqual(peerError);
        expect(r.replyError.mock.calls).toEqual([[{ call: s.call, error: peerError }]]);
    });

    test.each(RESTING)('PEER_FAILED in $state: failed, with no call to answer (call -1)', async (s) => {
        const r = await s.enter();
        r.send({ type: 'PEER_FAILED', error: peerError });
        expect(r.state()).toBe('failed');
        expect(r.context().error).toEqual(peerError);
        expect(r.replyError.mock.calls).toEqual([[{ call: -1, error: peerError }]]);
    });

    test('a later PEER_FAILED does not replace the first error, nor answer anyone again', async () => {
        const r = await failedByPeer();
        r.send({ type: 'PEER_FAILED', error: { code: 'RANK_FAILED', message: 'rank 0 failed', rank: 0 } });
        expect(r.state()).toBe('failed');
        expect(r.context().error).toEqual(peerError);
        expect(r.replyError).not.toHaveBeenCalled();
    });

    test('PEER_FAILED while destroying changes nothing; the rank still ends destroyed', async () => {
        const r = await ready();
        r.send({ type: 'DESTROY', call: 9 });
        r.send({ type: 'PEER_FAILED', error: peerError });
        expect(r.state()).toBe('destroying');
        await r.done('destroy');
        expect(r.state()).toBe('destroyed');
        expect(r.actor.getSnapshot().status).toBe('done');
        expect(r.context().error).toBeNull();
        expect(r.replyError).not.toHaveBeenCalled();
    });

    test.each(OP_STATES)('a phase error other than EINVAL in $state fails the rank with it, answering the call', async (s) => {
        const r = await s.enter();
        r.replyError.mockClear();
        await r.fail(s.phase, nativeError('TIMEOUT_GPU', 'device-phase wait timed out'));
        expect(r.state()).toBe('failed');
        const error = { code: 'TIMEOUT_GPU', message: 'device-phase wait timed out', rank: 0, phase: 'barrier', state: s.op };
        expect(r.context().error).toEqual(error);
        expect(r.replyError.mock.calls).toEqual([[{ call: s.call, error }]]);
    });

    test.each(OP_STATES.filter((s) => s.refusedTo !== null))('EINVAL from the phase in $state refuses the call and returns to $refusedTo', async (s) => {
        const r = await s.enter();
        r.replyError.mockClear();
        const seq = r.context().seq;
        await r.fail(s.phase, nativeError('EINVAL', 'bytes exceed the buffer'));
        expect(r.state()).toBe(s.refusedTo);
        expect(r.context()).toMatchObject({ error: null, call: null, op: null, seq });
        expect(r.replyError.mock.calls).toEqual([[{ call: s.call, error: expect.objectContaining({ code: 'EINVAL', message: 'bytes exceed the buffer', state: s.op }) }]]);
    });

    test.each(OP_STATES.filter((s) => s.refusedTo === null))('EINVAL from the phase in $state fails the rank: peers may have moved already', async (s) => {
        const r = await s.enter();
        await r.fail(s.phase, nativeError('EINVAL'));
        expect(r.state()).toBe('failed');
        expect(r.context().error?.code).toBe('EINVAL');
    });

    test('a phase error with no code is not a refusal: the rank fails', async () => {
        const r = await ready();
        r.send({ type: 'ALL_GATHER', call: 5 });
        await r.fail('allGather', new TypeError('x is undefined'));
        expect(r.state()).toBe('failed');
        expect(r.context().error).toMatchObject({ message: 'x is undefined', state: 'allGather' });
    });
});

describe('guards: an event a state does not take leaves it where it is', () => {
    const anyOp: RankEvent[] = [
        { type: 'REGISTER', call: 50 }, { type: 'BARRIER', call: 50, withCpuSync: false }, { type: 'ALL_GATHER', call: 50 },
        { type: 'DISPATCH', call: 50 }, { type: 'COMBINE', call: 50 }, { type: 'SESSION_OPEN', call: 50 },
        { type: 'SESSION_ALL_GATHER', call: 50 }, { type: 'SESSION_REDUCE_SCATTER', call: 50 }, { type: 'SESSION_CLOSE', call: 50 },
        { type: 'ENGRAM_WRITE', call: 50 }, { type: 'ENGRAM_FETCH', call: 50 }, { type: 'PP_EXCHANGE', call: 50 },
        { type: 'DESTROY', call: 50 },
    ];
    const accepted: Record<string, string[]> = {
        init: ['REGISTER', 'DESTROY'],
        ready: ['BARRIER', 'ALL_GATHER', 'DISPATCH', 'COMBINE', 'SESSION_OPEN', 'ENGRAM_WRITE', 'ENGRAM_FETCH', 'PP_EXCHANGE', 'DESTROY'],
        'session.open': ['SESSION_ALL_GATHER', 'SESSION_REDUCE_SCATTER', 'SESSION_CLOSE', 'DESTROY'],
        failed: ['DESTROY'],
    };
    const cases = [
        ...RESTING.map((s) => ({ ...s, accepts: accepted[s.state]! })),
        { state: 'failed', enter: failedByPeer, accepts: accepted.failed! },
        // A rank running a phase takes no request, not even DESTROY: the group tears it down from outside.
        ...OP_STATES.map((s) => ({ state: s.state, enter: s.enter, accepts: [] as string[] })),
    ];

    test.each(cases)('$state takes only its own events', async ({ enter, state, accepts }) => {
        const r = await enter();
        expect(anyOp.filter((e) => r.can(e)).map((e) => e.type)).toEqual(accepts);
        for (const e of anyOp.filter((ev) => !accepts.includes(ev.type))) {
            const before = r.actor.getSnapshot();
            r.send(e);
            expect(r.state()).toBe(state);
            expect(r.context()).toEqual(before.context);
        }
    });

    test.each(OP_STATES)('$state takes only the answer of $phase for its own call: any other PHASE_DONE / PHASE_FAILED changes nothing', async (s) => {
        const r = await s.enter();
        r.reply.mockClear();
        r.replyError.mockClear();
        const strangers: RankEvent[] = [
            { type: 'PHASE_DONE', call: s.call + 100, phase: s.phase, output: 'late' },
            { type: 'PHASE_FAILED', call: s.call + 100, phase: s.phase, error: nativeError('EINVAL') },
            { type: 'PHASE_FAILED', call: s.call + 100, phase: s.phase, error: nativeError('TIMEOUT_GPU') },
            ...PHASE_NAMES.filter((p) => p !== s.phase).flatMap((phase): RankEvent[] => [
                { type: 'PHASE_DONE', call: s.call, phase, output: 'other' },
                { type: 'PHASE_FAILED', call: s.call, phase, error: nativeError('TIMEOUT_GPU') },
            ]),
        ];
        for (const e of strangers) {
            const before = r.actor.getSnapshot();
            expect(r.can(e)).toBe(false);
            r.send(e);
            expect(r.state()).toBe(s.state);
            expect(r.context()).toEqual(before.context);
        }
        expect(r.reply).not.toHaveBeenCalled();
        expect(r.replyError).not.toHaveBeenCalled();
        expect(r.can({ type: 'PHASE_DONE', call: s.call, phase: s.phase })).toBe(true);
        await r.done(s.phase);
        expect(r.state()).not.toBe(s.state);
    });

    test.each([...RESTING, { state: 'failed', enter: failedByPeer }])('$state takes no phase answer at all', async ({ enter, state }) => {
        const r = await enter();
        r.replyError.mockClear();
        for (const phase of PHASE_NAMES) {
            for (const e of [{ type: 'PHASE_DONE', call: 1, phase }, { type: 'PHASE_FAILED', call: 1, phase, error: nativeError('EINVAL') }] as RankEvent[]) {
                const before = r.actor.getSnapshot();
                expect(r.can(e)).toBe(false);
                r.send(e);
                expect(r.state()).toBe(state);
                expect(r.context()).toEqual(before.context);
            }
        }
        expect(r.reply).not.toHaveBeenCalled();
        expect(r.replyError).not.toHaveBeenCalled();
    });

    test('destroying takes only the destroy phase\'s answer for the DESTROY call', async () => {
        const r = await ready();
        r.send({ type: 'DESTROY', call: 9 });
        for (const e of [
            { type: 'PHASE_DONE', call: 8, phase: 'destroy' }, { type: 'PHASE_FAILED', call: 8, phase: 'destroy', error: nativeError('EINVAL') },
            { type: 'PHASE_DONE', call: 9, phase: 'barrierDevice' }, { type: 'PHASE_FAILED', call: 9, phase: 'registerWindow', error: nativeError('EINVAL') },
        ] as RankEvent[]) {
            r.send(e);
            expect(r.state()).toBe('destroying');
        }
        expect(r.reply).not.toHaveBeenCalled();
        expect(r.replyError).not.toHaveBeenCalled();
        await r.done('destroy', 'gone');
        expect(r.state()).toBe('destroyed');
        expect(r.reply.mock.calls).toEqual([[{ call: 9, output: 'gone' }]]);
    });

    test('a phase abandoned on PEER_FAILED answers too late: the rank destroying for a later call does not move', async () => {
        const r = await ready();
        r.send({ type: 'BARRIER', call: 5, withCpuSync: false });
        r.send({ type: 'PEER_FAILED', error: peerError });
        r.send({ type: 'DESTROY', call: 9 });
        r.send({ type: 'PHASE_FAILED', call: 5, phase: 'barrierDevice', error: nativeError('RANK_FAILED') });
        r.send({ type: 'PHASE_DONE', call: 5, phase: 'barrierDevice' });
        expect(r.state()).toBe('destroying');
        expect(r.context().error).toEqual(peerError);
        await r.done('destroy');
        expect(r.state()).toBe('destroyed');
    });

    test('the answer of a refused call does not complete the next call of the same phase', async () => {
        const r = await ready();
        r.send({ type: 'ALL_GATHER', call: 5 });
        await r.fail('allGather', nativeError('EINVAL'));
        r.send({ type: 'ALL_GATHER', call: 6 });
        r.send({ type: 'PHASE_DONE', call: 5, phase: 'allGather', output: 'stale' });
        expect(r.state()).toBe('allGathering');
        expect(r.reply).not.toHaveBeenCalled();
        await r.done('allGather', 'fresh');
        expect(r.state()).toBe('ready');
        expect(r.reply.mock.calls).toEqual([[{ call: 6, output: 'fresh' }]]);
    });

    test('destroyed is final: it takes no event', async () => {
        const r = await ready();
        r.send({ type: 'DESTROY', call: 9 });
        await r.done('destroy');
        expect(r.actor.getSnapshot().status).toBe('done');
        expect(anyOp.filter((e) => r.can(e))).toEqual([]);
    });
});

describe('backstop timers (simulated clock)', () => {
    test.each(OP_STATES)('$state fails after its $timer timeout plus the margin, not a millisecond before', async (s) => {
        const r = await s.enter();
        r.replyError.mockClear();
        const ms = s.timer === 'device' ? DEVICE_MS : CPU_MS;
        r.clock.increment(ms - 1);
        expect(r.state()).toBe(s.state);
        r.clock.increment(1);
        expect(r.state()).toBe('failed');
        const code = s.timer === 'device' ? 'TIMEOUT_GPU' : 'TIMEOUT_CPU';
        const seconds = (s.timer === 'device' ? GPU_SECONDS : CPU_SECONDS) + BACKSTOP_MARGIN_SECONDS;
        const error = { code, rank: 2, phase: s.op, state: s.op, message: `rank 2: ${s.op} did not complete within ${seconds} s (machine backstop)` };
        expect(r.context().error).toEqual(error);
        expect(r.replyError.mock.calls).toEqual([[{ call: s.call, error }]]);
    });

    test('deviceTimeout is gpuSeconds + BACKSTOP_MARGIN_SECONDS, cpuTimeout is cpuSeconds + BACKSTOP_MARGIN_SECONDS', async () => {
        const device = await ready(rank({ rank: 0, gpuSeconds: 1, cpuSeconds: 1000 }));
        device.send({ type: 'BARRIER', call: 5, withCpuSync: false });
        device.clock.increment((1 + BACKSTOP_MARGIN_SECONDS) * 1000);
        expect(device.context().error?.code).toBe('TIMEOUT_GPU');

        const cpu = await ready(rank({ rank: 0, gpuSeconds: 1000, cpuSeconds: 2 }));
        cpu.send({ type: 'DISPATCH', call: 5 });
        await cpu.done('dispatchNotify');
        cpu.clock.increment((2 + BACKSTOP_MARGIN_SECONDS) * 1000);
        expect(cpu.context().error?.code).toBe('TIMEOUT_CPU');
    });

    test('the default timeouts back up 100 s device phases and 300 s CPU syncs', async () => {
        const r = await ready(rank({ rank: 0 }));
        r.send({ type: 'BARRIER', call: 5, withCpuSync: true });
        r.clock.increment((100 + BACKSTOP_MARGIN_SECONDS) * 1000 - 1);
        await r.done('barrierDevice');
        r.clock.increment((300 + BACKSTOP_MARGIN_SECONDS) * 1000 - 1);
        expect(r.state()).toBe('barrier.cpuSync');
        r.clock.increment(1);
        expect(r.context().error?.code).toBe('TIMEOUT_CPU');
    });

    test('each sub-state starts its own timer: time spent in dispatching.notify does not count against cpuSync', async () => {
        const r = await ready();
        r.send({ type: 'DISPATCH', call: 5 });
        r.clock.increment(DEVICE_MS - 1);
        await r.done('dispatchNotify');
        r.clock.increment(CPU_MS - 1);
        expect(r.state()).toBe('dispatching.cpuSync');
        await r.done('dispatchCpuSync');
        r.clock.increment(DEVICE_MS - 1);
        expect(r.state()).toBe('dispatching.data');
        r.clock.increment(1);
        expect(r.state()).toBe('failed');
    });

    test('a phase that finished cancels its timer: resting states never time out', async () => {
        const r = await ready();
        r.send({ type: 'ALL_GATHER', call: 5 });
        await r.done('allGather');
        r.clock.increment(10 * CPU_MS);
        expect(r.state()).toBe('ready');
        r.send({ type: 'SESSION_OPEN', call: 6 });
        await r.done('sessionOpen');
        r.clock.increment(10 * CPU_MS);
        expect(r.state()).toBe('session.open');
        expect(r.replyError).not.toHaveBeenCalled();
    });

    test('a phase that settles after the backstop fired changes nothing', async () => {
        const r = await ready();
        r.send({ type: 'COMBINE', call: 5 });
        r.clock.increment(DEVICE_MS);
        expect(r.state()).toBe('failed');
        await r.done('combine', 'late');
        expect(r.state()).toBe('failed');
        expect(r.reply).not.toHaveBeenCalled();
        expect(r.replyError).toHaveBeenCalledTimes(1);
    });
});
