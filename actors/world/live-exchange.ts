// The survivors' exchange of an elastic world (actors/elastic.ts): an all-gather like the session's
// `exchange`, but among the processes that are not lost. A process lost before or while an exchange
// runs gives null; the exchange fails only if the leader is lost (it relays every value: a star), the
// session closes, or a survivor gives nothing within the timeout. Its own numbering ('lx' messages):
// the formation's exchanges refuse after a loss, these are made for it. A second one ('jx') carries
// the rejoins' agreements (actors/elastic-join.ts), numbered apart from the re-formings'. The leader's
// table of what it gathered (Gathering) also serves the run ends' exchange (world/run-exchange.ts).
// When the leader is lost (takeover.ts), a follower hands on its count, the exchanges it waits on and
// the last ones it saw complete; the new leader gives every waiting process the result one of them saw
// (the old leader may have told some and not others), and gathers the others anew without the old one.
// The rejoins' exchanges go by rounds instead (LeaderJoins): a rejoin that ended part-way (its process
// left, the leader was lost) leaves the survivors at different counts, so each rejoin's exchanges are
// numbered from a base the leader sends with it, past every earlier one's.
import { RankflowError } from '../core/errors.js';
import { isInt, jsonBytes, quote, toWire, who, type Incoming, type Message } from './protocol.js';
import type { RendezvousPeer } from './rendezvous.js';

/** The largest value a process gives: a membership's numbers (elastic.ts) are ~100 bytes. */
export const LIVE_VALUE_BYTES = 4096;
// How far a follower may run ahead of the leader: in step, at most one.
export const MAX_AHEAD = 16;
// Completed exchanges each side remembers for a change of leader: in step, a process is at most one past another.
export const DONE_KEPT = 4;

/** The two kinds: the re-formings' ('lx') and the rejoins' ('jx'). */
export type LiveKind = { ask: 'lx'; all: 'lxall' } | { ask: 'jx'; all: 'jxall' };
export const REFORM: LiveKind = { ask: 'lx', all: 'lxall' };
export const REJOIN: LiveKind = { ask: 'jx', all: 'jxall' };

interface Waiter { resolve: (v: unknown[]) => void; reject: (e: RankflowError) => void; timer: NodeJS.Timeout }
/** A follower's wait (here and in run-exchange.ts): `expire` is what its timer runs (restartClocks sets the timer again). */
export interface Expiring { timer: NodeJS.Timeout; expire: () => void }
type FollowerWaiter = Waiter & Expiring & { value: unknown };

/**
 * The leader was lost (follower-session.ts): each wait's clock starts again at `ms`, past the
 * takeover's and the resumes' own deadlines, so that what the waiters hear is the takeover's outcome
 * (the next leader's answer, or its RANK_FAILED), not their own timeout racing it.
 */
export function restartClocks(waits: Iterable<Expiring>, ms: number): void {
  for (const w of waits) {
    clearTimeout(w.timer);
    w.timer = setTimeout(w.expire, ms);
  }
}

/** A follower's exchanges as it hands them on at a change of leader (the wire form has no waiters: world/resume.ts). */
export interface LiveHandOver {
  at: number;
  waiting: Array<{ seq: number; value: unknown; waiter?: Waiter }>;
  done: Array<{ seq: number; values: unknown[] }>;
}
/** What the leader sends: to every process (a completed exchange), or to one (a result it missed). */
export interface LeaderOut { broadcast(m: Message): void; sendTo(index: number, m: Message): void }

/** What a leader gathered of one exchange: each process's value, and which gave one. */
export interface Gathering { values: unknown[]; have: boolean[] }

/** A new entry for `processes` processes. */
export const gathering = (processes: number): Gathering => ({ values: Array(processes).fill(null), have: Array(processes).fill(false) });

/** Records process `index`'s value; false if it had given one (the first counts). */
export function give(g: Gathering, index: number, value: unknown): boolean {
  if (g.have[index]) return false;
  g.values[index] = value ?? null;
  g.have[index] = true;
  return true;
}

