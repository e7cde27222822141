// The rank machine: the lifecycle and the collective operations of one rank, as xstate v5 data.
//
//   init -> registerWindow -> ready -> (barrier | allGathering | dispatching | combining | session |
//   engram | pipeline | replaying) -> ready -> destroying -> destroyed, and failed from any live state.
//   A run's release (a rank program threw, or returned while its peers waited: FAILED with ABORTED)
//   ends the op in `released`; once every program of the run has ended the group sends RECOVER to
//   every rank (also from ready, or a session the program left open): recovering -> ready.
//
// The machine is the authority: the worker sends an op's event, and runs the op (one synchronous
// native call) only if the machine took it; the call's end is DONE (back to the state the op came
// from, `phases` in the record) or FAILED (EINVAL or BACKEND_UNAVAILABLE: refused, back, the rank
// usable; anything else: failed). So an op is at most one transition in and one out. The one wait
// that can be long in the middle of an op, a dispatch's CPU sync, becomes the state
// dispatching.cpuSync only while it happens
// (WAITING). Waits end natively (their deadline, or the abort words a peer's failure raises), so the
// machine keeps no timers: a synchronous op gives it no chance to run one anyway.
//
// Asynchronous ops (rank programs: session collectives and engram fetches with { async: true }) end
// their pass with ISSUED instead of DONE: the rank stays in the op's state while the op is in flight
// (context.inflight counts them) and leaves it on COMPLETED, when the op is waited for. While only
// in-flight ops hold it there (no op runs: op = null), the state takes what its home state takes:
// session.gathering/reducing the session's collectives, engram.fetching every op `ready` takes
// except SESSION_OPEN and ENGRAM_WRITE (a session reuses the buffer, a write replaces the table).
//
// Elastic groups (input.elastic): a peer that leaves does not fail the rank. Its op in flight ends
// with FAILED (RANK_FAILED naming the peer) into `masking`, and so does PEER_LEFT from any live state;
// there every op is refused with that error until the group's REMASK (remasking: the native side
// back in step and the new live mask written) -> ready. A replacement joining: REJOIN (rejoining:
// its window mapped, a barrier with it) -> ready.
import { assign, setup } from 'xstate';

import { OP_OF_EVENT, OP_TABLE, opsFrom, type OpDescriptor, type OpEventType, type OpName } from './ops.js';

export type { OpName } from './ops.js';

export interface FailureInfo {
  code: string;
  message: string;
  rank?: number;
  phase?: string;
  state?: string;
}

/**
 * Codes that refuse an op before it moved anything, so that the rank stays usable: EINVAL (bad input)
 * and BACKEND_UNAVAILABLE (the backend does not run this op in this world: e.g. dispatch on cuda
 * across nodes). Any other code from an op fails the rank.
 */
export const isRefusal = (code: string): boolean => code === 'EINVAL' || code === 'BACKEND_UNAVAILABLE';

/** What an asynchronous op in flight is: a session allGather or reduceScatter, or an engram fetch. */
export type InFlightKind = 'gather' | 'reduce' | 'fetch';

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
  /** asynchronous ops issued and not yet waited for, by kind */
  inflight: Record<InFlightKind, number>;
  /** an elastic group's rank: a peer's leaving is PEER_LEFT / masking, not a failure */
  elastic: boolean;
}

export interface RankInput {
  rank: number;
  cpuSeconds?: number;
  gpuSeconds?: number;
  /** tests: where the sequence starts (RANKFLOW_TEST_FIRST_SEQ; default 0) */
  firstSeq?: number;
  elastic?: boolean;
}

/** The events of the collectives that carry nothing but their type (ops.ts OP_TABLE). */
type PlainOpEvent = { [E in Exclude<OpEventType, 'BARRIER' | 'REPLAY'>]: { type: E } }[Exclude<OpEventType, 'BARRIER' | 'REPLAY'>];

