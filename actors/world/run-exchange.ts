// The run ends' exchange of an elastic world (actors/run.ts): every process that ran run k (its
// number: the op's, the same in every process, actors/elastic.ts) gives how its programs ended; the
// leader gathers the ends of the processes not lost and hands every process the result ('rxall'), or
// ends the exchange without one ('rxcut') when a rank left while it was open: the leader's own hearing
// of a leaving cuts every open exchange, and a follower that hears of one while it waits says so
// ('rxhit'). Every process follows the leader's word, which is one order of events for all, so a run
// ends with its results in every process or with RANK_FAILED in every process. A process that knew
// of a leaving before its programs ended gives nothing: the exchange cannot complete without it, and
// the others are cut once they hear of it. Keyed by the run's number, not numbered in turn: a
// process that rejected run k before it began (actors/elastic.ts, rejectThrough) never gives one.
// When the leader is lost (takeover.ts) every run open is cut (its ranks left while it ran), but for
// one some process saw decided: every process that waits on it gets that word. The new leader holds
// the open ones until every survivor resumed (a late one may have seen one decided).
import { RankflowError } from '../core/errors.js';
import { isInt, jsonBytes, quote, toWire, who, type Incoming, type Message } from './protocol.js';
import { gathered, gathering, give, restartClocks, type Expiring, type Gathering, type LeaderOut } from './live-exchange.js';
import type { RendezvousPeer } from './rendezvous.js';

/** The exchange's result: the values (null for a process lost), or undefined: cut, a rank left while it ran. */
export type RunEnds = unknown[] | undefined;

interface Waiter { resolve: (v: RunEnds) => void; reject: (e: RankflowError) => void; timer: NodeJS.Timeout }
type FollowerWaiter = Waiter & Expiring & { value: unknown };

/** A follower's runs as it hands them on at a change of leader: its ends waiting, the words it had (values, or null: cut). */
export interface RunsHandOver {
  waiting: Array<{ run: number; value: unknown; waiter?: Waiter }>;
  decided: Array<{ run: number; values: unknown[] | null }>;
}
// Words a follower keeps for a change of leader.
export const DECIDED_KEPT = 16;

// Runs decided (completed or cut) that each side remembers: a late value or word for one is dropped.
const REMEMBERED = 256;
// Open exchanges the leader keeps for followers before its own value: more means a follower misbehaves.
const MAX_OPEN = 64;

/** A bounded set of the runs decided lately. */
class Recent {
  private readonly keys = new Set<number>();
  add(k: number): void {
    this.keys.add(k);
    if (this.keys.size > REMEMBERED) this.keys.delete(this.keys.values().next().value!);
  }
  has(k: number): boolean {
    return this.keys.has(k);
  }
}

abstract class RunSide {
  protected failed?: RankflowError;
  protected readonly cut = new Recent();

  constructor(protected readonly where: string, protected readonly limitBytes: number, protected readonly timeoutMs: number) {}

  /** The value as it crosses; throws why it cannot (failed, too big). */
  protected wire(run: number, value: unknown): unknown {
    if (this.failed) throw this.failed;
    const wire = toWire(value, `run ${run}'s end`);
    const bytes = jsonBytes(wire);
    if (bytes > this.limitBytes) throw new RankflowError('EINVAL', `${this.where}: run ${run}'s end is ${bytes} bytes of JSON; at most ${this.limitBytes}`);
    return wire;
  }
}

/** The leader's side: gathers, completes or cuts, and tells every follower which. */
export class LeaderRuns extends RunSide {
  private readonly open = new Map<number, Gathering & { waiter?: Waiter }>();
  private readonly completed = new Recent();
  /** the results of runs completed that a follower may still wait on, after a change of leader */
  private readonly results = new Map<number, unknown[]>();
  /** a change of leader in progress: the open runs wait for every survivor's word (settleTakeover) */
  private taking = false;

  constructor(
    private readonly peers: readonly RendezvousPeer[],
    private readonly self: number,
    private readonly isLost: (index: number) => boolean,
    private readonly out: LeaderOut,
    where: string, limitBytes: number, timeoutMs: number,
  ) {
    super(where, limitBytes, timeoutMs);
  }

