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
import { RankflowError } from '../core/errors.js';
import { isInt, jsonBytes, quote, toWire, who, type Incoming, type Message } from './protocol.js';
import { gathered, gathering, give, type Gathering } from './live-exchange.js';
import type { RendezvousPeer } from './rendezvous.js';

/** The exchange's result: the values (null for a process lost), or undefined: cut, a rank left while it ran. */
export type RunEnds = unknown[] | undefined;

interface Waiter { resolve: (v: RunEnds) => void; reject: (e: RankflowError) => void; timer: NodeJS.Timeout }

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

  constructor(
    private readonly peers: readonly RendezvousPeer[],
    private readonly self: number,
    private readonly isLost: (index: number) => boolean,
    private readonly broadcast: (m: Message) => void,
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
      if (this.open.has(m.seq)) this.cutOff(m.seq);
      return undefined;
    }
    if (jsonBytes(m.value) > this.limitBytes) return `it sent a ${jsonBytes(m.value)}-byte run end`;
    this.contribute(m.seq, index, m.value);
    return undefined;
  }

  /** This process heard of a rank leaving: every exchange open now is cut. */
  hit(): void {
    for (const run of [...this.open.keys()]) this.cutOff(run);
  }

  /** A process was lost: the exchanges that waited only for it complete without it. */
  recheck(): void {
    for (const run of [...this.open.keys()]) this.complete(run);
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
    const p = this.open.get(run);
    const values = p?.waiter ? gathered(p, this.isLost) : undefined;
    if (!p?.waiter || !values) return;
    this.open.delete(run);
    this.completed.add(run);
    clearTimeout(p.waiter.timer);
    this.broadcast({ t: 'rxall', seq: run, values });
    p.waiter.resolve(values);
  }

  private cutOff(run: number): void {
    const p = this.open.get(run);
    this.open.delete(run);
    this.cut.add(run);
    this.broadcast({ t: 'rxcut', seq: run });
    if (!p?.waiter) return;
    clearTimeout(p.waiter.timer);
    p.waiter.resolve(undefined);
  }
}

/** A follower's side: sends its end, waits for the leader's word; says when it hears of a leaving meanwhile. */
export class FollowerRuns extends RunSide {
  private readonly waiting = new Map<number, Waiter>();

  constructor(private readonly processes: number, private readonly send: (m: Message) => void, where: string, limitBytes: number, timeoutMs: number) {
    super(where, limitBytes, timeoutMs);
  }

  async exchange(run: number, value: unknown, timeoutMs = this.timeoutMs): Promise<RunEnds> {
    const wire = this.wire(run, value);
    if (this.cut.has(run)) return undefined;  // the leader cut it before this process got there
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(run);
        reject(new RankflowError('TIMEOUT_CPU', `${this.where}: run ${run}'s end: no answer from the leader after ${timeoutMs} ms`, { rank: 0 }));
      }, timeoutMs);
      this.waiting.set(run, { resolve, reject, timer });
      this.send({ t: 'rx', seq: run, value: wire });
    });
  }

  /** The leader's 'rxall' or 'rxcut' (checked: a problem is returned, and the caller drops the leader). */
  onMessage(m: Incoming): string | undefined {
    if (!isInt(m.seq, 1, Number.MAX_SAFE_INTEGER)) return `the leader sent ${m.t} for run ${quote(m.seq)}`;
    if (m.t === 'rxall' && (!Array.isArray(m.values) || m.values.length !== this.processes)) return `the leader sent an invalid result for run ${m.seq}'s end`;
    if (m.t === 'rxcut') this.cut.add(m.seq);
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

  fail(error: RankflowError): void {
    this.failed ??= error;
    for (const [run, w] of this.waiting) {
      clearTimeout(w.timer);
      this.waiting.delete(run);
      w.reject(error);
    }
  }
}
