// The rank machine: the lifecycle and the collective operations of one rank, as xstate v5 data.
// Effects are named actions that the rank's worker provides (starting a native phase, replying to the
// caller); here they are declared with inert defaults so that the machine is testable alone.
//
// A phase is event-driven: entering a phase state runs `startPhase` with the phase's name; the worker
// starts the native phase for the call being served and, when it settles, sends PHASE_DONE or
// PHASE_FAILED naming that call and phase. A state takes only the events of its own call and phase,
// so a late answer from a phase the rank gave up on (backstop, PEER_FAILED) moves nothing.
//
//   init -> registerWindow -> ready -> (barrier | allGathering | dispatching | combining | session |
//   engram | pipeline) -> ready -> destroying -> destroyed, and failed from any live state.
//
// Every state that waits on peers has an `after` transition into `failed`: the native waits time out
// first with a precise error; the machine's timer is the backstop should a phase never return.
import { and, assign, enqueueActions, setup } from 'xstate';

export interface FailureInfo {
  code: string;
  message: string;
  rank?: number;
  phase?: string;
  state?: string;
}

export type OpName =
  | 'register' | 'barrier' | 'allGather' | 'dispatch' | 'combine' | 'sessionOpen' | 'sessionAllGather'
  | 'sessionReduceScatter' | 'sessionClose' | 'engramWrite' | 'engramFetch' | 'ppExchange' | 'destroy';

export interface RankContext {
  rank: number;
  cpuSeconds: number;
  gpuSeconds: number;
  /** id of the caller's request being served, null when idle */
  call: number | null;
  op: OpName | null;
  /** collectives started so far: the same number on every rank for the same collective */
  seq: number;
  withCpuSync: boolean;
  error: FailureInfo | null;
}

export interface RankInput {
  rank: number;
  cpuSeconds?: number;
  gpuSeconds?: number;
}

/** The native phases, by the name `startPhase` is given and PHASE_DONE / PHASE_FAILED carry. */
export const PHASE_NAMES = [
  'registerWindow', 'barrierDevice', 'barrierCpuSync', 'allGather', 'dispatchNotify', 'dispatchCpuSync', 'dispatchData',
  'combine', 'sessionOpen', 'sessionAllGather', 'sessionReduceScatter', 'sessionClose', 'engramWrite', 'engramFetch',
  'ppExchange', 'destroy',
] as const;
export type PhaseName = (typeof PHASE_NAMES)[number];

type Call = { call: number };
export type RankEvent =
  | ({ type: 'REGISTER' } & Call)
  | ({ type: 'BARRIER'; withCpuSync: boolean } & Call)
  | ({ type: 'ALL_GATHER' } & Call)
  | ({ type: 'DISPATCH' } & Call)
  | ({ type: 'COMBINE' } & Call)
  | ({ type: 'SESSION_OPEN' } & Call)
  | ({ type: 'SESSION_ALL_GATHER' } & Call)
  | ({ type: 'SESSION_REDUCE_SCATTER' } & Call)
  | ({ type: 'SESSION_CLOSE' } & Call)
  | ({ type: 'ENGRAM_WRITE' } & Call)
  | ({ type: 'ENGRAM_FETCH' } & Call)
  | ({ type: 'PP_EXCHANGE' } & Call)
  | { type: 'PEER_FAILED'; error: FailureInfo }
  | ({ type: 'DESTROY' } & Call)
  /** The phase `phase` started for request `call` finished with `output`. */
  | ({ type: 'PHASE_DONE'; phase: PhaseName; output?: unknown } & Call)
  /** The phase `phase` started for request `call` threw or rejected with `error`. */
  | ({ type: 'PHASE_FAILED'; phase: PhaseName; error: unknown } & Call);

/** What a started phase serves: the request's id and op (the context's `call` and `op`). */
export interface PhaseInput {
  call: number;
  op: OpName;
}

/** Seconds the machine's own timer adds to a native timeout before it declares the rank failed. */
export const BACKSTOP_MARGIN_SECONDS = 5;

const OPS: Record<string, OpName> = {
  BARRIER: 'barrier', ALL_GATHER: 'allGather', DISPATCH: 'dispatch', COMBINE: 'combine',
  SESSION_OPEN: 'sessionOpen', SESSION_ALL_GATHER: 'sessionAllGather', SESSION_REDUCE_SCATTER: 'sessionReduceScatter',
  SESSION_CLOSE: 'sessionClose', ENGRAM_WRITE: 'engramWrite', ENGRAM_FETCH: 'engramFetch', PP_EXCHANGE: 'ppExchange',
};
const opOf = (type: string): OpName | null => OPS[type] ?? null;

