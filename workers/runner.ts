// The runner of one rank inside its worker: it owns the rank's xstate actor and the outbox of reports
// to the main thread, and runs every operation the same way: the op's event into the machine (which
// may refuse it: STATE), the one synchronous native call, then DONE or FAILED out of it. Transitions
// are recorded here (the runner knows the event that caused each) and posted in batches.
import { createActor, type InspectionEvent } from 'xstate';

import { rankMachine, statePath, type FailureInfo, type RankEvent } from '../machines/index.js';
import { RankflowError } from '../actors/core/errors.js';
import { REPORT_BATCH_MS, type WorkerMessage } from './protocol.js';

const now = (): number => performance.timeOrigin + performance.now();

type Post = (m: WorkerMessage) => void;

/** The events ops send, made once (the hot path allocates none). */
export const EVENTS = {
  register: { type: 'REGISTER' },
  barrier: { type: 'BARRIER', withCpuSync: false },
  barrierCpuSync: { type: 'BARRIER', withCpuSync: true },
  allGather: { type: 'ALL_GATHER' },
  dispatch: { type: 'DISPATCH' },
  combine: { type: 'COMBINE' },
  sessionOpen: { type: 'SESSION_OPEN' },
  sessionAllGather: { type: 'SESSION_ALL_GATHER' },
  sessionReduceScatter: { type: 'SESSION_REDUCE_SCATTER' },
  sessionClose: { type: 'SESSION_CLOSE' },
  engramWrite: { type: 'ENGRAM_WRITE' },
  engramFetch: { type: 'ENGRAM_FETCH' },
  ppExchange: { type: 'PP_EXCHANGE' },
  destroy: { type: 'DESTROY' },
} as const satisfies Record<string, RankEvent>;

/** The phases an op went through, as DONE carries them into the transition record. */
export const PHASES = {
  barrier: Object.freeze(['device']),
  barrierCpuSync: Object.freeze(['device', 'cpuSync']),
  dispatch: Object.freeze(['notify', 'cpuSync', 'data']),
  dispatchNoSync: Object.freeze(['notify', 'data']),
  dispatchCached: Object.freeze(['data']),
} as const;

const WAITING: RankEvent = { type: 'WAITING' };
const DONE: RankEvent = { type: 'DONE' };
const doneEvents = new Map<readonly string[], RankEvent>();
const doneWith = (phases?: readonly string[]): RankEvent => {
  if (!phases) return DONE;
  let e = doneEvents.get(phases);
  if (!e) doneEvents.set(phases, (e = { type: 'DONE', phases }));
  return e;
};

export const failureOf = (e: RankflowError): FailureInfo => ({
  code: e.code,
  message: e.message,
  ...(e.rank !== undefined ? { rank: e.rank } : {}),
  ...(e.phase !== undefined ? { phase: e.phase } : {}),
  ...(e.state !== undefined ? { state: e.state } : {}),
});

export class RankRunner {
  private readonly actor;
  private path = 'init';
  private readonly outbox: WorkerMessage[] = [];
  private timer: ReturnType<typeof setTimeout> | undefined;

  constructor(
    readonly rank: number,
    timeouts: { cpuSeconds: number; gpuSeconds: number; firstSeq?: number },
    private readonly port: { postMessage(m: unknown): void },
    inspect: boolean,
  ) {
    this.actor = createActor(rankMachine, {
      input: { rank, ...timeouts },
      ...(inspect ? { inspect: (rec: InspectionEvent) => this.post({ kind: 'inspect', record: this.plainInspection(rec) }) } : {}),
    });
    this.actor.start();
  }

  /** The rank's state, as a dotted path. */
  state(): string {
    return this.path;
  }
  seq(): number {
    return this.actor.getSnapshot().context.seq;
  }

  /**
   * Runs op `fn` as one pass of the machine: `event` in (a STATE error if the machine does not take
   * it, the rank's failure if it failed), fn, then DONE (with `phases`) or FAILED out.
   */
  run<T>(event: RankEvent, fn: () => T, phases?: readonly string[]): T {
    this.enter(event);
    let out: T;
    try {
      out = fn();
    } catch (e) {
      this.fail(e);
    }
    this.send(doneWith(phases));
    return out;
  }

  /** The op in progress waits (a dispatch's CPU sync): a state while it lasts, reported at once. */
  waiting(): void {
    this.send(WAITING);
    this.flush();
  }

