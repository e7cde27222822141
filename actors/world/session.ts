// A formed world's connections, after the table: `exchange` (an all-gather of small JSON values
// through the leader), loss detection, failure relay (a star: the leader passes each follower's
// announcements on), and close. The leader's side and a follower's side implement one abstract
// Session (session-base.ts); the messages of an elastic world's survivors' and run ends' exchanges go to
// their sides (live-exchange.ts, run-exchange.ts). Every message is checked before it is acted on; a peer
// that breaks the protocol is cut off, and reported lost with what it sent.
import { RankflowError } from '../core/errors.js';
import type { Channel } from './channel.js';
import { FollowerLive, LeaderLive, REJOIN, gathering, give } from './live-exchange.js';
import { FollowerRuns, LeaderRuns } from './run-exchange.js';
import {
  LIMITS, entryProblem, errorProblem, failureProblem, isInt, isObject, isText, jsonBytes, quote, releaseProblem, toFailure, toPeer, toRelease, who,
  type Incoming, type Join, type Message,
} from './protocol.js';
import type { ElasticRendezvous, RankFailure, RejoinedAt, Rejoining, RendezvousPeer, RunRelease } from './rendezvous.js';
import { rejoinProblem } from './rejoin.js';
import { Session, exchangeLimit, type PendingExchange } from './session-base.js';

// How far a follower's exchanges may run ahead of the leader's: in step, a follower is at most
// one ahead (it cannot finish #n without the leader's value for #n).
const MAX_SEQ_AHEAD = 16;

type RejoinListener = Parameters<ElasticRendezvous['onRejoin']>[0];

export class LeaderSession extends Session implements ElasticRendezvous {
  private readonly pending = new Map<number, PendingExchange>();
  private readonly goodbyes = new Set<number>();
  protected readonly live: LeaderLive;
  protected readonly joins: LeaderLive;
  protected readonly runs: LeaderRuns;
  private rejoining?: { index: number; ch: Channel; join: Join };
  private readonly rejoinListeners: RejoinListener[] = [];
  /** an elastic world's rendezvous, still listening for rejoins (leader.ts): closed with the session */
  door?: { close(): void };

  readonly leaderAddress: string;

  constructor(
    peers: RendezvousPeer[],
    private readonly channels: (Channel | undefined)[],
    timeoutMs: number,
    where: string,
    readonly localAddress: string,
  ) {
    super(peers, channels.indexOf(undefined), timeoutMs, where);
    this.leaderAddress = localAddress;
    this.live = new LeaderLive(peers, this.self, (i) => this.lost.has(i), (m) => this.broadcast(m), where, timeoutMs);
    this.joins = new LeaderLive(peers, this.self, (i) => this.lost.has(i), (m) => this.broadcast(m), where, timeoutMs, REJOIN);
    this.runs = new LeaderRuns(peers, this.self, (i) => this.lost.has(i), (m) => this.broadcast(m), where, exchangeLimit(peers.length), timeoutMs);
    channels.forEach((ch, index) => ch && this.attach(ch, index));
  }

  /** Follower `index`'s connection: its messages, and its loss. */
  private attach(ch: Channel, index: number): void {
    ch.keepAlive();
    {
      ch.listen(
        (m) => {
          if (m.t === 'x') {
            if (!isInt(m.seq, 1, this.seq + MAX_SEQ_AHEAD)) return ch.drop(`it sent a value for exchange #${quote(m.seq)} while the leader is at #${this.seq}`);
            const bytes = jsonBytes(m.value);
            if (bytes > exchangeLimit(this.peers.length)) return ch.drop(`it sent a ${bytes}-byte exchange value`);
            this.contribute(m.seq, index, m.value);
          } else if (m.t === 'lx' || m.t === 'jx' || m.t === 'rx' || m.t === 'rxhit') {
            const problem = (m.t === 'lx' ? this.live : m.t === 'jx' ? this.joins : this.runs).onMessage(index, m);
            if (problem) return ch.drop(problem);
          } else if (m.t === 'failed') {
            const problem = failureProblem(m.failure, this.peers[index]!);
            if (problem) return ch.drop(`it announced an invalid failure: ${problem}`);
            const failure = toFailure(m.failure as Record<string, unknown>);
            // A star: the leader passes a follower's failure on to the other followers.
            this.relay(ch, { t: 'failed', from: index, failure });
            this.rankFailed(failure);
          } else if (m.t === 'released') {
            const problem = releaseProblem(m.release, this.peers[index]!);
            if (problem) return ch.drop(`it announced an invalid release: ${problem}`);
            const release = toRelease(m.release as Record<string, unknown>);
            this.relay(ch, { t: 'released', from: index, release });
            this.released(release);
          } else if (m.t === 'bye') {
            this.goodbyes.add(index);
            ch.end();
          } else {
            ch.drop(`it sent ${quote(m.t)}, not a message of a formed world`);
          }
        },
        (reason) => {
          if (this.goodbyes.has(index) || this.closed || this.channels[index] !== ch) return;
          const why = `${reason}, seen by the leader`;
          for (const other of this.channels) if (other !== undefined && other !== ch) other.send({ t: 'lost', index, reason: why });
          this.markLost(index, why);
          for (const x of [this.live, this.joins, this.runs]) x.recheck();  // the survivors' exchanges that waited only for it
        },
      );
    }
  }

