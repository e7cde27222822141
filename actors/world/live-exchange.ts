// The survivors' exchange of an elastic world (actors/elastic.ts): an all-gather like the session's
// `exchange`, but among the processes that are not lost. A process lost before or while an exchange
// runs gives null; the exchange fails only if the leader is lost (it relays every value: a star), the
// session closes, or a survivor gives nothing within the timeout. Its own numbering ('lx' messages):
// the formation's exchanges refuse after a loss, these are made for it. A second one ('jx') carries
// the rejoins' agreements (actors/elastic-join.ts), numbered apart from the re-formings'. The leader's
// table of what it gathered (Gathering) also serves the run ends' exchange (world/run-exchange.ts).
import { RankflowError } from '../core/errors.js';
import { isInt, jsonBytes, quote, toWire, who, type Incoming, type Message } from './protocol.js';
import type { RendezvousPeer } from './rendezvous.js';

/** The largest value a process gives: a membership's numbers (elastic.ts) are ~100 bytes. */
export const LIVE_VALUE_BYTES = 4096;
// How far a follower may run ahead of the leader: in step, at most one.
const MAX_AHEAD = 16;

/** The two kinds: the re-formings' ('lx') and the rejoins' ('jx'). */
export type LiveKind = { ask: 'lx'; all: 'lxall' } | { ask: 'jx'; all: 'jxall' };
export const REFORM: LiveKind = { ask: 'lx', all: 'lxall' };
export const REJOIN: LiveKind = { ask: 'jx', all: 'jxall' };

interface Waiter { resolve: (v: unknown[]) => void; reject: (e: RankflowError) => void; timer: NodeJS.Timeout }

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

  constructor(
    private readonly peers: readonly RendezvousPeer[],
    private readonly self: number,
    private readonly isLost: (index: number) => boolean,
    private readonly broadcast: (m: Message) => void,
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

  fail(error: RankflowError): void {
    this.failed ??= error;
    for (const [seq, p] of this.pending) {
      if (!p.waiter) continue;
      clearTimeout(p.waiter.timer);
      this.pending.delete(seq);
      p.waiter.reject(error);
    }
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
    this.broadcast({ t: this.kind.all, seq, values });
    p.waiter.resolve(values);
  }
}

/** A follower's side: sends its value to the leader and waits for the gathered ones. */
export class FollowerLive extends LiveSide {
  private readonly waiting = new Map<number, Waiter>();

  constructor(
    private readonly processes: number,
    private readonly send: (m: Message) => void,
    where: string,
    timeoutMs: number,
    kind: LiveKind = REFORM,
  ) {
    super(where, timeoutMs, kind);
  }

  /** A rejoiner's: the survivors made `seq` exchanges of this kind before it came. */
  startAt(seq: number): void {
    this.seq = seq;
  }

  async exchange(value: unknown, timeoutMs = this.timeoutMs): Promise<unknown[]> {
    const { seq, wire } = this.start(value);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(seq);
        reject(new RankflowError('TIMEOUT_CPU', `${this.where}: survivors' exchange #${seq}: no answer from the leader after ${timeoutMs} ms`, { rank: 0 }));
      }, timeoutMs);
      this.waiting.set(seq, { resolve, reject, timer });
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
    w.resolve(m.values as unknown[]);
    return undefined;
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