  /** Moves the machine into `event`'s state, or throws why it cannot. */
  enter(event: RankEvent): void {
    const before = this.actor.getSnapshot();
    if (before.value === 'failed' && before.context.error && event.type !== 'DESTROY') {
      const e = before.context.error;
      throw new RankflowError(e.code as never, e.message, { rank: e.rank, state: 'failed', phase: e.phase });
    }
    this.send(event);
    if (this.actor.getSnapshot() === before)
      throw new RankflowError('STATE', `rank ${this.rank} is in state '${this.path}' and cannot take ${event.type}`, { rank: this.rank, state: this.path });
  }

  /** The op in progress threw: FAILED (EINVAL: refused, the rank stays usable); rethrows it. */
  fail(e: unknown): never {
    const f = RankflowError.from(e);
    // The state it failed in, for whoever reads the error later (the op's state, not 'failed').
    const error = f.state !== undefined ? f : new RankflowError(f.code, f.message, { rank: f.rank, phase: f.phase, state: this.path });
    this.send({ type: 'FAILED', error: failureOf(error) });
    throw error;
  }

  done(phases?: readonly string[]): void {
    this.send(doneWith(phases));
  }

  peerFailed(error: FailureInfo): void {
    if (this.actor.getSnapshot().status === 'active') this.send({ type: 'PEER_FAILED', error });
  }

  stop(): void {
    this.actor.stop();
  }

  private send(event: RankEvent): void {
    this.actor.send(event);
    const snap = this.actor.getSnapshot();
    const to = statePath(snap.value);
    if (to === this.path) return;
    const from = this.path;
    this.path = to;
    const c = snap.context;
    const phases = (event as { phases?: readonly string[] }).phases;
    this.post({
      kind: 'transition',
      transition: {
        rank: this.rank, from, to, event: event.type, at: now(), seq: c.seq,
        ...(c.op ? { op: c.op } : event.type === 'DONE' || event.type === 'FAILED' ? { op: opOf(from) } : {}),
        ...(phases ? { phases } : {}),
        ...(to === 'failed' && c.error ? { phase: c.error.phase ?? c.error.state, error: c.error } : {}),
      },
    });
  }

  /** Reports are batched for up to REPORT_BATCH_MS; a comlink reply flushes first (rank.ts). */
  post(m: WorkerMessage): void {
    this.outbox.push(m);
    this.timer ??= setTimeout(() => this.flush(), REPORT_BATCH_MS);
  }

  flush(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    if (this.outbox.length === 0) return;
    const batch = this.outbox.splice(0);
    this.port.postMessage(batch.length === 1 ? batch[0] : { kind: 'batch', messages: batch });
  }

  private plainInspection(rec: InspectionEvent): Record<string, unknown> {
    const out: Record<string, unknown> = { type: rec.type, rank: this.rank, actorId: (rec.actorRef as { id?: string }).id, sessionId: rec.actorRef.sessionId, at: now() };
    if ('event' in rec && rec.event) {
      const o: Record<string, unknown> = {};
      for (const [k, v] of Object.entries(rec.event as { type: string })) if (v === null || ['string', 'number', 'boolean'].includes(typeof v)) o[k] = v;
      out.event = o;
    }
    if (rec.type === '@xstate.snapshot') {
      const s = rec.snapshot as { value?: unknown; status?: string };
      out.value = s.value;
      out.status = s.status;
    }
    if (rec.type === '@xstate.action') out.action = { type: rec.action.type };
    return out;
  }
}

/** The op a state serves, for the record of the transition out of it. */
function opOf(state: string): string | undefined {
  const top = state.split('.')[0]!;
  const map: Record<string, string> = {
    barrier: 'barrier', allGathering: 'allGather', dispatching: 'dispatch', combining: 'combine', pipeline: 'ppExchange', replaying: 'replay',
    registerWindow: 'register', destroying: 'destroy',
  };
  if (top === 'session') return ({ opening: 'sessionOpen', gathering: 'sessionAllGather', reducing: 'sessionReduceScatter', closing: 'sessionClose' } as Record<string, string>)[state.split('.')[1] ?? ''];
  if (top === 'engram') return state.endsWith('writing') ? 'engramWrite' : 'engramFetch';
  return map[top];
}
