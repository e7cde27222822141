// A follower's side of a formed world (session.ts has the leader's; both implement session-base.ts):
// its exchanges go to the leader, which relays every other process's messages to it. In an elastic
// world the leader's loss is not the end (takeover.ts): the follower marks it lost as any process,
// keeps its survivors' and run ends' exchanges waiting, and hands them on (handOver) to the next
// leader it reaches (reconnect), or leads itself.
import { RankflowError } from '../core/errors.js';
import type { Channel } from './channel.js';
import { FollowerLive, MAX_AHEAD, REJOIN } from './live-exchange.js';
import { FollowerRuns, type RunEnds } from './run-exchange.js';
import {
  LIMITS, entryProblem, errorProblem, failureProblem, isInt, isObject, isText, quote, releaseProblem, toFailure, toRelease, who,
  type Incoming, type Join, type Message,
} from './protocol.js';
import type { HandOver } from './resume.js';
import type { ElasticRendezvous, RankFailure, RejoinedAt, Rejoining, RendezvousPeer, RunRelease } from './rendezvous.js';
import { Session, WorldState, exchangeLimit, type PendingExchange } from './session-base.js';

export class FollowerSession extends Session implements ElasticRendezvous {
  private readonly pending = new Map<number, NonNullable<PendingExchange['settle']>>();
  private leaderLeft = false;
  protected readonly live: FollowerLive;
  protected readonly joins: FollowerLive;
  protected readonly runs: FollowerRuns;
  private rejoining?: Rejoining;
  /** the last rejoiner the leader took back (revived): its join may still be in progress here */
  private revived?: number;
  localAddress = '';
  leaderAddress = '';
  /** an elastic world's (takeover.ts): called once the leader is lost (it is marked lost first), instead of failing the exchanges */
  onLeaderLost?: (reason: string) => void;
  /** while no leader is reached (takeover.ts): what this process sends, for the next one */
  private parked?: Message[];

  constructor(
    peers: RendezvousPeer[],
    private channel: Channel,
    private readonly me: Join,
    timeoutMs: number,
    where: string,
    readonly rejoined?: RejoinedAt,
    /** the leader's index in `peers`: 0 at formation, the table's word for a rejoiner */
    private leader = rejoined?.leader ?? 0,
    state?: WorldState,
  ) {
    super(peers, peers.findIndex((p) => p.rankOffset === me.rankOffset), timeoutMs, where, state);
    const send = (m: Message) => this.send(m);
    this.live = new FollowerLive(peers.length, send, where, timeoutMs);
    this.joins = new FollowerLive(peers.length, send, where, timeoutMs, REJOIN);
    this.runs = new FollowerRuns(peers.length, send, where, exchangeLimit(peers.length), timeoutMs);
    if (rejoined) {
      this.live.startAt(rejoined.liveSeq);
      this.joins.startAt(rejoined.joinSeq);
    }
    this.attach(channel);
  }

  /** How long a survivors' or run end's wait lasts from the leader's loss: past the takeover's timeout and the resumes' after it. */
  private get pastTakeoverMs(): number {
    return 3 * this.timeoutMs;
  }

  /** While no leader is reached (takeover.ts), an exchange opened waits past the takeover as those open at the loss do (extendWaits). */
  private untilDecided(opts?: { timeoutMs?: number }): { timeoutMs?: number } | undefined {
    return this.parked ? { timeoutMs: Math.max(opts?.timeoutMs ?? this.timeoutMs, this.pastTakeoverMs) } : opts;
  }
  override exchangeAmongLive<T>(value: T, opts?: { timeoutMs?: number }): Promise<Array<T | null>> {
    return super.exchangeAmongLive(value, this.untilDecided(opts));
  }
  override exchangeRunEnd(run: number, value: unknown, opts?: { timeoutMs?: number }): Promise<RunEnds> {
    return super.exchangeRunEnd(run, value, this.untilDecided(opts));
  }

  /** The leader's index in `peers` now. */
  get leaderIndex(): number {
    return this.leader;
  }

  private send(m: Message): void {
    if (this.parked) this.parked.push(m);
    else this.channel.send(m);
  }

  /**
   * takeover.ts: a new leader (index `leader`) answered this process's resume on `channel` (`lost`: the
   * processes it knows lost): it goes on there, first with what it sent since its resume.
   */
  reconnect(channel: Channel, leader: number, lost: number[]): void {
    this.channel = channel;
    this.leader = leader;
    this.attach(channel);
    for (const m of this.parked?.splice(0) ?? []) channel.send(m);
    this.parked = undefined;
    for (const i of lost) this.markLost(i, `lost, as the new leader (${who(this.peers[leader]!)}) knew`);
  }

  /** takeover.ts: what this process hands on to the next leader (what it sent since the loss is in it: only announcements stay parked). */
  handOver(): HandOver {
    if (this.parked) this.parked = this.parked.filter((m) => m.t === 'failed' || m.t === 'released');
    return { lost: [...this.lost.keys()], live: this.live.handOver(), joins: this.joins.handOver(), runs: this.runs.handOver() };
  }

  /** takeover.ts: no leader could be reached: every exchange waiting ends with `error`. */
  failWorld(error: RankflowError): void {
    this.failPending(error);
    for (const x of [this.live, this.joins, this.runs]) x.fail(error);
  }

