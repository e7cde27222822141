// What the leader's and a follower's side of a formed world share (session.ts): the peers, the
// processes lost, the failures and releases announced and their listeners, the checks of a value
// before it crosses, the wire forms of this process's announcements, and the calls into the
// survivors' and run ends' exchanges of an elastic world (each side holds its own ends of them). What
// outlives a change of leader (takeover.ts) is one WorldState, handed from a side to the next.
import { RankflowError } from '../core/errors.js';
import { LIMITS, jsonBytes, toWire, who } from './protocol.js';
import type { ElasticRendezvous, PeerLost, RankFailure, Rendezvous, RendezvousPeer, RunRelease } from './rendezvous.js';
import type { FollowerLive, Gathering, LeaderLive } from './live-exchange.js';
import type { FollowerRuns, LeaderRuns, RunEnds } from './run-exchange.js';

/** The largest value one process may put into an exchange: the gathered line must stay under the line limit. */
export function exchangeLimit(processes: number): number {
  return Math.floor((LIMITS.lineBytes - (64 << 10)) / processes);
}

export interface PendingExchange extends Gathering {
  settle?: { resolve: (v: unknown[]) => void; reject: (e: RankflowError) => void; timer: NodeJS.Timeout };
}

export type RejoinListener = Parameters<ElasticRendezvous['onRejoin']>[0];

/** What a process knows of its world that outlives a change of its side (a follower that becomes the leader: takeover.ts). */
export class WorldState {
  readonly lost = new Map<number, PeerLost>();
  readonly lostListeners = new Set<(lost: PeerLost) => void>();
  readonly failures: RankFailure[] = [];
  readonly failureListeners = new Set<(f: RankFailure) => void>();
  readonly releaseListeners = new Set<(r: RunRelease) => void>();
  readonly rejoinListeners: RejoinListener[] = [];
}

export abstract class Session implements Rendezvous {
  abstract readonly localAddress: string;
  abstract readonly leaderAddress: string;
  protected seq = 0;
  protected closed = false;

  constructor(
    readonly peers: readonly RendezvousPeer[],
    readonly self: number,
    protected readonly timeoutMs: number,
    protected readonly where: string,
    readonly state: WorldState = new WorldState(),
  ) {}

  protected get lost(): Map<number, PeerLost> {
    return this.state.lost;
  }

  abstract exchange<T>(value: T, opts?: { timeoutMs?: number }): Promise<T[]>;
  /** The re-formings' and the rejoins' survivors' exchanges (live-exchange.ts), the run ends' (run-exchange.ts). */
  protected abstract readonly live: LeaderLive | FollowerLive;
  protected abstract readonly joins: LeaderLive | FollowerLive;
  protected abstract readonly runs: LeaderRuns | FollowerRuns;
  abstract close(): Promise<void>;
  abstract announceFailure(f: RankFailure): void;
  abstract announceRelease(r: RunRelease): void;
  protected abstract failPending(error: RankflowError): void;

  exchangeAmongLive<T>(value: T, opts?: { timeoutMs?: number }): Promise<Array<T | null>> {
    return this.live.exchange(value, opts?.timeoutMs) as Promise<Array<T | null>>;
  }
  exchangeJoin<T>(value: T, opts?: { timeoutMs?: number }): Promise<Array<T | null>> {
    return this.joins.exchange(value, opts?.timeoutMs) as Promise<Array<T | null>>;
  }
  get joinsAt(): number {
    return this.joins.at;
  }
  exchangeRunEnd(run: number, value: unknown, opts?: { timeoutMs?: number }): Promise<RunEnds> {
    return this.runs.exchange(run, value, opts?.timeoutMs);
  }
  hitRunEnds(): void {
    this.runs.hit();
  }
  onRejoin(l: RejoinListener): void {
    this.state.rejoinListeners.push(l);
  }

  onRelease(cb: (r: RunRelease) => void): () => void {
    this.state.releaseListeners.add(cb);
    return () => this.state.releaseListeners.delete(cb);
  }

  /** A release another process announced (checked): for this process's listeners. */
  protected released(r: RunRelease): void {
    if (this.closed) return;
    for (const cb of this.state.releaseListeners) cb(r);
  }

  /** A release of this process, as it crosses: bounded, as the receivers check it. */
  protected static releaseWire(r: RunRelease): RunRelease {
    return { run: r.run, rank: r.rank, above: r.above, message: String(r.message).slice(0, LIMITS.textChars) };
  }

  onRankFailed(cb: (f: RankFailure) => void): () => void {
    this.state.failureListeners.add(cb);
    for (const f of this.state.failures) queueMicrotask(() => this.state.failureListeners.has(cb) && cb(f));
    return () => this.state.failureListeners.delete(cb);
  }

  /** A failure another process announced (checked): for this process's listeners. */
  protected rankFailed(f: RankFailure): void {
    if (this.closed) return;
    this.state.failures.push(f);
    for (const cb of this.state.failureListeners) cb(f);
  }

  onPeerLost(cb: (lost: PeerLost) => void): () => void {
    this.state.lostListeners.add(cb);
    for (const l of this.lost.values()) queueMicrotask(() => this.state.lostListeners.has(cb) && cb(l));
    return () => this.state.lostListeners.delete(cb);
  }

  protected markLost(index: number, reason: string): void {
    if (this.closed || this.lost.has(index) || index === this.self) return;
    const p = this.peers[index];
    if (p === undefined) return;
    const l: PeerLost = { rankOffset: p.rankOffset, localRanks: p.localRanks, hostId: p.hostId, nodeId: p.nodeId, reason };
    this.lost.set(index, l);
    this.failPending(this.lostError(index));
    for (const cb of this.state.lostListeners) cb(l);
  }

  protected lostError(index: number): RankflowError {
    const p = this.peers[index]!;
    const l = this.lost.get(index);
    return new RankflowError('RANK_FAILED', `${this.where}: ${who(p)} was lost (${l?.reason ?? 'unknown'})`, {
      rank: p.rankOffset,
    });
  }

  /** This process's value for exchange #seq, as it will cross; EINVAL if it cannot. */
  protected wire(value: unknown, seq: number): unknown {
    const wire = toWire(value, `exchange #${seq} value`);
    const bytes = jsonBytes(wire);
    const limit = exchangeLimit(this.peers.length);
    if (bytes > limit)
      throw new RankflowError('EINVAL', `${this.where}: exchange #${seq} value is ${bytes} bytes of JSON; at most ${limit} in a world of ${this.peers.length} processes`);
    return wire;
  }

  /** A failure of a local rank, as it crosses: bounded, as the receivers check it. */
  protected static failureWire(f: RankFailure): RankFailure {
    return {
      rank: f.rank,
      message: String(f.message).slice(0, LIMITS.textChars),
      ...(f.phase !== undefined ? { phase: String(f.phase).slice(0, LIMITS.idChars) } : {}),
    };
  }

  /**
   * An exchange's start, either side's: its number, and this process's value as it will cross. Throws
   * what the exchange must fail with: refuse()'s error, then the side's own (`refused`), then the value's EINVAL.
   */
  protected open(value: unknown, refused?: RankflowError): { seq: number; wire: unknown } {
    const seq = ++this.seq;
    const error = this.refuse() ?? refused;
    if (error) throw error;
    return { seq, wire: this.wire(value, seq) };
  }

  /** The first error a new exchange must fail with, if any. */
  protected refuse(): RankflowError | undefined {
    if (this.closed) return new RankflowError('STATE', `${this.where}: exchange after close()`, { state: 'closed' });
    const first = this.lost.keys().next();
    return first.done ? undefined : this.lostError(first.value);
  }
}
