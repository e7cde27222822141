// The runner of one rank inside its worker: it owns the rank's xstate actor and the outbox of reports
// to the main thread, and runs every operation the same way: the op's event into the machine (which
// may refuse it: STATE), the one synchronous native call, then DONE or FAILED out of it. Transitions
// are recorded here (the runner knows the event that caused each), as numbers on the hot path
// (transition-log.ts), and posted in batches.
import { createActor, type Actor, type InspectionEvent, type StateValue } from 'xstate';

import { HOT_EVENTS, OP_TABLE, isRefusal, opOfState, rankMachine, statePath, type CollectiveName, type FailureInfo, type OpName, type RankEvent } from '../machines/index.js';
import { RankflowError } from '../actors/core/errors.js';
import { MAX_BATCH_RECORDS, REPORT_BATCH_MS, type WorkerMessage } from './protocol.js';
import { TransitionLog } from './transition-log.js';
import { plainInspection } from './inspection-record.js';

// The thread's time origin is fixed: read once (its getter costs a brand check per transition).
const origin = performance.timeOrigin;
const now = (): number => origin + performance.now();

type Post = (m: WorkerMessage) => void;

type OpEvents = { [N in Exclude<CollectiveName, 'barrier' | 'replay'>]: { readonly type: (typeof OP_TABLE)[N]['event'] } };

/** The events ops send, one per op of machines/ops.ts, made once (the hot path allocates none). */
export const EVENTS = Object.freeze({
  ...(Object.fromEntries(Object.entries(OP_TABLE).filter(([n]) => n !== 'barrier' && n !== 'replay').map(([n, d]) => [n, Object.freeze({ type: d.event })])) as OpEvents),
  register: { type: 'REGISTER' },
  barrier: { type: 'BARRIER', withCpuSync: false },
  barrierCpuSync: { type: 'BARRIER', withCpuSync: true },
  destroy: { type: 'DESTROY' },
  rejoin: { type: 'REJOIN' },
} as const satisfies Record<string, RankEvent>);

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

/**
 * Elastic groups of one process on host (RankInit.blamesTimeouts): a wait that timed out on a peer
 * (TIMEOUT_CPU / TIMEOUT_GPU naming it) is that peer's failure, not the waiter's: the peer did not
 * answer, so it leaves (Ranks.onTransition) and the op rejects with RANK_FAILED naming it, the timeout
 * as its cause. Elsewhere (not elastic; cuda, where the timeout ended the waiter's protocol state; a
 * world, where the peer may be another process's) the waiter fails, as before.
 */
function blameTimeout(e: RankflowError, self: number, blames: boolean): RankflowError {
  if (!blames || (e.code !== 'TIMEOUT_CPU' && e.code !== 'TIMEOUT_GPU') || e.rank === undefined || e.rank < 0 || e.rank === self) return e;
  return new RankflowError('RANK_FAILED', `rank ${e.rank} left the group: it did not answer in time (${e.message})`,
    { rank: e.rank, ...(e.phase !== undefined ? { phase: e.phase } : {}), ...(e.state !== undefined ? { state: e.state } : {}), cause: e });
}

/**
 * What one hot event does from one state, learnt from the machine the first time it happens there:
 * the target, how the context's seq moves (a replay by its ops) and the op it then serves.
 */
interface Step {
  to: string;
  toValue: StateValue;
  toId: number;
  seq: number | 'ops';
  /** the step is an op's beginning: seqBefore becomes the seq before it */
  marksBefore: boolean;
  op: OpName | null;
  opId: number;
  /** how the ops in flight change (ISSUED: +1 of its kind, COMPLETED: -1) */
  inflight: InFlightCounts;
  /** the steps learnt from where this one leads (that context and state), once they exist */
  next?: Map<string, Step>;
  /** the event's index in the transition log's name table, once recorded */
  eventId?: number;
}