/** The values once every process not lost gave one (null for a lost one), else undefined. */
export function gathered(g: Gathering, isLost: (index: number) => boolean): unknown[] | undefined {
  if (!g.have.every((h, i) => h || isLost(i))) return undefined;
  return g.values.map((v, i) => (g.have[i] && !isLost(i) ? v : null));
}

function checked(value: unknown, where: string, seq: number): unknown {
  const wire = toWire(value, `survivors' exchange #${seq} value`);
  const bytes = jsonBytes(wire);
  if (bytes > LIVE_VALUE_BYTES) throw new RankflowError('EINVAL', `${where}: survivors' exchange #${seq} value is ${bytes} bytes of JSON; at most ${LIVE_VALUE_BYTES}`);
  return wire;
}

/** What both sides keep: the exchanges' numbering, the failure that ends them, and how one starts. */
abstract class LiveSide {
  protected seq = 0;
  protected failed?: RankflowError;

  constructor(protected readonly where: string, protected readonly timeoutMs: number, protected readonly kind: LiveKind) {}

  /** The exchanges made so far (a rejoiner starts its count there). */
  get at(): number {
    return this.seq;
  }

  /** The next exchange's number and its value as it goes on the wire; throws why it cannot start (failed, too big). */
  protected start(value: unknown): { seq: number; wire: unknown } {
    const seq = ++this.seq;
    if (this.failed) throw this.failed;
    return { seq, wire: checked(value, this.where, seq) };
  }
}

/** The leader's side: gathers the values of the processes not lost and hands the result to every one. */
export class LeaderLive extends LiveSide {
  private readonly pending = new Map<number, Gathering & { waiter?: Waiter }>();
  /** the exchanges completed lately and their results (for a follower that resumes waiting on one) */
  private readonly decided = new Map<number, unknown[]>();

  constructor(
    private readonly peers: readonly RendezvousPeer[],
    private readonly self: number,
    private readonly isLost: (index: number) => boolean,
    private readonly out: LeaderOut,
    where: string,
    timeoutMs: number,
    kind: LiveKind = REFORM,
  ) {
    super(where, timeoutMs, kind);
  }

  async exchange(value: unknown, timeoutMs = this.timeoutMs): Promise<unknown[]> {
    const { seq, wire } = this.start(value);
    return new Promise((resolve, reject) => {
      const p = this.entry(seq);
      const timer = setTimeout(() => {
        this.pending.delete(seq);
        const late = this.peers.filter((_, i) => !p.have[i] && !this.isLost(i));
        reject(new RankflowError('TIMEOUT_CPU', `${this.where}: survivors' exchange #${seq}: no value from ${late.map(who).join(', ')} after ${timeoutMs} ms`,
          late[0] ? { rank: late[0].rankOffset } : undefined));
      }, timeoutMs);
      p.waiter = { resolve, reject, timer };
      this.contribute(seq, this.self, wire);
    });
  }

  /** A follower's 'lx' (checked here: a problem is returned, and the caller drops the follower). */
  onMessage(index: number, m: Incoming): string | undefined {
    if (!isInt(m.seq, 1, this.seq + MAX_AHEAD)) return `it sent a value for survivors' exchange #${quote(m.seq)} while the leader is at #${this.seq}`;
    if (jsonBytes(m.value) > LIVE_VALUE_BYTES) return `it sent a ${jsonBytes(m.value)}-byte survivors' exchange value`;
    this.contribute(m.seq, index, m.value);
    return undefined;
  }

  /** A process was lost: the exchanges that waited only for it end without it. */
  recheck(): void {
    for (const seq of [...this.pending.keys()]) this.complete(seq);
  }