  onRejoin(l: RejoinListener): void {
    this.rejoinListeners.push(l);
  }

  /** leader.ts: an authenticated connection's join after the table: a rejoin, or refused (rejoin.ts). */
  offerRejoin(ch: Channel, m: Incoming): void {
    const last = this.peers[this.peers.length - 1]!;
    const problem = this.closed ? 'the world is closing' : this.rejoinListeners.length === 0 ? 'the world is not elastic'
      : rejoinProblem(m, this.peers, new Set(this.lost.keys()), this.rejoining !== undefined, last.rankOffset + last.localRanks);
    if (problem) return ch.dismiss({ t: 'error', code: 'EINVAL', message: `${this.where}: the leader refused this rejoin: ${problem}` });
    const j = m as unknown as Join;
    const join: Join = { t: 'join', worldSize: j.worldSize, rankOffset: j.rankOffset, localRanks: j.localRanks, payload: j.payload, hostId: j.hostId, nodeId: j.nodeId, pid: j.pid };
    const index = this.peers.findIndex((p) => p.rankOffset === j.rankOffset);
    this.rejoining = { index, ch, join };
    ch.listen((later) => ch.drop(`it sent ${quote(later.t)} before its table`), (reason) => {
      if (this.rejoining?.ch === ch) this.endRejoin(`the rejoining process left (${reason})`);
    });
    const peer = toPeer(join);
    for (const c of this.channels) c?.send({ t: 'rejoining', index, peer });
    for (const l of this.rejoinListeners) l.rejoining({ index, peer });
  }

  admitRejoin(at: Omit<RejoinedAt, 'liveSeq' | 'joinSeq'>): void {
    const r = this.rejoining;
    if (r === undefined) return;
    this.rejoining = undefined;
    (this.peers as RendezvousPeer[])[r.index] = toPeer(r.join);
    r.ch.send({ t: 'table', peers: [...this.peers], rejoined: { ...at, liveSeq: this.live.at, joinSeq: this.joins.at } });
    this.lost.delete(r.index);
    this.goodbyes.delete(r.index);
    this.channels[r.index] = r.ch;
    this.attach(r.ch, r.index);
    for (const c of this.channels) if (c !== r.ch) c?.send({ t: 'revived', index: r.index });
  }

  endRejoin(reason: string, pid?: number): void {
    const r = this.rejoining;
    if (r === undefined || (pid !== undefined && r.join.pid !== pid)) return;
    this.rejoining = undefined;
    r.ch.end({ t: 'error', code: 'RANK_FAILED', message: `${this.where}: the rejoin ended: ${reason}`, rank: r.join.rankOffset });
    for (const c of this.channels) c?.send({ t: 'rejoinEnded', index: r.index, reason: reason.slice(0, LIMITS.textChars) });
    for (const l of this.rejoinListeners) l.ended(r.index, reason);
  }