type InFlightCounts = { gather: number; reduce: number; fetch: number };
const NONE_IN_FLIGHT: InFlightCounts = Object.freeze({ gather: 0, reduce: 0, fetch: 0 });
/** Steps are learnt with up to this many ops of a kind in flight (the guards read the counts). */
const MAX_MEMO_IN_FLIGHT = 64;

const eventKey = (e: RankEvent): string => (e.type === 'ISSUED' || e.type === 'COMPLETED' ? `${e.type}:${e.kind}` : e.type);
const contextKey = (busy: boolean, i: InFlightCounts): string => `${busy ? 1 : 0}|${i.gather},${i.reduce},${i.fetch}`;

/**
 * The machine's decisions at the cost of two map lookups. An xstate send costs ~5 us (two per op: a
 * barrier's whole budget), so each hot (state, event) pair is sent to the actor once, and what the
 * machine did is memoised as a Step and replayed by the runner from then on, with the context's seq
 * and op kept here. The actor is brought up to date (a snapshot resolved from the state and context
 * here) before any other event: a refusal, a failure, a peer's failure, the lifecycle. Ops issued and
 * completed asynchronously are memoised too, keyed by the counts in flight (the guards read them).
 * With `inspect` every event goes to the actor, so the inspection stream has them all.
 */
export class RankRunner {
  private actor: Actor<typeof rankMachine>;
  private readonly input;
  /** elastic, where a wait that timed out leaves the waiter whole (host): the peer it waited for is blamed (blameTimeout) */
  private readonly blamesTimeouts: boolean;
  private stale = false;
  /** steps by context (op running or not, the counts in flight), then state, then event */
  private readonly steps = new Map<string, Map<string, Map<string, Step>>>();
  /**
   * The steps from the context and state now (undefined: not looked up, or none learnt yet). A step
   * leads to one context and state (it was learnt in one), so it keeps the steps from there (next).
   */
  private here: Map<string, Step> | undefined;
  /** the machine's inflight counts (kept here between actor updates) */
  private inFlight: InFlightCounts = NONE_IN_FLIGHT;
  /** the context keys for the counts now, without and with an op running (made when the counts change) */
  private idleKey = contextKey(false, NONE_IN_FLIGHT);
  private busyKey = contextKey(true, NONE_IN_FLIGHT);
  // The rank's state as the machine left it (kept here between actor updates).
  private path = 'init';
  private value: StateValue = 'init';
  private pathId: number;
  private seqNow = 0;
  /** the machine's seqBefore (the seq before the op in progress: a refusal gives it back) */
  private seqBefore = 0;
  private op: OpName | null = null;
  private readonly log: TransitionLog;
  private readonly outbox: WorkerMessage[] = [];
  private timer: ReturnType<typeof setTimeout> | undefined;
  private readonly flushSoon = () => this.flush();
  private batchFrom = 0;  // when the batch being queued began (ms, the records' clock)
  /** the native context's sequence number (a refused op may or may not have taken one) */
  nativeSeq?: () => number;
  /** native seq - the machine's, fixed once the rank is registered (registering takes a native number) */
  private seqOffset?: number;

  constructor(
    readonly rank: number,
    timeouts: { cpuSeconds: number; gpuSeconds: number; firstSeq?: number; elastic?: boolean; blamesTimeouts?: boolean },
    private readonly port: { postMessage(m: unknown): void },
    private readonly inspect: boolean,
  ) {
    const { blamesTimeouts, ...input } = timeouts;
    this.input = { rank, ...input };
    this.blamesTimeouts = blamesTimeouts === true;
    this.seqNow = this.seqBefore = timeouts.firstSeq ?? 0;
    this.log = new TransitionLog(rank);
    this.pathId = this.log.id('init');
    this.actor = this.makeActor();
  }

