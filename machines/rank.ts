// The rank machine: the lifecycle and the collective operations of one rank, as xstate v5 data.
//
//   init -> registerWindow -> ready -> (barrier | allGathering | dispatching | combining | session |
//   engram | pipeline | replaying) -> ready -> destroying -> destroyed, and failed from any live state.
//
// The machine is the authority: the worker sends an op's event, and runs the op (one synchronous
// native call) only if the machine took it; the call's end is DONE (back to the state the op came
// from, `phases` in the record) or FAILED (EINVAL: refused, back, the rank usable; anything else:
// failed). So an op is at most one transition in and one out. The one wait that can be long in the
// middle of an op, a dispatch's CPU sync, becomes the state dispatching.cpuSync only while it happens
// (WAITING). Waits end natively (their deadline, or the abort words a peer's failure raises), so the
// machine keeps no timers: a synchronous op gives it no chance to run one anyway.
import { assign, setup } from 'xstate';

export interface FailureInfo {
  code: string;
  message: string;
  rank?: number;
  phase?: string;
  state?: string;
}

export type OpName =
  | 'register' | 'barrier' | 'allGather' | 'dispatch' | 'combine' | 'sessionOpen' | 'sessionAllGather'
  | 'sessionReduceScatter' | 'sessionClose' | 'engramWrite' | 'engramFetch' | 'ppExchange' | 'replay' | 'destroy';

export interface RankContext {
  rank: number;
  cpuSeconds: number;
  gpuSeconds: number;
  op: OpName | null;
  /** collectives started so far (from firstSeq): the same number on every rank for the same collective */
  seq: number;
  /** seq before the op in progress began: a refused op (nothing moved) puts it back */
  seqBefore: number;
  error: FailureInfo | null;
}

export interface RankInput {
  rank: number;
  cpuSeconds?: number;
  gpuSeconds?: number;
  /** tests: where the sequence starts (RANKFLOW_TEST_FIRST_SEQ; default 0) */
  firstSeq?: number;
}

export type RankEvent =
  | { type: 'REGISTER' }
  | { type: 'BARRIER'; withCpuSync: boolean }
  | { type: 'ALL_GATHER' }
  | { type: 'DISPATCH' }
  | { type: 'COMBINE' }
  | { type: 'SESSION_OPEN' }
  | { type: 'SESSION_ALL_GATHER' }
  | { type: 'SESSION_REDUCE_SCATTER' }
  | { type: 'SESSION_CLOSE' }
  | { type: 'ENGRAM_WRITE' }
  | { type: 'ENGRAM_FETCH' }
  | { type: 'PP_EXCHANGE' }
  /** a captured graph replays: `ops` collectives at once */
  | { type: 'REPLAY'; ops: number }
  | { type: 'DESTROY' }
  /** the op in progress finished; `phases` it went through, for the record */
  | { type: 'DONE'; phases?: readonly string[] }
  /** the op in progress threw: EINVAL is a refusal (nothing moved), anything else fails the rank */
  | { type: 'FAILED'; error: FailureInfo }
  /** the dispatch in progress waits for its peers' counts (its CPU sync) */
  | { type: 'WAITING' }
  | { type: 'PEER_FAILED'; error: FailureInfo };

const OPS: Record<string, OpName> = {
  BARRIER: 'barrier', ALL_GATHER: 'allGather', DISPATCH: 'dispatch', COMBINE: 'combine',
  SESSION_OPEN: 'sessionOpen', SESSION_ALL_GATHER: 'sessionAllGather', SESSION_REDUCE_SCATTER: 'sessionReduceScatter',
  SESSION_CLOSE: 'sessionClose', ENGRAM_WRITE: 'engramWrite', ENGRAM_FETCH: 'engramFetch', PP_EXCHANGE: 'ppExchange',
  REPLAY: 'replay',
};

// Pieces every op state shares (the machine stays plain data; these only name the repetition).
/** DONE returns to `to`; FAILED with EINVAL too (refused: the op's seq is given back), any other FAILED fails the rank. */
const settle = <T extends string>(to: T) => ({
  DONE: { target: to, actions: 'done' },
  FAILED: [{ target: to, guard: 'refused', actions: 'refuse' }, { target: '#rank.failed', actions: 'fail' }],
}) as const;

