// A formed world's connections, after the table: `exchange` (an all-gather of small JSON values
// through the leader), loss detection, failure relay, and close. The leader's side and a
// follower's side implement one abstract Session.
import { RankflowError } from '../core/errors.js';
import type { Channel } from './channel.js';
import { toWire, who, type Hello, type Message } from './protocol.js';
import type { PeerLost, RankFailure, Rendezvous, RendezvousPeer } from './rendezvous.js';

interface PendingExchange {
  values: unknown[];
  have: boolean[];
  settle?: { resolve: (v: unknown[]) => void; reject: (e: RankflowError) => void; timer: NodeJS.Timeout };
}

abstract class Session implements Rendezvous {
  protected seq = 0;
  protected closed = false;
  protected readonly lost = new Map<number, PeerLost>();
  private readonly listeners = new Set<(lost: PeerLost) => void>();
  private readonly failures: RankFailure[] = [];
  private readonly failureListeners = new Set<(f: RankFailure) => void>();

  constructor(
    readonly peers: readonly RendezvousPeer[],
    readonly self: number,
    protected readonly timeoutMs: number,
    protected readonly where: string,
  ) {}

  abstract exchange<T>(value: T, opts?: { timeoutMs?: number }): Promise<T[]>;
  abstract close(): Promise<void>;
  abstract announceFailure(f: RankFailure): void;
  protected abstract failPending(error: RankflowError): void;

  onRankFailed(cb: (f: RankFailure) => void): () => void {
    this.failureListeners.add(cb);
    for (const f of this.failures) queueMicrotask(() => this.failureListeners.has(cb) && cb(f));
    return () => this.failureListeners.delete(cb);
  }

  /** A failure another process announced: for this process's listeners. */
  protected rankFailed(f: RankFailure): void {
    if (this.closed || typeof f?.rank !== 'number' || typeof f.message !== 'string') return;
    this.failures.push(f);
    for (const cb of this.failureListeners) cb(f);
  }

  onPeerLost(cb: (lost: PeerLost) => void): () => void {
    this.listeners.add(cb);
    for (const l of this.lost.values()) queueMicrotask(() => this.listeners.has(cb) && cb(l));
    return () => this.listeners.delete(cb);
  }

  protected markLost(index: number, reason: string): void {
    if (this.closed || this.lost.has(index) || index === this.self) return;
    const p = this.peers[index];
    if (p === undefined) return;
    const l: PeerLost = { rankOffset: p.rankOffset, localRanks: p.localRanks, hostId: p.hostId, reason };
    this.lost.set(index, l);
    this.failPending(this.lostError(index));
    for (const cb of this.listeners) cb(l);
  }

  protected lostError(index: number): RankflowError {
    const p = this.peers[index]!;
    const l = this.lost.get(index);
    return new RankflowError('RANK_FAILED', `${this.where}: ${who(p)} was lost (${l?.reason ?? 'unknown'})`, {
      rank: p.rankOffset,
    });
  }

  /** The first error a new exchange must fail with, if any. */
  protected refuse(): RankflowError | undefined {
    if (this.closed) return new RankflowError('STATE', `${this.where}: exchange after close()`, { state: 'closed' });
    const first = this.lost.keys().next();
    return first.done ? undefined : this.lostError(first.value);
  }
}

export class LeaderSession extends Session {
  private readonly pending = new Map<number, PendingExchange>();
  private readonly goodbyes = new Set<number>();

  constructor(
    peers: RendezvousPeer[],
    private readonly channels: (Channel | undefined)[],
    timeoutMs: number,
    where: string,
  ) {
    super(peers, channels.indexOf(undefined), timeoutMs, where);
    channels.forEach((ch, index) => {
      if (ch === undefined) return;
      ch.keepAlive();
      ch.listen(
        (m) => {
          if (m.t === 'x') this.contribute(m.seq, index, m.value);
          else if (m.t === 'failed') {
            // A star: the leader passes a follower's failure on to the other followers.
            for (const other of this.channels) if (other !== undefined && other !== ch) other.send({ t: 'failed', from: index, failure: m.failure });
            this.rankFailed(m.failure);
          } else if (m.t === 'bye') {
            this.goodbyes.add(index);
            ch.end();
          }
        },
        (reason) => {
          if (this.goodbyes.has(index) || this.closed) return;
          const why = `${reason}, seen by the leader`;
          for (const other of this.channels) if (other !== undefined && other !== ch) other.send({ t: 'lost', index, reason: why });
          this.markLost(index, why);
        },
      );
    });
  }

  exchange<T>(value: T, opts?: { timeoutMs?: number }): Promise<T[]> {
    const seq = ++this.seq;
    const refused = this.refuse();
    if (refused) return Promise.reject(refused);
    let wire: unknown;
    try {
      wire = toWire(value, `exchange #${seq} value`);
    } catch (e) {
      return Promise.reject(e);
    }
    const timeoutMs = opts?.timeoutMs ?? this.timeoutMs;
    return new Promise<T[]>((resolve, reject) => {
      const p = this.entry(seq);
      const timer = setTimeout(() => {
        this.pending.delete(seq);
        const late = this.peers.filter((_, i) => !p.have[i]);
        const message = `${this.where}: exchange #${seq}: no value from ${late.map(who).join(', ')} after ${timeoutMs} ms`;
        const rank = late[0]?.rankOffset;
        this.broadcast({ t: 'xerr', seq, code: 'TIMEOUT_CPU', message, rank });
        reject(new RankflowError('TIMEOUT_CPU', message, rank === undefined ? undefined : { rank }));
      }, timeoutMs);
      p.settle = { resolve: resolve as (v: unknown[]) => void, reject, timer };
      this.contribute(seq, this.self, wire);
    });
  }