  private makeActor(snapshot?: ReturnType<typeof rankMachine.resolveState>): Actor<typeof rankMachine> {
    const a = createActor(rankMachine, {
      input: this.input,
      ...(snapshot ? { snapshot } : {}),
      ...(this.inspect ? { inspect: (rec: InspectionEvent) => this.post({ kind: 'inspect', record: plainInspection(rec, this.rank, now()) }) } : {}),
    });
    a.start();
    return a;
  }

  /** The rank's state, as a dotted path. */
  state(): string {
    return this.path;
  }
  seq(): number {
    return this.seqNow;
  }
  /** The rank is registered, nothing in progress: from now on the two counts move together. */
  alignSeq(): void {
    const native = this.nativeSeq?.();
    if (native !== undefined) this.seqOffset = native - this.seqNow;
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
    // A failed rank refuses with its failure; a released one (a run's release ended its op) with the
    // release, until the group's RECOVER; a masking one (elastic: a peer left) with the peer's leaving.
    const waits = this.path === 'released' ? 'RECOVER' : this.path === 'masking' ? 'REMASK' : undefined;
    if ((this.path === 'failed' || (waits !== undefined && event.type !== waits)) && event.type !== 'DESTROY') {
      const e = this.actorNow().getSnapshot().context.error;
      if (e) throw new RankflowError(e.code as never, e.message, { rank: e.rank, state: this.path, phase: e.phase });
    }
    if (!this.send(event))
      throw new RankflowError('STATE', `rank ${this.rank} is in state '${this.path}' and cannot take ${event.type}`, { rank: this.rank, state: this.path });
  }

  /** The op in progress threw: FAILED (a refusal, isRefusal: the rank stays usable); rethrows it. */
  fail(e: unknown): never {
    const f = blameTimeout(RankflowError.from(e), this.rank, this.blamesTimeouts);
    // The state it failed in, for whoever reads the error later (the op's state, not 'failed').
    const error = f.state !== undefined ? f : new RankflowError(f.code, f.message, { rank: f.rank, phase: f.phase, state: this.path });
    const native = isRefusal(error.code) && this.seqOffset !== undefined ? this.nativeSeq?.() : undefined;
    const seq = native !== undefined ? native - this.seqOffset! : undefined;
    this.send({ type: 'FAILED', error: failureOf(error), ...(seq !== undefined ? { seq } : {}) });
    throw error;
  }

  done(phases?: readonly string[]): void {
    this.send(doneWith(phases));
  }

  /** The rank's failure, as every op on a failed rank rejects with it (undefined unless it failed). */
  failure(): RankflowError | undefined {
    if (this.path !== 'failed') return undefined;
    const s = this.actorNow().getSnapshot();
    const e = s.value === 'failed' ? s.context.error : null;
    return e ? new RankflowError(e.code as never, e.message, { rank: e.rank, state: 'failed', phase: e.phase }) : undefined;
  }

  /** The op in progress was started asynchronously (ISSUED), or one in flight was waited for (COMPLETED). */
  inflight(event: Extract<RankEvent, { type: 'ISSUED' | 'COMPLETED' }>): void {
    this.send(event);
  }

  /**
   * The run is over and the group re-synchronises the rank (`nativeSeq`: the group's sequence number):
   * RECOVER, fn (the native recovery), then DONE into ready (a failure of fn fails the rank).
   */
  recover(nativeSeq: number, fn: () => void): void {
    this.run({ type: 'RECOVER', seq: nativeSeq - (this.seqOffset ?? 0) }, fn);
  }

  /** Elastic: the group re-formed (`nativeSeq`: the group's): REMASK, fn (the native remask), DONE into ready. */
  remask(nativeSeq: number, fn: () => void): void {
    this.run({ type: 'REMASK', seq: nativeSeq - (this.seqOffset ?? 0) }, fn);
  }

  /** Elastic: a peer left the group (the main thread raised the left word already). */
  peerLeft(error: FailureInfo): void {
    if (this.actorNow().getSnapshot().status === 'active') this.send({ type: 'PEER_LEFT', error });
  }