export type RankEvent =
  | { type: 'REGISTER' }
  | { type: 'BARRIER'; withCpuSync: boolean }
  | PlainOpEvent
  /** a captured graph replays: `ops` collectives at once */
  | { type: 'REPLAY'; ops: number }
  | { type: 'DESTROY' }
  /** the op in progress finished; `phases` it went through, for the record */
  | { type: 'DONE'; phases?: readonly string[] }
  /**
   * the op in progress threw: a refusal (isRefusal) leaves the rank usable, anything else fails it. `seq`: the native
   * side's sequence number after it (a refusal found by a kernel, e.g. a bad expert id, took its
   * number: the op ran), where the worker knows it; without it a refusal gives the op's number back.
   */
  | { type: 'FAILED'; error: FailureInfo; seq?: number }
  /** the dispatch in progress waits for its peers' counts (its CPU sync) */
  | { type: 'WAITING' }
  /** the op in progress was started asynchronously: it is in flight, the rank stays in its state */
  | { type: 'ISSUED'; kind: InFlightKind }
  /** an op in flight was waited for (its failure is FAILED) */
  | { type: 'COMPLETED'; kind: InFlightKind }
  | { type: 'PEER_FAILED'; error: FailureInfo }
  /** elastic: a peer left the group (`error` names it); the rank goes on once the group re-forms */
  | { type: 'PEER_LEFT'; error: FailureInfo }
  /** elastic: the group re-formed without the ranks that left (`seq`: the group's) */
  | { type: 'REMASK'; seq: number }
  /** elastic: a replacement joins (its window is mapped, then a barrier with it: one collective) */
  | { type: 'REJOIN' }
  /** the run is over and was released: the rank is put back in step with the group (`seq`: the group's) */
  | { type: 'RECOVER'; seq: number };

// Pieces every op state shares (the machine stays plain data; these only name the repetition).
/** A run's release ended the op (FAILED with ABORTED): the rank waits in `released` for RECOVER. */
const RELEASED = { target: '#rank.released', guard: 'released', actions: 'fail' } as const;
/** Elastic: the op ended because a peer left (FAILED, RANK_FAILED naming another rank): masking. */
const LEFT = { target: '#rank.masking', guard: 'peerLeft', actions: 'fail' } as const;
/** RECOVER from a state with no op running (a session or fetches the program left behind included). */
const RECOVER = { target: '#rank.recovering', guard: 'idle', actions: 'recover' } as const;

/** An op taken from `ready` ends in engram.fetching while fetches are in flight, else in ready; a refusal
 * (isRefusal: nothing moved) gives the op's seq back, any other FAILED fails the rank. */
const settleReady = {
  DONE: [{ target: '#rank.engram.fetching', guard: 'fetching', actions: 'done' }, { target: '#rank.ready', actions: 'done' }],
  FAILED: [
    { target: '#rank.engram.fetching', guard: { type: 'refusedWhile', params: { kind: 'fetch' } }, actions: 'refuse' },
    { target: '#rank.ready', guard: 'refused', actions: 'refuse' },
    LEFT,
    RELEASED,
    { target: '#rank.failed', actions: 'fail' },
  ],
} as const;

/** An op's event into its state (ops.ts), counted; `idle`: only while no op runs. */
const begin = (d: OpDescriptor) => ({ target: `#rank.${d.state}`, actions: 'begin' as const });
const beginIdle = (d: OpDescriptor) => ({ ...begin(d), guard: 'idle' as const });
const transitions = <T>(ops: Array<[string, OpDescriptor]>, to: (d: OpDescriptor) => T): Record<string, T> =>
  Object.fromEntries(ops.map(([, d]) => [d.event, to(d)]));

/** The ops `ready` takes, each into its state. */
const READY_OPS = transitions(opsFrom('ready', 'readyAlone'), begin);