const timeoutInfo = (context: RankContext, code: string, seconds: number): FailureInfo => ({
  code,
  message: `rank ${context.rank}: ${context.op ?? 'phase'} did not complete within ${seconds + BACKSTOP_MARGIN_SECONDS} s (machine backstop)`,
  rank: context.rank,
  phase: context.op ?? undefined,
  state: context.op ?? undefined,
});

const errorInfo = (error: unknown, state: string): FailureInfo => {
  const e = error as { code?: string; message?: string; rank?: number; phase?: string } | undefined;
  return {
    code: e?.code ?? 'EINVAL',
    message: e?.message ?? String(error),
    ...(e?.rank !== undefined ? { rank: e.rank } : {}),
    ...(e?.phase !== undefined ? { phase: e.phase } : {}),
    state,
  };
};

// Pieces every phase state shares (the machine stays plain data; these only name the repetition).
/** A phase serves the request the state took; `begin`/`takeCall` put its id and op in the context. */
const start = (phase: PhaseName) => ({ type: 'startPhase', params: { phase } }) as const;
/** The event is the answer of `phase` for the call being served, not a late one from an abandoned phase. */
const isPhase = (phase: PhaseName) => ({ type: 'isPhase', params: { phase } }) as const;
const failOnError = (phase: PhaseName) => ({ target: '#rank.failed', guard: isPhase(phase), actions: 'fail' }) as const;
/** EINVAL from a phase returns to `target` with the error answered; anything else fails the rank. */
const refuseOrFail = <T extends string>(phase: PhaseName, target: T) =>
  [{ target, guard: and([isPhase(phase), 'refusedInput']), actions: 'refuse' } as const, failOnError(phase)] as const;
/** The phase's output goes to `target`; `finish` answers the caller with it when it was the last phase. */
const doneTo = <T extends string>(phase: PhaseName, target: T) => ({ target, guard: isPhase(phase) }) as const;
const finishTo = <T extends string>(phase: PhaseName, target: T) => ({ target, guard: isPhase(phase), actions: 'finish' }) as const;
const deviceBackstop = { deviceTimeout: { target: '#rank.failed', actions: 'timeOutDevice' } } as const;
const cpuBackstop = { cpuTimeout: { target: '#rank.failed', actions: 'timeOutCpu' } } as const;