  peerFailed(error: FailureInfo): void {
    if (this.actorNow().getSnapshot().status === 'active') this.send({ type: 'PEER_FAILED', error });
  }

  stop(): void {
    this.actor.stop();
  }

  /** The actor, brought up to the state and context the memoised steps left. */
  private actorNow(): Actor<typeof rankMachine> {
    if (this.stale) {
      const ctx = this.actor.getSnapshot().context;
      this.actor.stop();
      this.actor = this.makeActor(rankMachine.resolveState({ value: this.value, context: { ...ctx, seq: this.seqNow, seqBefore: this.seqBefore, op: this.op, inflight: { ...this.inFlight } } }));
      this.stale = false;
    }
    return this.actor;
  }

  /** One event into the machine; false when the machine did not take it. */
  private send(event: RankEvent): boolean {
    // Guards read the context (an op running; the ops in flight): steps are kept apart by both.
    const step = this.inspect ? undefined : (this.here ??= this.stepsHere())?.get(eventKey(event));
    if (step) {
      const fromId = this.pathId;
      const d = step.inflight;
      if (d !== NONE_IN_FLIGHT) {
        const i = this.inFlight;
        this.setInFlight({ gather: i.gather + d.gather, reduce: i.reduce + d.reduce, fetch: i.fetch + d.fetch });
      }
      this.path = step.to;
      this.value = step.toValue;
      this.pathId = step.toId;
      if (step.marksBefore) this.seqBefore = this.seqNow;
      this.seqNow += step.seq === 'ops' ? (event as { ops: number }).ops : step.seq;
      this.op = step.op;
      this.here = step.next ??= this.stepsHere();
      this.stale = true;
      if (this.pathId === fromId) return true;  // no transition (an op issued or completed in its state)
      const phases = (event as { phases?: readonly string[] }).phases;
      this.record(fromId, this.pathId, step.eventId ??= this.log.id(event.type), step.opId, phases ? this.log.phases(phases) : -1);
      return true;
    }
    const actor = this.actorNow();
    const before = actor.getSnapshot();
    actor.send(event);
    const snap = actor.getSnapshot();
    if (snap === before) return false;
    const to = statePath(snap.value);
    const c = snap.context;
    if (!this.inspect && HOT_EVENTS.has(event.type) && c.error === before.context.error) this.learn(event, before.context, snap, to);
    if (c.inflight !== this.inFlight) this.setInFlight(c.inflight);
    const from = this.path;
    const fromId = this.pathId;
    this.path = to;
    this.value = snap.value;
    this.pathId = this.log.id(to);
    this.seqNow = c.seq;
    this.seqBefore = c.seqBefore;
    this.op = c.op;
    this.here = undefined;
    if (to === from) return true;
    const phases = (event as { phases?: readonly string[] }).phases;
    if ((to === 'failed' || to === 'released' || to === 'masking') && c.error) {
      this.post({
        kind: 'transition',
        transition: {
          rank: this.rank, from, to, event: event.type, at: now(), seq: c.seq,
          ...(c.op ? { op: c.op } : event.type === 'FAILED' ? { op: opOfState(from) } : {}),
          phase: c.error.phase ?? c.error.state, error: c.error,
        },
      });
      return true;
    }
    const op = c.op ?? (event.type === 'DONE' || event.type === 'FAILED' || event.type === 'COMPLETED' ? opOfState(from) : undefined);
    this.record(fromId, this.pathId, this.log.id(event.type), op ? this.log.id(op) : -1, phases ? this.log.phases(phases) : -1);
    return true;
  }

  /** The steps learnt from the context and state now (undefined if none). */
  private stepsHere(): Map<string, Step> | undefined {
    return this.steps.get(this.op !== null ? this.busyKey : this.idleKey)?.get(this.path);
  }