  /** This process, a follower until now, leads: its count, its exchanges waiting (its values given), those it saw complete. */
  adopt(h: LiveHandOver): void {
    this.seq = h.at;
    for (const d of h.done) this.remember(d.seq, d.values);
    for (const w of h.waiting) {
      const values = this.decided.get(w.seq);
      if (values !== undefined) {
        if (w.waiter) (clearTimeout(w.waiter.timer), w.waiter.resolve(values));
        continue;
      }
      const p = this.entry(w.seq);
      p.waiter = w.waiter;
      give(p, this.self, w.value);
      this.complete(w.seq);
    }
  }

  /** Follower `index` resumed (checked: world/resume.ts): the results it saw complete end those exchanges; its waiting values count, or it gets the result. */
  resume(index: number, h: LiveHandOver): void {
    for (const d of h.done) if (!this.decided.has(d.seq)) this.finish(d.seq, d.values);
    for (const w of h.waiting) {
      const values = this.decided.get(w.seq);
      if (values !== undefined) this.out.sendTo(index, { t: this.kind.all, seq: w.seq, values });
      else this.contribute(w.seq, index, w.value);
    }
  }

  /** Exchange `seq` completed elsewhere, with these values: every process that waits on it here gets them. */
  private finish(seq: number, values: unknown[]): void {
    this.remember(seq, values);
    const p = this.pending.get(seq);
    if (!p) return;
    this.pending.delete(seq);
    p.have.forEach((h, i) => h && i !== this.self && this.out.sendTo(i, { t: this.kind.all, seq, values }));
    if (p.waiter) (clearTimeout(p.waiter.timer), p.waiter.resolve(values));
  }

  private remember(seq: number, values: unknown[]): void {
    this.decided.set(seq, values);
    if (this.decided.size > DONE_KEPT) this.decided.delete(this.decided.keys().next().value!);
  }

  fail(error: RankflowError): void {
    this.failed ??= error;
    for (const [seq, p] of this.pending) {
      if (!p.waiter) continue;
      clearTimeout(p.waiter.timer);
      this.pending.delete(seq);
      p.waiter.reject(error);
    }
  }

  /** Every exchange gathering ends: this process's waiters with `error`, what others gave is dropped (and what they still give for them). */
  protected dropPending(error: RankflowError): void {
    for (const p of this.pending.values()) if (p.waiter) (clearTimeout(p.waiter.timer), p.waiter.reject(error));
    this.pending.clear();
  }

  private entry(seq: number) {
    let p = this.pending.get(seq);
    if (!p) this.pending.set(seq, (p = gathering(this.peers.length)));
    return p;
  }

  private contribute(seq: number, index: number, value: unknown): void {
    if (seq <= this.seq && !this.pending.has(seq) && index !== this.self) return;  // one we gave up on
    if (give(this.entry(seq), index, value)) this.complete(seq);
  }

  private complete(seq: number): void {
    const p = this.pending.get(seq);
    const values = p?.waiter ? gathered(p, this.isLost) : undefined;
    if (!p?.waiter || !values) return;
    this.pending.delete(seq);
    clearTimeout(p.waiter.timer);
    this.remember(seq, values);
    this.out.broadcast({ t: this.kind.all, seq, values });
    p.waiter.resolve(values);
  }
}

/**
 * The leader's side of the rejoins' exchanges (REJOIN). A rejoin's two exchanges (its join point, its
 * numbers: actors/elastic-join.ts) are its round: numbered from the base the leader sends with the
 * rejoin ('rejoining'), two past the last round's and not below any process's count; the exchanges
 * of ended rounds end there, and values for them that still come are dropped (below the count). After
 * a change of leader no round goes on (the rejoin in progress ended with the leader: takeover.ts):
 * the survivors' waits ended with it, and the resumes give only their counts.
 */
export class LeaderJoins extends LeaderLive {
  private base = -2;

  constructor(peers: readonly RendezvousPeer[], self: number, isLost: (index: number) => boolean, out: LeaderOut, where: string, timeoutMs: number) {
    super(peers, self, isLost, out, where, timeoutMs, REJOIN);
  }