export const rankMachine = setup({
  types: {
    context: {} as RankContext,
    events: {} as RankEvent,
    input: {} as RankInput,
  },
  actions: {
    /** A collective starts: name it, and count it (a replay counts its graph's ops). */
    begin: assign(({ context, event }) => ({
      op: OPS[event.type] ?? null,
      seqBefore: context.seq,
      seq: context.seq + (event.type === 'REPLAY' ? event.ops : 1),
    })),
    /** The op was refused before it moved anything (the native side took no sequence number): nor does the machine. */
    refuse: assign(({ context }) => ({ op: null, seq: context.seqBefore })),
    /** REGISTER and DESTROY are not collectives: no seq. */
    lifecycle: assign(({ event }) => ({ op: event.type === 'REGISTER' ? ('register' as const) : ('destroy' as const) })),
    done: assign({ op: null }),
    fail: assign({ error: ({ event }) => (event as { error: FailureInfo }).error }),
    recordPeerFailure: assign(({ context, event }) => ({ error: context.error ?? (event as { error: FailureInfo }).error })),
  },
  guards: {
    /** EINVAL means the op was refused before it moved anything: the rank stays usable. */
    refused: ({ event }) => event.type === 'FAILED' && event.error.code === 'EINVAL',
  },
}).createMachine({
  id: 'rank',
  context: ({ input }) => ({
    rank: input.rank,
    cpuSeconds: input.cpuSeconds ?? 300,
    gpuSeconds: input.gpuSeconds ?? 100,
    op: null,
    seq: input.firstSeq ?? 0,
    seqBefore: input.firstSeq ?? 0,
    error: null,
  }),
  initial: 'init',
  on: {
    PEER_FAILED: { target: '.failed', actions: 'recordPeerFailure' },
  },
  states: {
    init: {
      on: {
        REGISTER: { target: 'registerWindow', actions: 'lifecycle' },
        DESTROY: { target: 'destroying', actions: 'lifecycle' },
      },
    },
    registerWindow: {
      on: {
        DONE: { target: 'ready', actions: 'done' },
        FAILED: { target: '#rank.failed', actions: 'fail' },
      },
    },
    ready: {
      on: {
        BARRIER: { target: 'barrier', actions: 'begin' },
        ALL_GATHER: { target: 'allGathering', actions: 'begin' },
        DISPATCH: { target: 'dispatching', actions: 'begin' },
        COMBINE: { target: 'combining', actions: 'begin' },
        SESSION_OPEN: { target: 'session', actions: 'begin' },
        ENGRAM_WRITE: { target: 'engram.writing', actions: 'begin' },
        ENGRAM_FETCH: { target: 'engram.fetching', actions: 'begin' },
        PP_EXCHANGE: { target: 'pipeline', actions: 'begin' },
        REPLAY: { target: 'replaying', actions: 'begin' },
        DESTROY: { target: 'destroying', actions: 'lifecycle' },
      },
    },
    barrier: { on: settle('#rank.ready') },
    allGathering: { on: settle('#rank.ready') },
    dispatching: {
      initial: 'running',
      states: {
        running: { on: { WAITING: 'cpuSync' } },
        // The CPU polls the counters the notify phase wrote (seed 7.3); TIMEOUT_CPU names rank and counter.
        cpuSync: {},
      },
      on: settle('#rank.ready'),
    },
    combining: { on: settle('#rank.ready') },
    // An AGRS session (seed 9.4): the rank stays in it between collectives until it is closed.
    session: {
      initial: 'opening',
      states: {
        opening: {
          on: {
            DONE: { target: 'open', actions: 'done' },
            FAILED: [{ target: '#rank.ready', guard: 'refused', actions: 'refuse' }, { target: '#rank.failed', actions: 'fail' }],
          },
        },
        open: {
          on: {
            SESSION_ALL_GATHER: { target: 'gathering', actions: 'begin' },
            SESSION_REDUCE_SCATTER: { target: 'reducing', actions: 'begin' },
            SESSION_CLOSE: { target: 'closing', actions: 'begin' },
            DESTROY: { target: '#rank.destroying', actions: 'lifecycle' },
          },
        },
        gathering: { on: settle('#rank.session.open') },
        reducing: { on: settle('#rank.session.open') },
        closing: {
          on: {
            DONE: { target: '#rank.ready', actions: 'done' },
            FAILED: { target: '#rank.failed', actions: 'fail' },
          },
        },
      },
    },
    engram: {
      initial: 'writing',
      states: {
        writing: { on: settle('#rank.ready') },
        fetching: { on: settle('#rank.ready') },
      },
    },
    pipeline: { on: settle('#rank.ready') },
    // A captured graph's ops, launched at once: one collective of `ops` sequence numbers.
    replaying: { on: settle('#rank.ready') },
    failed: {
      on: {
        PEER_FAILED: {},
        DESTROY: { target: 'destroying', actions: 'lifecycle' },
      },
    },
    destroying: {
      on: {
        DONE: 'destroyed',
        FAILED: 'destroyed',
        PEER_FAILED: {},
      },
    },
    destroyed: { type: 'final', on: { PEER_FAILED: {} } },
  },
});
