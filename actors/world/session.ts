// A formed world's connections, after the table, on the leader's side (follower-session.ts has a
// follower's): `exchange` (an all-gather of small JSON values through the leader), loss detection,
// failure relay (a star: the leader passes each follower's announcements on), and close. Both sides
// implement one abstract Session (session-base.ts); the messages of an elastic world's survivors' and
// run ends' exchanges go to their sides (live-exchange.ts, run-exchange.ts). Every message is checked
// before it is acted on; a peer that breaks the protocol is cut off, and reported lost with what it
// sent. A follower that took over from a lost leader (takeover.ts) leads with a LeaderSession too: it
// adopts its own exchanges waiting and takes in the others' resumes (world/resume.ts).
import { debuglog } from 'node:util';

import { RankflowError } from '../core/errors.js';
import type { Channel } from './channel.js';
import { LeaderJoins, LeaderLive, gathering, give, type LeaderOut } from './live-exchange.js';
import { LeaderRuns } from './run-exchange.js';
import { failureProblem, isInt, jsonBytes, quote, releaseProblem, toFailure, toPeer, toRelease, who, LIMITS, type Incoming, type Join, type Message } from './protocol.js';
import type { ElasticRendezvous, RankFailure, RejoinedAt, RendezvousPeer, RunRelease } from './rendezvous.js';
import { rejoinProblem } from './rejoin.js';
import type { HandOver } from './resume.js';
import { Session, exchangeLimit, type PendingExchange, type WorldState } from './session-base.js';

// How far a follower's exchanges may run ahead of the leader's: in step, a follower is at most
// one ahead (it cannot finish #n without the leader's value for #n).
const MAX_SEQ_AHEAD = 16;

const debug = debuglog('rankflow');

export class LeaderSession extends Session implements ElasticRendezvous {
  private readonly pending = new Map<number, PendingExchange>();
  private readonly goodbyes = new Set<number>();
  protected readonly live: LeaderLive;
  protected readonly joins: LeaderJoins;
  protected readonly runs: LeaderRuns;
  private rejoining?: { index: number; ch: Channel; join: Join };
  /** a leader that took over (takeover.ts): the followers whose resume it still waits for */
  private awaiting?: Set<number>;
  /** an elastic world's rendezvous, still listening for rejoins (leader.ts) and resumes (takeover.ts): closed with the session */
  door?: { close(): void };

  readonly leaderAddress: string;

  constructor(
    peers: RendezvousPeer[],
    private readonly channels: (Channel | undefined)[],
    timeoutMs: number,
    where: string,
    readonly localAddress: string,
    /** a follower that takes over: its index and what it knows of the world */
    took?: { self: number; state: WorldState },
  ) {
    super(peers, took?.self ?? channels.indexOf(undefined), timeoutMs, where, took?.state);
    this.leaderAddress = localAddress;
    const isLost = (i: number) => this.lost.has(i);
    const out: LeaderOut = { broadcast: (m) => this.broadcast(m), sendTo: (i, m) => this.channels[i]?.send(m) };
    this.live = new LeaderLive(peers, this.self, isLost, out, where, timeoutMs);
    this.joins = new LeaderJoins(peers, this.self, isLost, out, where, timeoutMs);
    this.runs = new LeaderRuns(peers, this.self, isLost, out, where, exchangeLimit(peers.length), timeoutMs);
    channels.forEach((ch, index) => ch && this.attach(ch, index));
  }

  /** takeover.ts: this process leads now; its exchanges waiting (a follower's until now) are its own; `awaiting`: the followers to resume. */
  adopt(h: HandOver, awaiting: number[]): void {
    this.live.adopt(h.live);
    this.joins.adopt(h.joins);
    this.runs.adopt(h.runs);
    this.awaiting = new Set(awaiting);
    this.takenOver();
  }

  /** takeover.ts: follower `index` resumed on `ch` (its resume checked: resume.ts). */
  resumed(ch: Channel, index: number, r: HandOver): void {
    this.awaiting?.delete(index);
    this.channels[index] = ch;
    this.attach(ch, index);
    ch.send({ t: 'resumed', leader: this.self, pid: this.peers[this.self]!.pid, lost: [...this.lost.keys()] });
    for (const i of r.lost) this.loseFollower(i, `lost, as ${who(this.peers[index]!)} knew when the leader was lost`);
    this.live.resume(index, r.live);
    this.joins.resume(index, r.joins);
    this.runs.resume(index, r.runs);
    this.takenOver();
  }

  /** takeover.ts: which followers have yet to resume, and whether `index` is one. */
  awaits(index?: number): number[] | boolean {
    return index === undefined ? [...(this.awaiting ?? [])] : this.awaiting?.has(index) === true;
  }