  /** A rejoin begins: its round's base (the count its exchanges start after). */
  newRound(): number {
    const base = Math.max(this.base + 2, this.seq + (this.seq % 2));
    this.dropPending(roundEnded(this.where));
    this.base = this.seq = base;
    return base;
  }

  /** Its own count as a follower until now (its waits ended when the leader was lost: FollowerLive.endRound). */
  override adopt(h: LiveHandOver): void {
    this.seq = h.at;
  }

  override resume(_index: number, h: LiveHandOver): void {
    this.seq = Math.max(this.seq, h.at);
  }
}

/** What a rejoin's exchange still waiting ends with once its round is over. */
const roundEnded = (where: string): RankflowError =>
  new RankflowError('RANK_FAILED', `${where}: the rejoin these survivors' exchanges were for ended (a later one began, or the leader was lost)`);

/** A follower's side: sends its value to the leader and waits for the gathered ones. */
export class FollowerLive extends LiveSide {
  private readonly waiting = new Map<number, FollowerWaiter>();
  private readonly done: Array<{ seq: number; values: unknown[] }> = [];

  constructor(
    private readonly processes: number,
    private readonly send: (m: Message) => void,
    where: string,
    timeoutMs: number,
    kind: LiveKind = REFORM,
  ) {
    super(where, timeoutMs, kind);
  }

  /** A rejoiner's: the survivors made `seq` exchanges of this kind before it came; and each rejoin's round (LeaderJoins) starts at its base. */
  startAt(seq: number): void {
    this.seq = seq;
  }

  /** The rejoins' exchanges: the round waited on is over (a later rejoin began, the leader was lost): its waiters end (RANK_FAILED). */
  endRound(): void {
    const error = roundEnded(this.where);
    for (const w of this.waiting.values()) (clearTimeout(w.timer), w.reject(error));
    this.waiting.clear();
  }

  async exchange(value: unknown, timeoutMs = this.timeoutMs): Promise<unknown[]> {
    const { seq, wire } = this.start(value);
    return new Promise((resolve, reject) => {
      const t0 = Date.now();
      const expire = (): void => {
        this.waiting.delete(seq);
        reject(new RankflowError('TIMEOUT_CPU', `${this.where}: survivors' exchange #${seq}: no answer from the leader after ${Date.now() - t0} ms`, { rank: 0 }));
      };
      this.waiting.set(seq, { resolve, reject, timer: setTimeout(expire, timeoutMs), expire, value: wire });
      this.send({ t: this.kind.ask, seq, value: wire });
    });
  }

  /** The leader's 'lxall' (checked: a problem is returned, and the caller drops the leader). */
  onMessage(m: Incoming): string | undefined {
    if (!isInt(m.seq, 1, this.seq) || !Array.isArray(m.values) || m.values.length !== this.processes)
      return `the leader sent an invalid result for survivors' exchange #${quote(m.seq)}`;
    const w = this.waiting.get(m.seq);
    if (!w) return undefined;  // timed out here
    this.waiting.delete(m.seq);
    clearTimeout(w.timer);
    this.done.push({ seq: m.seq, values: m.values as unknown[] });
    if (this.done.length > DONE_KEPT) this.done.shift();
    w.resolve(m.values as unknown[]);
    return undefined;
  }

  /** The leader was lost: the waiters' clocks start again at `ms` (restartClocks). */
  extendWaits(ms: number): void {
    restartClocks(this.waiting.values(), ms);
  }

  /** What this process hands on when its leader is lost (takeover.ts); the waiters stay here until the next leader answers. */
  handOver(): LiveHandOver {
    return { at: this.seq, waiting: [...this.waiting].map(([seq, w]) => ({ seq, value: w.value, waiter: w })), done: [...this.done] };
  }

  fail(error: RankflowError): void {
    this.failed ??= error;
    for (const [seq, w] of this.waiting) {
      clearTimeout(w.timer);
      this.waiting.delete(seq);
      w.reject(error);
    }
  }
}