/** The ops engram.fetching takes while no op runs (in-flight fetches alone hold the rank there). */
const READY_OPS_WHEN_IDLE = {
  ...transitions(opsFrom('ready'), beginIdle),
  DESTROY: { target: '#rank.destroying', guard: 'idle', actions: 'lifecycle' },
  RECOVER,
} as const;

/** The ops session.open takes, and the session collectives' states while no op runs. */
const SESSION_OPS = transitions(opsFrom('session', 'sessionAlone'), begin);
const SESSION_OPS_WHEN_IDLE = transitions(opsFrom('session'), beginIdle);

/** The states of the ops that run and settle back to ready (not `custom` in ops.ts): one each, made from the table. */
const PLAIN_OP_STATES = Object.fromEntries(
  Object.values(OP_TABLE as Record<string, OpDescriptor>).filter((d) => !d.custom).map((d) => {
    if (d.state.includes('.')) throw new Error(`machines/ops.ts: the state of a plain op must be top-level, not '${d.state}'`);
    return [d.state, { on: settleReady }];
  }),
);

/**
 * A session collective's state (`self`, serving `kind`; `there` serves `other`): DONE, a refusal and
 * COMPLETED stay while ops of this kind are in flight, else go to the other kind's state while its
 * ops are, else to session.open. While only in-flight ops hold it, it takes the session's collectives.
 */
const sessionOp = <S extends string, T extends string>(kind: 'gather' | 'reduce', self: S, there: T) => {
  const other = kind === 'gather' ? 'reduce' : 'gather';
  return {
    on: {
      DONE: [
        { target: self, guard: { type: 'stays', params: { kind } }, actions: 'done' },
        { target: there, guard: { type: 'stays', params: { kind: other } }, actions: 'done' },
        { target: '#rank.session.open', actions: 'done' },
      ],
      FAILED: [
        { target: self, guard: { type: 'refusedWhile', params: { kind } }, actions: 'refuse' },
        { target: there, guard: { type: 'refusedWhile', params: { kind: other } }, actions: 'refuse' },
        { target: '#rank.session.open', guard: 'refused', actions: 'refuse' },
        LEFT,
        RELEASED,
        { target: '#rank.failed', actions: 'fail' },
      ],
      ISSUED: { actions: ['done', 'issue'] },
      COMPLETED: [
        { target: self, guard: { type: 'remainsAfter', params: { kind } }, actions: 'complete' },
        { target: there, guard: { type: 'remainsAfter', params: { kind: other } }, actions: 'complete' },
        { target: '#rank.session.open', actions: 'complete' },
      ],
      ...SESSION_OPS_WHEN_IDLE,
      DESTROY: { target: '#rank.destroying', guard: 'idle', actions: 'lifecycle' },
      RECOVER,
    },
  } as const;
};