  /** Remembers what the machine did with a hot event here, to replay it next time without the actor. */
  private setInFlight(i: InFlightCounts): void {
    const was = this.inFlight;
    this.inFlight = i;
    if (i.gather === was.gather && i.reduce === was.reduce && i.fetch === was.fetch) return;
    this.idleKey = contextKey(false, i);
    this.busyKey = contextKey(true, i);
  }

  private learn(event: RankEvent, before: { seq: number; seqBefore: number; op: OpName | null; inflight: InFlightCounts }, snap: ReturnType<Actor<typeof rankMachine>['getSnapshot']>, to: string): void {
    const bi = before.inflight, ai = snap.context.inflight;
    if (Math.max(bi.gather, bi.reduce, bi.fetch, ai.gather, ai.reduce, ai.fetch) > MAX_MEMO_IN_FLIGHT) return;
    const d = { gather: ai.gather - bi.gather, reduce: ai.reduce - bi.reduce, fetch: ai.fetch - bi.fetch };
    // Only ISSUED / COMPLETED move the counts, by one of their kind (COMPLETED's clamp at 0 included).
    const kind = event.type === 'ISSUED' || event.type === 'COMPLETED' ? event.kind : null;
    for (const k of ['gather', 'reduce', 'fetch'] as const)
      if (d[k] !== 0 && (k !== kind || Math.abs(d[k]) !== 1)) return;
    const inflight = d.gather === 0 && d.reduce === 0 && d.fetch === 0 ? NONE_IN_FLIGHT : d;
    const delta = snap.context.seq - before.seq;
    // The step either marks where the op began (seqBefore = the seq before it) or leaves seqBefore be.
    const marksBefore = snap.context.seqBefore !== before.seqBefore || (delta !== 0 && snap.context.seqBefore === before.seq);
    if (marksBefore && snap.context.seqBefore !== before.seq) return;  // anything else: not memoised
    const seq = event.type === 'REPLAY' ? (delta === (event as { ops: number }).ops ? 'ops' : null) : delta;
    if (seq === null) return;
    const op = snap.context.op ?? (event.type === 'DONE' || event.type === 'COMPLETED' ? opOfState(this.path) ?? null : null);
    const ck = contextKey(before.op !== null, bi);
    let states = this.steps.get(ck);
    if (!states) this.steps.set(ck, (states = new Map()));
    let here = states.get(this.path);
    if (!here) states.set(this.path, (here = new Map()));
    here.set(eventKey(event), { to, toValue: snap.value, toId: this.log.id(to), seq, marksBefore, op: snap.context.op, opId: op ? this.log.id(op) : -1, inflight });
  }

  private record(from: number, to: number, event: number, op: number, phases: number): void {
    const at = now();
    this.log.push(from, to, event, at, this.seqNow, op, phases);
    this.queued(at);
  }

  /** Reports are batched for up to REPORT_BATCH_MS; a comlink reply flushes first (rank.ts). */
  post(m: WorkerMessage): void {
    const t = this.log.take();
    if (t) this.outbox.push(t);
    this.outbox.push(m);
    this.queued(now());
  }

  // Queued at `at`: a batch's first starts its timer; a program that never yields (microtasks only) never runs it, so the batch also goes from here once REPORT_BATCH_MS old or MAX_BATCH_RECORDS long.
  private queued(at: number): void {
    if (this.timer === undefined) {
      this.timer = setTimeout(this.flushSoon, REPORT_BATCH_MS);
      this.batchFrom = at;
    } else if (at - this.batchFrom >= REPORT_BATCH_MS || this.log.size >= MAX_BATCH_RECORDS || this.outbox.length >= MAX_BATCH_RECORDS) {
      this.flush();
    }
  }

  flush(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    const t = this.log.take();
    if (t) this.outbox.push(t);
    if (this.outbox.length === 0) return;
    const batch = this.outbox.splice(0);
    this.port.postMessage(batch.length === 1 ? batch[0] : { kind: 'batch', messages: batch });
  }
}