  /** Follower `index` is lost (`why`): its connection is cut, or, one that has not resumed, it is marked lost here. */
  loseFollower(index: number, why: string): void {
    if (this.lost.has(index) || index === this.self) return;
    const ch = this.channels[index];
    if (ch) return ch.drop(why);
    this.awaiting?.delete(index);
    this.lostNow(index, why);
    this.takenOver();
  }

  private lostNow(index: number, why: string): void {
    for (const other of this.channels) if (other !== undefined && other !== this.channels[index]) other.send({ t: 'lost', index, reason: why });
    this.markLost(index, why);
    for (const x of [this.live, this.joins, this.runs]) x.recheck();  // the survivors' exchanges that waited only for it
  }

  /** Once every follower resumed (or was lost): the runs open when the old leader was lost are decided. */
  private takenOver(): void {
    if (this.awaiting?.size !== 0) return;
    this.awaiting = undefined;
    this.runs.settleTakeover();
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
          this.lostNow(index, `${reason}, seen by the leader`);
        },
      );
    }
  }

  /** leader.ts: an authenticated connection's join after the table: a rejoin, or refused (rejoin.ts). */
  offerRejoin(ch: Channel, m: Incoming): void {
    const last = this.peers[this.peers.length - 1]!;
    // Taking over from a lost leader: the rejoiner is told to wait (it retries until its timeout: follower.ts).
    if (!this.closed && this.awaiting && this.state.rejoinListeners.length > 0)
      return ch.dismiss({ t: 'wait', reason: `${this.where}: the world is taking over from its lost leader (${this.awaiting.size} process(es) yet to resume)` });
    const problem = this.closed ? 'the world is closing' : this.state.rejoinListeners.length === 0 ? 'the world is not elastic'
      : rejoinProblem(m, this.peers, new Set(this.lost.keys()), this.rejoining !== undefined, last.rankOffset + last.localRanks, this.self);
    if (problem) return ch.dismiss({ t: 'error', code: 'EINVAL', message: `${this.where}: the leader refused this rejoin: ${problem}` });
    const j = m as unknown as Join;
    const join: Join = { t: 'join', worldSize: j.worldSize, rankOffset: j.rankOffset, localRanks: j.localRanks, payload: j.payload, hostId: j.hostId, nodeId: j.nodeId, pid: j.pid };
    const index = this.peers.findIndex((p) => p.rankOffset === j.rankOffset);
    this.rejoining = { index, ch, join };
    ch.listen((later) => ch.drop(`it sent ${quote(later.t)} before its table`), (reason) => {
      if (this.rejoining?.ch === ch) this.endRejoin(`the rejoining process left (${reason})`);
    });
    const peer = toPeer(join);
    const joinSeq = this.joins.newRound();
    debug('%s: began the rejoin of %s', this.where, who(peer));
    for (const c of this.channels) c?.send({ t: 'rejoining', index, peer, joinSeq });
    for (const l of this.state.rejoinListeners) l.rejoining({ index, peer });
  }

  admitRejoin(at: Omit<RejoinedAt, 'liveSeq' | 'joinSeq'>): void {
    const r = this.rejoining;
    if (r === undefined) return;
    this.rejoining = undefined;
    (this.peers as RendezvousPeer[])[r.index] = toPeer(r.join);
    r.ch.send({ t: 'table', peers: [...this.peers], rejoined: { ...at, liveSeq: this.live.at, joinSeq: this.joins.at, leader: this.self } });
    this.lost.delete(r.index);
    this.goodbyes.delete(r.index);
    this.channels[r.index] = r.ch;
    this.attach(r.ch, r.index);
    for (const c of this.channels) if (c !== r.ch) c?.send({ t: 'revived', index: r.index });
    debug('%s: sent its table to the rejoining %s', this.where, who(this.peers[r.index]!));
  }

  endRejoin(reason: string, pid?: number): void {
    const r = this.rejoining;
    if (r === undefined || (pid !== undefined && r.join.pid !== pid)) return;
    this.rejoining = undefined;
    r.ch.end({ t: 'error', code: 'RANK_FAILED', message: `${this.where}: the rejoin ended: ${reason}`, rank: r.join.rankOffset });
    for (const c of this.channels) c?.send({ t: 'rejoinEnded', index: r.index, reason: reason.slice(0, LIMITS.textChars) });
    for (const l of this.state.rejoinListeners) l.ended(r.index, reason);
  }

  exchange<T>(value: T, opts?: { timeoutMs?: number }): Promise<T[]> {
    let seq: number, wire: unknown;
    try {
      ({ seq, wire } = this.open(value));
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