export const rankMachine = setup({
  types: {
    context: {} as RankContext,
    events: {} as RankEvent,
    input: {} as RankInput,
  },
  actions: {
    /**
     * Entering a phase state: start native phase `phase` for the request `context.call`, then send
     * PHASE_DONE or PHASE_FAILED with that call and phase when it settles. Provided by the worker.
     */
    startPhase: (_, _params: { phase: PhaseName }) => {},
    /** The request `call` completed with `output` (the last phase's output). Provided by the worker. */
    reply: (_, _params: { call: number; output: unknown }) => {},
    /** The request `call` failed. Provided by the worker. */
    replyError: (_, _params: { call: number; error: FailureInfo }) => {},
    /** A collective starts: remember whom it serves, and count it. */
    begin: assign(({ context, event }) => ({
      call: 'call' in event ? event.call : null,
      op: opOf(event.type),
      seq: context.seq + 1,
      withCpuSync: event.type === 'BARRIER' ? event.withCpuSync : false,
    })),
    /** The last phase of a collective finished: answer the caller with its output. */
    finish: enqueueActions(({ context, event, enqueue }) => {
      enqueue({ type: 'reply', params: { call: context.call ?? -1, output: (event as { output?: unknown }).output } } as never);
    }),
    /** A phase refused its input (EINVAL): answer with the error, stay usable. */
    refuse: enqueueActions(({ context, event, enqueue }) => {
      enqueue({ type: 'replyError', params: { call: context.call ?? -1, error: errorInfo((event as { error?: unknown }).error, context.op ?? 'ready') } } as never);
    }),
    /** A phase failed: keep the error; entering `failed` answers the caller with it. */
    fail: assign({ error: ({ context, event }) => errorInfo((event as { error?: unknown }).error, context.op ?? 'unknown') }),
    /** REGISTER and DESTROY serve a request but are not collectives: no seq. */
    takeCall: assign(({ event }) => ({
      call: 'call' in event ? event.call : null,
      op: event.type === 'REGISTER' ? ('register' as const) : event.type === 'DESTROY' ? ('destroy' as const) : null,
    })),
    recordPeerFailure: assign(({ context, event }) => ({ error: event.type === 'PEER_FAILED' ? event.error : context.error })),
    timeOutDevice: assign({ error: ({ context }) => timeoutInfo(context, 'TIMEOUT_GPU', context.gpuSeconds) }),
    timeOutCpu: assign({ error: ({ context }) => timeoutInfo(context, 'TIMEOUT_CPU', context.cpuSeconds) }),
  },
  delays: {
    deviceTimeout: ({ context }) => (context.gpuSeconds + BACKSTOP_MARGIN_SECONDS) * 1000,
    cpuTimeout: ({ context }) => (context.cpuSeconds + BACKSTOP_MARGIN_SECONDS) * 1000,
  },
  guards: {
    withCpuSync: ({ context }) => context.withCpuSync,
    /** PHASE_DONE / PHASE_FAILED of `phase` for the request being served (not a late one). */
    isPhase: ({ context, event }, params: { phase: PhaseName }) =>
      (event.type === 'PHASE_DONE' || event.type === 'PHASE_FAILED') && event.call === context.call && event.phase === params.phase,
    /** EINVAL from a phase means the request was refused before it moved anything: stay usable. */
    refusedInput: ({ event }) => ((event as { error?: { code?: string } }).error)?.code === 'EINVAL',
  },
}).createMachine({
  id: 'rank',
  context: ({ input }) => ({
    rank: input.rank,
    cpuSeconds: input.cpuSeconds ?? 300,
    gpuSeconds: input.gpuSeconds ?? 100,
    call: null,
    op: null,
    seq: 0,
    withCpuSync: false,
    error: null,
  }),
  initial: 'init',
  on: {
    PEER_FAILED: {
      target: '.failed',
      actions: 'recordPeerFailure',
    },
  },
  states: {
    init: {
      on: {
        REGISTER: { target: 'registerWindow', actions: 'takeCall' },
        DESTROY: { target: 'destroying', actions: 'takeCall' },
      },
    },
    registerWindow: {
      entry: start('registerWindow'),
      on: {
        PHASE_DONE: finishTo('registerWindow', 'ready'),
        PHASE_FAILED: failOnError('registerWindow'),
      },
      after: deviceBackstop,
    },
    ready: {
      entry: assign({ call: null, op: null }),
      on: {
        BARRIER: { target: 'barrier', actions: 'begin' },
        ALL_GATHER: { target: 'allGathering', actions: 'begin' },
        DISPATCH: { target: 'dispatching', actions: 'begin' },
        COMBINE: { target: 'combining', actions: 'begin' },
        SESSION_OPEN: { target: 'session', actions: 'begin' },
        ENGRAM_WRITE: { target: 'engram.writing', actions: 'begin' },
        ENGRAM_FETCH: { target: 'engram.fetching', actions: 'begin' },
        PP_EXCHANGE: { target: 'pipeline', actions: 'begin' },
        DESTROY: { target: 'destroying', actions: 'takeCall' },
      },
    },
    barrier: {
      initial: 'device',
      states: {
        device: {
          entry: start('barrierDevice'),
          on: {
            PHASE_DONE: [
              { target: 'cpuSync', guard: and([isPhase('barrierDevice'), 'withCpuSync']) },
              finishTo('barrierDevice', '#rank.ready'),
            ],
            PHASE_FAILED: failOnError('barrierDevice'),
          },
          after: deviceBackstop,
        },
        cpuSync: {
          entry: start('barrierCpuSync'),
          on: {
            PHASE_DONE: finishTo('barrierCpuSync', '#rank.ready'),
            PHASE_FAILED: failOnError('barrierCpuSync'),
          },
          after: cpuBackstop,
        },
      },
    },
    allGathering: {
      entry: start('allGather'),
      on: {
        PHASE_DONE: finishTo('allGather', 'ready'),
        PHASE_FAILED: refuseOrFail('allGather', 'ready'),
      },
      after: deviceBackstop,
    },
    dispatching: {
      initial: 'notify',
      states: {
        notify: {
          entry: start('dispatchNotify'),
          on: {
            PHASE_DONE: doneTo('dispatchNotify', 'cpuSync'),
            PHASE_FAILED: refuseOrFail('dispatchNotify', '#rank.ready'),
          },
          after: deviceBackstop,
        },
        // The CPU polls the counters the notify phase wrote (seed 7.3); TIMEOUT_CPU names rank and counter.
        cpuSync: {
          entry: start('dispatchCpuSync'),
          on: {
            PHASE_DONE: doneTo('dispatchCpuSync', 'data'),
            PHASE_FAILED: failOnError('dispatchCpuSync'),
          },
          after: cpuBackstop,
        },
        data: {
          entry: start('dispatchData'),
          on: {
            PHASE_DONE: finishTo('dispatchData', '#rank.ready'),
            PHASE_FAILED: failOnError('dispatchData'),
          },
          after: deviceBackstop,
        },
      },
    },
    combining: {
      entry: start('combine'),
      on: {
        PHASE_DONE: finishTo('combine', 'ready'),
        PHASE_FAILED: refuseOrFail('combine', 'ready'),
      },
      after: deviceBackstop,
    },
    // An AGRS session (seed 9.4): the rank stays in it between collectives until it is closed.
    session: {
      initial: 'opening',
      states: {
        opening: {
          entry: start('sessionOpen'),
          on: {
            PHASE_DONE: finishTo('sessionOpen', 'open'),
            PHASE_FAILED: refuseOrFail('sessionOpen', '#rank.ready'),
          },
          after: deviceBackstop,
        },
        open: {
          entry: assign({ call: null, op: null }),
          on: {
            SESSION_ALL_GATHER: { target: 'gathering', actions: 'begin' },
            SESSION_REDUCE_SCATTER: { target: 'reducing', actions: 'begin' },
            SESSION_CLOSE: { target: 'closing', actions: 'begin' },
            DESTROY: { target: '#rank.destroying', actions: 'takeCall' },
          },
        },
        gathering: {
          entry: start('sessionAllGather'),
          on: {
            PHASE_DONE: finishTo('sessionAllGather', 'open'),
            PHASE_FAILED: refuseOrFail('sessionAllGather', 'open'),
          },
          after: deviceBackstop,
        },
        reducing: {
          entry: start('sessionReduceScatter'),
          on: {
            PHASE_DONE: finishTo('sessionReduceScatter', 'open'),
            PHASE_FAILED: refuseOrFail('sessionReduceScatter', 'open'),
          },
          after: deviceBackstop,
        },
        closing: {
          entry: start('sessionClose'),
          on: {
            PHASE_DONE: finishTo('sessionClose', '#rank.ready'),
            PHASE_FAILED: failOnError('sessionClose'),
          },
          after: deviceBackstop,
        },
      },
    },
    engram: {
      initial: 'writing',
      states: {
        writing: {
          entry: start('engramWrite'),
          on: {
            PHASE_DONE: finishTo('engramWrite', '#rank.ready'),
            PHASE_FAILED: refuseOrFail('engramWrite', '#rank.ready'),
          },
          after: deviceBackstop,
        },
        fetching: {
          entry: start('engramFetch'),
          on: {
            PHASE_DONE: finishTo('engramFetch', '#rank.ready'),
            PHASE_FAILED: refuseOrFail('engramFetch', '#rank.ready'),
          },
          after: deviceBackstop,
        },
      },
    },
    pipeline: {
      entry: start('ppExchange'),
      on: {
        PHASE_DONE: finishTo('ppExchange', 'ready'),
        PHASE_FAILED: refuseOrFail('ppExchange', 'ready'),
      },
      after: deviceBackstop,
    },
    failed: {
      // Whatever was pending is answered with the failure; later requests are answered by the worker.
      entry: { type: 'replyError', params: ({ context }) => ({ call: context.call ?? -1, error: context.error! }) },
      on: {
        PEER_FAILED: {},
        DESTROY: { target: 'destroying', actions: 'takeCall' },
      },
    },
    destroying: {
      entry: start('destroy'),
      on: {
        PHASE_DONE: {
          target: 'destroyed',
          guard: isPhase('destroy'),
          actions: [{ type: 'reply', params: ({ context, event }) => ({ call: context.call!, output: (event as { output?: unknown }).output }) }],
        },
        PHASE_FAILED: {
          target: 'destroyed',
          guard: isPhase('destroy'),
          actions: [{ type: 'replyError', params: ({ context, event }) => ({ call: context.call!, error: errorInfo((event as { error?: unknown }).error, 'destroying') }) }],
        },
        PEER_FAILED: {},
      },
    },
    destroyed: { type: 'final', on: { PEER_FAILED: {} } },
  },
});