  announceFailure(failure: RankFailure): void {
    if (this.closed) return;
    this.broadcast({ t: 'failed', from: this.self, failure: toWire(failure, 'failure') as RankFailure });
  }

  private entry(seq: number): PendingExchange {
    let p = this.pending.get(seq);
    if (p === undefined) {
      p = { values: new Array<unknown>(this.peers.length).fill(null), have: new Array<boolean>(this.peers.length).fill(false) };
      this.pending.set(seq, p);
    }
    return p;
  }

  private contribute(seq: number, index: number, value: unknown): void {
    // Values for an exchange we already gave up on (timed out) are late: drop them.
    if (seq <= this.seq && !this.pending.has(seq) && index !== this.self) return;
    const p = this.entry(seq);
    p.values[index] = value ?? null;
    p.have[index] = true;
    if (!p.have.every(Boolean) || p.settle === undefined) return;
    this.pending.delete(seq);
    clearTimeout(p.settle.timer);
    this.broadcast({ t: 'xall', seq, values: p.values });
    p.settle.resolve(p.values);
  }

  private broadcast(m: Message): void {
    for (const ch of this.channels) ch?.send(m);
  }

  protected failPending(error: RankflowError): void {
    for (const [seq, p] of this.pending) {
      if (p.settle === undefined) continue;
      clearTimeout(p.settle.timer);
      this.pending.delete(seq);
      p.settle.reject(error);
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.failPending(new RankflowError('STATE', `${this.where}: closed while an exchange was pending`, { state: 'closed' }));
    this.closed = true;
    await Promise.all(this.channels.map((ch) => ch?.endAndWait({ t: 'bye' })));
  }
}

export class FollowerSession extends Session {
  private readonly pending = new Map<number, NonNullable<PendingExchange['settle']>>();
  private leaderLeft = false;

  constructor(
    peers: RendezvousPeer[],
    private readonly channel: Channel,
    self: Hello,
    timeoutMs: number,
    where: string,
  ) {
    super(
      peers,
      peers.findIndex((p) => p.rankOffset === self.rankOffset),
      timeoutMs,
      where,
    );
    channel.keepAlive();
    const leader = 0;
    channel.listen(
      (m) => {
        if (m.t === 'xall') this.settle(m.seq, (s) => s.resolve(m.values));
        else if (m.t === 'xerr')
          this.settle(m.seq, (s) => s.reject(new RankflowError(m.code, m.message, m.rank === undefined ? undefined : { rank: m.rank })));
        else if (m.t === 'lost') this.markLost(m.index, m.reason);
        else if (m.t === 'failed') this.rankFailed(m.failure);
        else if (m.t === 'bye') this.leaderLeft = true;
      },
      (reason) => {
        if (this.closed) return;
        if (this.leaderLeft) {
          this.failPending(new RankflowError('STATE', `${where}: the leader closed the rendezvous`, { state: 'closed' }));
          return;
        }
        this.markLost(leader, `${reason}, seen by ${who(self)}`);
      },
    );
  }

  private settle(seq: number, f: (s: NonNullable<PendingExchange['settle']>) => void): void {
    const s = this.pending.get(seq);
    if (s === undefined) return;
    this.pending.delete(seq);
    clearTimeout(s.timer);
    f(s);
  }

  exchange<T>(value: T, opts?: { timeoutMs?: number }): Promise<T[]> {
    const seq = ++this.seq;
    const refused =
      this.refuse() ??
      (this.leaderLeft ? new RankflowError('STATE', `${this.where}: the leader closed the rendezvous`, { state: 'closed' }) : undefined);
    if (refused) return Promise.reject(refused);
    let wire: unknown;
    try {
      wire = toWire(value, `exchange #${seq} value`);
    } catch (e) {
      return Promise.reject(e);
    }
    const timeoutMs = opts?.timeoutMs ?? this.timeoutMs;
    return new Promise<T[]>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(seq);
        reject(new RankflowError('TIMEOUT_CPU', `${this.where}: exchange #${seq}: no answer from the leader after ${timeoutMs} ms`, { rank: 0 }));
      }, timeoutMs);
      this.pending.set(seq, { resolve: resolve as (v: unknown[]) => void, reject, timer });
      this.channel.send({ t: 'x', seq, value: wire });
    });
  }

  announceFailure(failure: RankFailure): void {
    if (this.closed || this.leaderLeft) return;
    this.channel.send({ t: 'failed', from: this.self, failure: toWire(failure, 'failure') as RankFailure });
  }

  protected failPending(error: RankflowError): void {
    for (const [seq, s] of this.pending) {
      clearTimeout(s.timer);
      this.pending.delete(seq);
      s.reject(error);
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.failPending(new RankflowError('STATE', `${this.where}: closed while an exchange was pending`, { state: 'closed' }));
    this.closed = true;
    await this.channel.endAndWait({ t: 'bye' });
  }
}