  /**
   * takeover.ts: a rejoin in progress when the leader was lost ends here (the new leader knows nothing
   * of it). One whose rejoiner had its table (revived) but whose join has not ended here yet: the
   * rejoiner is lost again (its windows were mapped against the old membership): its join ends and
   * the new leader hears of the loss with this process's resume.
   */
  endRejoinHere(reason: string): void {
    const r = this.rejoining;
    this.rejoining = undefined;
    if (r) for (const l of this.state.rejoinListeners) l.ended(r.index, reason);
    const v = this.revived;
    this.revived = undefined;
    if (v !== undefined && this.state.rejoinListeners.some((l) => l.joining?.(v) === true))
      this.markLost(v, `its rejoin had not ended when ${reason}: it takes its range back again with world.rejoin`);
  }

  /** The leader's messages on `channel`, and its loss. */
  private attach(channel: Channel): void {
    const { where, me: self } = this;
    this.localAddress = channel.socket.localAddress ?? '';
    this.leaderAddress = channel.socket.remoteAddress ?? '';
    channel.keepAlive();
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
        if (this.closed || this.channel !== channel) return;
        if (this.leaderLeft) {
          this.failPending(new RankflowError('STATE', `${where}: the leader closed the rendezvous`, { state: 'closed' }));
          for (const x of [this.live, this.joins, this.runs]) x.fail(new RankflowError('STATE', `${where}: the leader closed the rendezvous`, { state: 'closed' }));
          return;
        }
        const leader = this.leader;
        if (this.onLeaderLost) this.parked ??= [];  // from now on, what this process sends waits for the next leader
        this.markLost(leader, `${reason}, seen by ${who(self)}`);
        if (this.onLeaderLost) {
          // The takeover (its timeout), then the survivors' resumes (theirs), decide these exchanges; their own clocks wait past both.
          // A rejoin's exchanges end instead: the rejoin in progress ends with the leader (takeover.ts endRejoinHere).
          for (const x of [this.live, this.runs]) x.extendWaits(this.pastTakeoverMs);
          this.joins.endRound();
          return this.onLeaderLost(reason);
        }
        for (const x of [this.live, this.joins, this.runs]) x.fail(this.lostError(leader));
      },
    );
  }

  /** A rejoin, as the leader tells it: begun (the range of a lost process), its process back in the world, or ended. */
  private onRejoinMessage(m: Incoming): string | undefined {
    const i = m.index, was = isInt(i, 0, this.peers.length - 1) ? this.peers[i] : undefined;
    if (was === undefined || i === this.self || i === this.leader) return `index ${quote(i)} is not another follower`;
    if (m.t === 'rejoining') {
      const p = m.peer;
      if (!this.lost.has(i as number) || this.rejoining) return 'not a lost process, or a rejoin is already in progress';
      if (!isInt(m.joinSeq, this.joins.at, this.joins.at + MAX_AHEAD)) return `joinSeq ${quote(m.joinSeq)} is not a count of the rejoins' exchanges in [${this.joins.at}, ${this.joins.at + MAX_AHEAD}]`;
      const last = this.peers[this.peers.length - 1]!;
      if (!isObject(p) || entryProblem(p, last.rankOffset + last.localRanks) !== undefined || p.rankOffset !== was.rankOffset || p.localRanks !== was.localRanks)
        return `peer ${quote(p)} is not an entry for ${who(was)}'s range`;
      const peer: RendezvousPeer = { rankOffset: was.rankOffset, localRanks: was.localRanks, payload: p.payload as Record<string, unknown>, hostId: p.hostId as string, nodeId: p.nodeId as string, pid: p.pid as number };
      this.rejoining = { index: i as number, peer };
      this.joins.endRound();  // an earlier rejoin's, ended part-way (LeaderJoins)
      this.joins.startAt(m.joinSeq as number);
      for (const l of this.state.rejoinListeners) l.rejoining(this.rejoining);
    } else if (m.t === 'revived') {
      if (this.rejoining?.index !== i) return 'no such rejoin';
      (this.peers as RendezvousPeer[])[i as number] = this.rejoining!.peer;
      this.lost.delete(i as number);
      this.rejoining = undefined;
      this.revived = i as number;
    } else {
      if (!isText(m.reason, LIMITS.textChars)) return 'reason is not a string of bounded length';
      if (this.rejoining?.index !== i) return undefined;  // ended before this process heard of it
      this.rejoining = undefined;
      for (const l of this.state.rejoinListeners) l.ended(i as number, m.reason);
    }
    return undefined;
  }

  private settle(seq: number, f: (s: NonNullable<PendingExchange['settle']>) => void): void {
    const s = this.pending.get(seq);
    if (s === undefined) return;
    this.pending.delete(seq);
    clearTimeout(s.timer);
    f(s);
  }

  exchange<T>(value: T, opts?: { timeoutMs?: number }): Promise<T[]> {
    let seq: number, wire: unknown;
    try {
      ({ seq, wire } = this.open(value, this.leaderLeft ? new RankflowError('STATE', `${this.where}: the leader closed the rendezvous`, { state: 'closed' }) : undefined));
    } catch (e) {
      return Promise.reject(e);
    }
    const timeoutMs = opts?.timeoutMs ?? this.timeoutMs;
    return new Promise<T[]>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(seq);
        reject(new RankflowError('TIMEOUT_CPU', `${this.where}: exchange #${seq}: no answer from the leader after ${timeoutMs} ms`, { rank: this.peers[this.leader]!.rankOffset }));
      }, timeoutMs);
      this.pending.set(seq, { resolve: resolve as (v: unknown[]) => void, reject, timer });
      this.send({ t: 'x', seq, value: wire });
    });
  }

  announceFailure(failure: RankFailure): void {
    if (this.closed || this.leaderLeft) return;
    this.send({ t: 'failed', from: this.self, failure: Session.failureWire(failure) });
  }

  announceRelease(release: RunRelease): void {
    if (this.closed || this.leaderLeft) return;
    this.send({ t: 'released', from: this.self, release: Session.releaseWire(release) });
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
