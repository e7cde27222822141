// The collective operations of a rank, one descriptor each: the machine (rank.ts) and the runner
// (workers/runner.ts) derive from this table every list that names an op: the event that starts it,
// the state it runs in, where it is taken, whether the runner memoises its steps, and the op a
// transition record names. Adding an op to the machine is one line here; an op whose state needs
// more than "run, then DONE back to ready or FAILED" (dispatch's CPU-sync wait, the engram and session
// states) names its state `custom` and rank.ts writes that state out.
//
// Where an op is taken (`from`):
//   ready         in `ready`, and in engram.fetching while no op runs (in-flight fetches alone hold it there)
//   readyAlone    in `ready` only (it replaces what in-flight fetches read: a session, the engram table)
//   session       in session.open, and in the session collectives' states while no op runs
//   sessionAlone  in session.open only
export type OpFrom = 'ready' | 'readyAlone' | 'session' | 'sessionAlone';

export interface OpDescriptor {
  /** the machine event that starts it */
  readonly event: string;
  /** the state it runs in (a dotted path under #rank) */
  readonly state: string;
  readonly from: OpFrom;
  /** the runner may take the memoised path for its event (its guards read only the state and the ops in flight) */
  readonly hot: boolean;
  /** rank.ts writes the state out (else it is `{ on: settleReady }`, made from this table) */
  readonly custom?: true;
}

export const OP_TABLE = {
  barrier: { event: 'BARRIER', state: 'barrier', from: 'ready', hot: true },
  allGather: { event: 'ALL_GATHER', state: 'allGathering', from: 'ready', hot: true },
  allReduce: { event: 'ALL_REDUCE', state: 'allReducing', from: 'ready', hot: true },
  dispatch: { event: 'DISPATCH', state: 'dispatching', from: 'ready', hot: true, custom: true },
  combine: { event: 'COMBINE', state: 'combining', from: 'ready', hot: true },
  engramFetch: { event: 'ENGRAM_FETCH', state: 'engram.fetching', from: 'ready', hot: true, custom: true },
  ppExchange: { event: 'PP_EXCHANGE', state: 'pipeline', from: 'ready', hot: true },
  replay: { event: 'REPLAY', state: 'replaying', from: 'ready', hot: true },
  sessionOpen: { event: 'SESSION_OPEN', state: 'session.opening', from: 'readyAlone', hot: false, custom: true },
  engramWrite: { event: 'ENGRAM_WRITE', state: 'engram.writing', from: 'readyAlone', hot: true, custom: true },
  sessionAllGather: { event: 'SESSION_ALL_GATHER', state: 'session.gathering', from: 'session', hot: true, custom: true },
  sessionReduceScatter: { event: 'SESSION_REDUCE_SCATTER', state: 'session.reducing', from: 'session', hot: true, custom: true },
  sessionClose: { event: 'SESSION_CLOSE', state: 'session.closing', from: 'sessionAlone', hot: false, custom: true },
} as const satisfies Record<string, OpDescriptor>;

export type CollectiveName = keyof typeof OP_TABLE;
/** Every op a transition record names: the collectives, and the lifecycle's steps. */
export type OpName = CollectiveName | 'register' | 'recover' | 'destroy' | 'remask' | 'rejoin';
/** The events that start a collective. */
export type OpEventType = (typeof OP_TABLE)[CollectiveName]['event'];

/** The lifecycle's states, and the op a record of the transition out of them names. */
const LIFECYCLE_STATES: Record<string, OpName> = {
  registerWindow: 'register', destroying: 'destroy', recovering: 'recover', remasking: 'remask', rejoining: 'rejoin',
};

const entries = Object.entries(OP_TABLE) as Array<[CollectiveName, OpDescriptor]>;

/** The collectives taken from `from`, as [name, descriptor]. */
export const opsFrom = (...from: OpFrom[]): Array<[CollectiveName, OpDescriptor]> => entries.filter(([, d]) => from.includes(d.from));

/** The collective an event starts (undefined for any other event). */
export const OP_OF_EVENT: Readonly<Record<string, CollectiveName>> = Object.freeze(Object.fromEntries(entries.map(([n, d]) => [d.event, n])));

/**
 * The events whose steps the runner memoises (workers/runner.ts): the hot ops' and the op-progress
 * events. Their step depends only on the state, on whether an op runs and on the counts of ops in
 * flight (the guards read nothing else; FAILED's read the error and always go to the actor).
 */
export const HOT_EVENTS: ReadonlySet<string> = new Set([
  ...entries.filter(([, d]) => d.hot).map(([, d]) => d.event),
  'WAITING', 'DONE', 'ISSUED', 'COMPLETED',
]);

const OP_OF_STATE: Readonly<Record<string, OpName>> = Object.freeze({ ...LIFECYCLE_STATES, ...Object.fromEntries(entries.map(([n, d]) => [d.state, n])) });

/** The op a state serves (its own path, or the nearest enclosing one that serves one), for the record of the transition out of it. */
export function opOfState(state: string): OpName | undefined {
  for (let path = state; ; ) {
    const op = OP_OF_STATE[path];
    if (op) return op;
    const dot = path.lastIndexOf('.');
    if (dot < 0) return undefined;
    path = path.slice(0, dot);
  }
}