  exchange<T>(value: T, opts?: { timeoutMs?: number }): Promise<T[]> {
    const seq = ++this.seq;
    const refused = this.refuse();
    if (refused) return Promise.reject(refused);
    let wire: unknown;
    try {
      wire = this.wire(value, seq);
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
    this.broadcast({ t: 'failed', from: this.self, failure: Session.failureWire(failure) });
  }

  announceRelease(release: RunRelease): void {
    if (this.closed) return;
    this.broadcast({ t: 'released', from: this.self, release: Session.releaseWire(release) });
  }

  private entry(seq: number): PendingExchange {
    let p = this.pending.get(seq);
    if (p === undefined) {
      p = gathering(this.peers.length);
      this.pending.set(seq, p);
    }
    return p;
  }

  private contribute(seq: number, index: number, value: unknown): void {
    // Values for an exchange we already gave up on (timed out) are late: drop them.
    if (seq <= this.seq && !this.pending.has(seq) && index !== this.self) return;
    const p = this.entry(seq);
    if (!give(p, index, value)) return;  // a second value from one process: the first one stands
    if (!p.have.every(Boolean) || p.settle === undefined) return;
    this.pending.delete(seq);
    clearTimeout(p.settle.timer);
    this.broadcast({ t: 'xall', seq, values: p.values });
    p.settle.resolve(p.values);
  }

  /** A follower's announcement, passed on to every other follower. */
  private relay(from: Channel, m: Message): void {
    for (const ch of this.channels) if (ch !== undefined && ch !== from) ch.send(m);
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
    for (const x of [this.live, this.joins, this.runs]) x.fail(new RankflowError('STATE', `${this.where}: closed`, { state: 'closed' }));
    this.endRejoin('the world closed');
    this.door?.close();
    this.closed = true;
    await Promise.all(this.channels.map((ch) => ch?.endAndWait({ t: 'bye' })));
  }
}

export class FollowerSession extends Session implements ElasticRendezvous {
  private readonly pending = new Map<number, NonNullable<PendingExchange['settle']>>();
  private leaderLeft = false;
  protected readonly live: FollowerLive;
  protected readonly joins: FollowerLive;
  protected readonly runs: FollowerRuns;
  private rejoining?: Rejoining;
  private readonly rejoinListeners: RejoinListener[] = [];
  readonly localAddress: string;
  readonly leaderAddress: string;

  constructor(
    peers: RendezvousPeer[],
    private readonly channel: Channel,
    self: Join,
    timeoutMs: number,
    where: string,
    readonly rejoined?: RejoinedAt,
  ) {
    super(
      peers,
      peers.findIndex((p) => p.rankOffset === self.rankOffset),
      timeoutMs,
      where,
    );
    this.localAddress = channel.socket.localAddress ?? '';
    this.leaderAddress = channel.socket.remoteAddress ?? '';
    channel.keepAlive();
    this.live = new FollowerLive(peers.length, (m) => this.channel.send(m), where, timeoutMs);
    this.joins = new FollowerLive(peers.length, (m) => this.channel.send(m), where, timeoutMs, REJOIN);
    this.runs = new FollowerRuns(peers.length, (m) => this.channel.send(m), where, exchangeLimit(peers.length), timeoutMs);
    if (rejoined) {
      this.live.startAt(rejoined.liveSeq);
      this.joins.startAt(rejoined.joinSeq);
    }
    const leader = 0;
    channel.listen(
      (m) => {
        const n = this.peers.length;
        if (m.t === 'xall') {
          if (!isInt(m.seq, 1, this.seq) || !Array.isArray(m.values) || m.values.length !== n)
            return channel.drop(`the leader sent an invalid result for exchange #${quote(m.seq)}`);
          const values = m.values as unknown[];
          this.settle(m.seq, (s) => s.resolve(values));
        } else if (m.t === 'lxall' || m.t === 'jxall' || m.t === 'rxall' || m.t === 'rxcut') {
          const problem = (m.t === 'lxall' ? this.live : m.t === 'jxall' ? this.joins : this.runs).onMessage(m);
          if (problem) return channel.drop(problem);
        } else if (m.t === 'rejoining' || m.t === 'revived' || m.t === 'rejoinEnded') {
          const problem = this.onRejoinMessage(m);
          if (problem) return channel.drop(`the leader sent an invalid ${m.t}: ${problem}`);
        } else if (m.t === 'xerr') {
          const problem = isInt(m.seq, 1, this.seq) ? errorProblem(m) : 'no such exchange';
          if (problem) return channel.drop(`the leader sent an invalid error for exchange #${quote(m.seq)}: ${problem}`);
          this.settle(m.seq as number, (s) => s.reject(new RankflowError(m.code as never, m.message as string, m.rank === undefined ? undefined : { rank: m.rank as number })));
        } else if (m.t === 'lost') {
          if (!isInt(m.index, 0, n - 1) || !isText(m.reason, LIMITS.textChars)) return channel.drop('the leader sent an invalid loss');
          this.markLost(m.index, m.reason);
        } else if (m.t === 'failed') {
          const problem = isInt(m.from, 0, n - 1) && m.from !== this.self ? failureProblem(m.failure, this.peers[m.from]!) : `from ${quote(m.from)} is not another process`;
          if (problem) return channel.drop(`the leader relayed an invalid failure: ${problem}`);
          this.rankFailed(toFailure(m.failure as Record<string, unknown>));
        } else if (m.t === 'released') {
          const problem = isInt(m.from, 0, n - 1) && m.from !== this.self ? releaseProblem(m.release, this.peers[m.from]!) : `from ${quote(m.from)} is not another process`;
          if (problem) return channel.drop(`the leader relayed an invalid release: ${problem}`);
          this.released(toRelease(m.release as Record<string, unknown>));
        } else if (m.t === 'bye') {
          this.leaderLeft = true;
        } else {
          channel.drop(`the leader sent ${quote(m.t)}, not a message of a formed world`);
        }
      },
      (reason) => {
        if (this.closed) return;
        if (this.leaderLeft) {
          this.failPending(new RankflowError('STATE', `${where}: the leader closed the rendezvous`, { state: 'closed' }));
          for (const x of [this.live, this.joins, this.runs]) x.fail(new RankflowError('STATE', `${where}: the leader closed the rendezvous`, { state: 'closed' }));
          return;
        }
        this.markLost(leader, `${reason}, seen by ${who(self)}`);
        for (const x of [this.live, this.joins, this.runs]) x.fail(this.lostError(leader));
      },
    );
  }