  async exchange(run: number, value: unknown, timeoutMs = this.timeoutMs): Promise<RunEnds> {
    const wire = this.wire(run, value);
    if (this.cut.has(run)) return undefined;
    return new Promise((resolve, reject) => {
      const p = this.entry(run);
      const timer = setTimeout(() => {
        this.open.delete(run);
        const late = this.peers.filter((_, i) => !p.have[i] && !this.isLost(i));
        reject(new RankflowError('TIMEOUT_CPU', `${this.where}: run ${run}'s end: no value from ${late.map(who).join(', ')} after ${timeoutMs} ms`,
          late[0] ? { rank: late[0].rankOffset } : undefined));
      }, timeoutMs);
      p.waiter = { resolve, reject, timer };
      this.contribute(run, this.self, wire);
    });
  }

  /** A follower's 'rx' or 'rxhit' (checked: a problem is returned, and the caller drops the follower). */
  onMessage(index: number, m: Incoming): string | undefined {
    if (!isInt(m.seq, 1, Number.MAX_SAFE_INTEGER)) return `it sent ${m.t} for run ${quote(m.seq)}`;
    if (m.t === 'rxhit') {
      if (this.open.has(m.seq) && !this.taking) this.cutOff(m.seq);  // while taking over, settleTakeover decides
      return undefined;
    }
    if (jsonBytes(m.value) > this.limitBytes) return `it sent a ${jsonBytes(m.value)}-byte run end`;
    this.contribute(m.seq, index, m.value);
    return undefined;
  }

  /** This process heard of a rank leaving: every exchange open now is cut. */
  hit(): void {
    if (this.taking) return;
    for (const run of [...this.open.keys()]) this.cutOff(run);
  }

  /** A process was lost: the exchanges that waited only for it complete without it. */
  recheck(): void {
    for (const run of [...this.open.keys()]) this.complete(run);
  }

  /** This process, a follower until now, leads: its words known, its ends waiting (held until settleTakeover). */
  adopt(h: RunsHandOver): void {
    this.taking = true;
    for (const d of h.decided) this.record(d.run, d.values);
    for (const w of h.waiting) {
      if (this.decide(w.run, () => w.waiter && (clearTimeout(w.waiter.timer), w.waiter.resolve(this.results.get(w.run))))) continue;
      const p = this.entry(w.run);
      p.waiter = w.waiter;
      give(p, this.self, w.value);
    }
  }

  /** Follower `index` resumed (checked: world/resume.ts): a word it had decides that run everywhere; its ends waiting get a word, or wait. */
  resume(index: number, h: RunsHandOver): void {
    for (const d of h.decided) {
      if (this.cut.has(d.run) || this.completed.has(d.run)) continue;
      const p = this.open.get(d.run);
      this.open.delete(d.run);
      this.record(d.run, d.values);
      const m: Message = d.values ? { t: 'rxall', seq: d.run, values: d.values } : { t: 'rxcut', seq: d.run };
      p?.have.forEach((had, i) => had && i !== this.self && this.out.sendTo(i, m));
      if (p?.waiter) (clearTimeout(p.waiter.timer), p.waiter.resolve(d.values ?? undefined));
    }
    for (const w of h.waiting) {
      const values = this.results.get(w.run);
      if (this.decide(w.run, () => this.out.sendTo(index, values ? { t: 'rxall', seq: w.run, values } : { t: 'rxcut', seq: w.run }))) continue;
      give(this.entry(w.run), index, w.value);
    }
  }

  /** Every survivor resumed (or was lost): the runs still open had a rank leave while they ran (the old leader's): cut. */
  settleTakeover(): void {
    this.taking = false;
    for (const run of [...this.open.keys()]) this.cutOff(run);
  }

  /** Calls `tell` and says true if run `run` is decided. */
  private decide(run: number, tell: () => void): boolean {
    if (!this.cut.has(run) && !this.completed.has(run)) return false;
    tell();
    return true;
  }

  private record(run: number, values: unknown[] | null): void {
    if (values === null) return this.cut.add(run);
    this.completed.add(run);
    this.results.set(run, values);
    if (this.results.size > DECIDED_KEPT) this.results.delete(this.results.keys().next().value!);
  }

  fail(error: RankflowError): void {
    this.failed ??= error;
    for (const [run, p] of this.open) {
      this.open.delete(run);
      if (!p.waiter) continue;
      clearTimeout(p.waiter.timer);
      p.waiter.reject(error);
    }
  }