export const rankMachine = setup({
  types: {
    context: {} as RankContext,
    events: {} as RankEvent,
    input: {} as RankInput,
  },
  actions: {
    /** A collective starts: name it, and count it (a replay counts its graph's ops). */
    begin: assign(({ context, event }) => ({
      op: OP_OF_EVENT[event.type] ?? null,
      seqBefore: context.seq,
      seq: context.seq + (event.type === 'REPLAY' ? event.ops : 1),
    })),
    /**
     * The op was refused: the machine's count follows the native side's (which takes no number for an
     * op refused before it launched, and keeps the one of an op a kernel refused); without it, the
     * op's number is given back.
     */
    refuse: assign(({ context, event }) => ({ op: null, seq: event.type === 'FAILED' && event.seq !== undefined ? event.seq : context.seqBefore })),
    /** REGISTER and DESTROY are not collectives: no seq. */
    lifecycle: assign(({ event }) => ({ op: event.type === 'REGISTER' ? ('register' as const) : ('destroy' as const) })),
    done: assign({ op: null }),
    /** ISSUED: one more op of its kind in flight */
    issue: assign(({ context, event }) => {
      const kind = (event as { kind: InFlightKind }).kind;
      return { inflight: { ...context.inflight, [kind]: context.inflight[kind] + 1 } };
    }),
    /** COMPLETED: one op of its kind less in flight */
    complete: assign(({ context, event }) => {
      const kind = (event as { kind: InFlightKind }).kind;
      return { inflight: { ...context.inflight, [kind]: Math.max(0, context.inflight[kind] - 1) } };
    }),
    fail: assign({ op: null, error: ({ event }) => (event as { error: FailureInfo }).error }),
    /** RECOVER: nothing runs or is in flight any more, the release is over, the seq is the group's */
    recover: assign(({ event }) => {
      const seq = (event as { seq: number }).seq;
      return { op: 'recover' as const, error: null, seq, seqBefore: seq, inflight: { gather: 0, reduce: 0, fetch: 0 } };
    }),
    /** REJOIN is one collective (its barrier with the replacement) */
    rejoin: assign(({ context }) => ({ op: 'rejoin' as const, seq: context.seq + 1, seqBefore: context.seq })),
    /** REMASK: as RECOVER, at the group's seq, into the new membership */
    remask: assign(({ event }) => {
      const seq = (event as { seq: number }).seq;
      return { op: 'remask' as const, error: null, seq, seqBefore: seq, inflight: { gather: 0, reduce: 0, fetch: 0 } };
    }),
    /** A peer's failure: the rank's own failure stands if it had one (a release is not one: the peer's failure replaces it). */
    recordPeerFailure: assign(({ context, event }) => ({
      error: context.error !== null && context.error.code !== 'ABORTED' ? context.error : (event as { error: FailureInfo }).error,
    })),
  },
  guards: {
    /** The op was refused before it moved anything (isRefusal): the rank stays usable. */
    refused: ({ event }) => event.type === 'FAILED' && isRefusal(event.error.code),
    /** Elastic: a peer left (the op's RANK_FAILED names another rank): the rank lives on, masking it. */
    peerLeft: ({ context, event }) =>
      context.elastic && event.type === 'FAILED' && event.error.code === 'RANK_FAILED' && event.error.rank !== undefined && event.error.rank !== context.rank,
    /** PEER_LEFT reaches only an elastic group's ranks */
    elastic: ({ context }) => context.elastic,
    /** The run released the op (a rank program ended): the rank lives on, out of step until RECOVER. */
    released: ({ event }) => event.type === 'FAILED' && event.error.code === 'ABORTED',
    /** no op runs now (only in-flight ops, if any, hold the rank in its state) */
    idle: ({ context }) => context.op === null,
    /** engram fetches are in flight */
    fetching: ({ context }) => context.inflight.fetch > 0,
    /** ops of `kind` are in flight */
    stays: ({ context }, p: { kind: InFlightKind }) => context.inflight[p.kind] > 0,
    /** a refusal while ops of `kind` are in flight */
    refusedWhile: ({ context, event }, p: { kind: InFlightKind }) =>
      event.type === 'FAILED' && isRefusal(event.error.code) && context.inflight[p.kind] > 0,
    /** after this COMPLETED, ops of `kind` are still in flight */
    remainsAfter: ({ context, event }, p: { kind: InFlightKind }) =>
      context.inflight[p.kind] - (event.type === 'COMPLETED' && event.kind === p.kind ? 1 : 0) > 0,
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
    inflight: { gather: 0, reduce: 0, fetch: 0 },
    elastic: input.elastic ?? false,
  }),
  initial: 'init',
  on: {
    PEER_FAILED: { target: '.failed', actions: 'recordPeerFailure' },
    PEER_LEFT: { target: '.masking', guard: 'elastic', actions: 'fail' },
  },
  states: {
    init: {
      on: {
        REGISTER: { target: 'registerWindow', actions: 'lifecycle' },
        DESTROY: { target: 'destroying', actions: 'lifecycle' },
        PEER_LEFT: {},
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
        ...READY_OPS,
        DESTROY: { target: 'destroying', actions: 'lifecycle' },
        RECOVER,
        REJOIN: { target: 'rejoining', guard: 'elastic', actions: 'rejoin' },
        REMASK: { target: 'remasking', guard: 'elastic', actions: 'remask' },
      },
    },
    // Elastic: a peer left; ops refuse with its RANK_FAILED until the group re-forms (REMASK).
    masking: {
      on: {
        PEER_LEFT: {},
        REMASK: { target: 'remasking', actions: 'remask' },
        DESTROY: { target: 'destroying', actions: 'lifecycle' },
      },
    },
    remasking: {
      on: {
        DONE: { target: 'ready', actions: 'done' },
        FAILED: { target: 'failed', actions: 'fail' },
      },
    },
    rejoining: {
      on: {
        DONE: { target: 'ready', actions: 'done' },
        FAILED: [LEFT, { target: 'failed', actions: 'fail' }],
      },
    },
    // barrier, allGathering, combining, pipeline, replaying (a captured graph's ops, launched at once:
    // one collective of `ops` sequence numbers), and every op added to ops.ts without a state of its own.
    ...PLAIN_OP_STATES,
    dispatching: {
      initial: 'running',
      states: {
        running: { on: { WAITING: 'cpuSync' } },
        // The CPU polls the counters the notify phase wrote (seed 7.3); TIMEOUT_CPU names rank and counter.
        cpuSync: {},
      },
      on: settleReady,
    },
    // An AGRS session (seed 9.4): the rank stays in it between collectives until it is closed.
    session: {
      initial: 'opening',
      states: {
        opening: {
          on: {
            DONE: { target: 'open', actions: 'done' },
            FAILED: [{ target: '#rank.ready', guard: 'refused', actions: 'refuse' }, LEFT, RELEASED, { target: '#rank.failed', actions: 'fail' }],
          },
        },
        open: {
          on: {
            ...SESSION_OPS,
            DESTROY: { target: '#rank.destroying', actions: 'lifecycle' },
            RECOVER,
          },
        },
        // Also while collectives issued with { async: true } are in flight (see sessionOp).
        gathering: sessionOp('gather', '#rank.session.gathering', '#rank.session.reducing'),
        reducing: sessionOp('reduce', '#rank.session.reducing', '#rank.session.gathering'),
        closing: {
          on: {
            DONE: { target: '#rank.ready', actions: 'done' },
            FAILED: [LEFT, RELEASED, { target: '#rank.failed', actions: 'fail' }],
          },
        },
      },
    },
    engram: {
      initial: 'writing',
      states: {
        writing: { on: settleReady },
        // Also while fetches issued with { async: true } are in flight: other ops run meanwhile.
        fetching: {
          on: {
            ...settleReady,
            ISSUED: { actions: ['done', 'issue'] },
            COMPLETED: [
              { target: '#rank.engram.fetching', guard: { type: 'remainsAfter', params: { kind: 'fetch' } }, actions: 'complete' },
              { target: '#rank.ready', actions: 'complete' },
            ],
            ...READY_OPS_WHEN_IDLE,
          },
        },
      },
    },
    // A run's release ended an op here: ops are refused with it until the group's RECOVER.
    released: {
      on: {
        RECOVER,
        DESTROY: { target: 'destroying', actions: 'lifecycle' },
      },
    },
    recovering: {
      on: {
        DONE: { target: 'ready', actions: 'done' },
        FAILED: { target: 'failed', actions: 'fail' },
      },
    },
    failed: {
      on: {
        PEER_FAILED: {},
        PEER_LEFT: {},
        DESTROY: { target: 'destroying', actions: 'lifecycle' },
      },
    },
    destroying: {
      on: {
        DONE: 'destroyed',
        FAILED: 'destroyed',
        PEER_FAILED: {},
        PEER_LEFT: {},
      },
    },
    destroyed: { type: 'final', on: { PEER_FAILED: {}, PEER_LEFT: {} } },
  },
});