  /** A rejoin, as the leader tells it: begun (the range of a lost process), its process back in the world, or ended. */
  private onRejoinMessage(m: Incoming): string | undefined {
    const i = m.index, was = isInt(i, 1, this.peers.length - 1) ? this.peers[i] : undefined;
    if (was === undefined || i === this.self) return `index ${quote(i)} is not another follower`;
    if (m.t === 'rejoining') {
      const p = m.peer;
      if (!this.lost.has(i as number) || this.rejoining) return 'not a lost process, or a rejoin is already in progress';
      const last = this.peers[this.peers.length - 1]!;
      if (!isObject(p) || entryProblem(p, last.rankOffset + last.localRanks) !== undefined || p.rankOffset !== was.rankOffset || p.localRanks !== was.localRanks)
        return `peer ${quote(p)} is not an entry for ${who(was)}'s range`;
      const peer: RendezvousPeer = { rankOffset: was.rankOffset, localRanks: was.localRanks, payload: p.payload as Record<string, unknown>, hostId: p.hostId as string, nodeId: p.nodeId as string, pid: p.pid as number };
      this.rejoining = { index: i as number, peer };
      for (const l of this.rejoinListeners) l.rejoining(this.rejoining);
    } else if (m.t === 'revived') {
      if (this.rejoining?.index !== i) return 'no such rejoin';
      (this.peers as RendezvousPeer[])[i as number] = this.rejoining!.peer;
      this.lost.delete(i as number);
      this.rejoining = undefined;
    } else {
      if (!isText(m.reason, LIMITS.textChars)) return 'reason is not a string of bounded length';
      if (this.rejoining?.index !== i) return undefined;  // ended before this process heard of it
      this.rejoining = undefined;
      for (const l of this.rejoinListeners) l.ended(i as number, m.reason);
    }
    return undefined;
  }

  onRejoin(l: RejoinListener): void {
    this.rejoinListeners.push(l);
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
      wire = this.wire(value, seq);
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
    this.channel.send({ t: 'failed', from: this.self, failure: Session.failureWire(failure) });
  }

  announceRelease(release: RunRelease): void {
    if (this.closed || this.leaderLeft) return;
    this.channel.send({ t: 'released', from: this.self, release: Session.releaseWire(release) });
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
    for (const x of [this.live, this.joins, this.runs]) x.fail(new RankflowError('STATE', `${this.where}: closed`, { state: 'closed' }));
    this.closed = true;
    await this.channel.endAndWait({ t: 'bye' });
  }
}