  private entry(run: number) {
    let p = this.open.get(run);
    if (!p) {
      this.open.set(run, (p = gathering(this.peers.length)));
      // Entries only followers gave, beyond any legitimate number: the oldest goes.
      const stale = this.open.size > MAX_OPEN ? [...this.open].find(([, e]) => !e.waiter) : undefined;
      if (stale) this.open.delete(stale[0]);
    }
    return p;
  }

  private contribute(run: number, index: number, value: unknown): void {
    if (this.cut.has(run) || this.completed.has(run)) return;  // decided: the follower was told
    if (give(this.entry(run), index, value)) this.complete(run);
  }

  private complete(run: number): void {
    if (this.taking) return;
    const p = this.open.get(run);
    const values = p?.waiter ? gathered(p, this.isLost) : undefined;
    if (!p?.waiter || !values) return;
    this.open.delete(run);
    this.record(run, values);
    clearTimeout(p.waiter.timer);
    this.out.broadcast({ t: 'rxall', seq: run, values });
    p.waiter.resolve(values);
  }

  private cutOff(run: number): void {
    const p = this.open.get(run);
    this.open.delete(run);
    this.cut.add(run);
    this.out.broadcast({ t: 'rxcut', seq: run });
    if (!p?.waiter) return;
    clearTimeout(p.waiter.timer);
    p.waiter.resolve(undefined);
  }
}

/** A follower's side: sends its end, waits for the leader's word; says when it hears of a leaving meanwhile. */
export class FollowerRuns extends RunSide {
  private readonly waiting = new Map<number, FollowerWaiter>();
  private readonly decided = new Map<number, unknown[] | null>();

  constructor(private readonly processes: number, private readonly send: (m: Message) => void, where: string, limitBytes: number, timeoutMs: number) {
    super(where, limitBytes, timeoutMs);
  }

  async exchange(run: number, value: unknown, timeoutMs = this.timeoutMs): Promise<RunEnds> {
    const wire = this.wire(run, value);
    if (this.cut.has(run)) return undefined;  // the leader cut it before this process got there
    return new Promise((resolve, reject) => {
      const t0 = Date.now();
      const expire = (): void => {
        this.waiting.delete(run);
        reject(new RankflowError('TIMEOUT_CPU', `${this.where}: run ${run}'s end: no answer from the leader after ${Date.now() - t0} ms`, { rank: 0 }));
      };
      this.waiting.set(run, { resolve, reject, timer: setTimeout(expire, timeoutMs), expire, value: wire });
      this.send({ t: 'rx', seq: run, value: wire });
    });
  }

  /** The leader's 'rxall' or 'rxcut' (checked: a problem is returned, and the caller drops the leader). */
  onMessage(m: Incoming): string | undefined {
    if (!isInt(m.seq, 1, Number.MAX_SAFE_INTEGER)) return `the leader sent ${m.t} for run ${quote(m.seq)}`;
    if (m.t === 'rxall' && (!Array.isArray(m.values) || m.values.length !== this.processes)) return `the leader sent an invalid result for run ${m.seq}'s end`;
    if (m.t === 'rxcut') this.cut.add(m.seq);
    this.decided.set(m.seq, m.t === 'rxall' ? (m.values as unknown[]) : null);
    if (this.decided.size > DECIDED_KEPT) this.decided.delete(this.decided.keys().next().value!);
    const w = this.waiting.get(m.seq);
    if (!w) return undefined;  // timed out here, or cut before this process got there
    this.waiting.delete(m.seq);
    clearTimeout(w.timer);
    w.resolve(m.t === 'rxall' ? (m.values as unknown[]) : undefined);
    return undefined;
  }

  /** This process heard of a rank leaving: the leader is told for every run it waits on. */
  hit(): void {
    for (const run of this.waiting.keys()) this.send({ t: 'rxhit', seq: run });
  }

  /** The leader was lost: the waiters' clocks start again at `ms` (live-exchange.ts restartClocks). */
  extendWaits(ms: number): void {
    restartClocks(this.waiting.values(), ms);
  }

  /** What this process hands on when its leader is lost (takeover.ts); the waiters stay here until the next leader's word. */
  handOver(): RunsHandOver {
    return { waiting: [...this.waiting].map(([run, w]) => ({ run, value: w.value, waiter: w })), decided: [...this.decided].map(([run, values]) => ({ run, values })) };
  }

  fail(error: RankflowError): void {
    this.failed ??= error;
    for (const [run, w] of this.waiting) {
      clearTimeout(w.timer);
      this.waiting.delete(run);
      w.reject(error);
    }
  }
}
