// An elastic world outlives its leader: when a follower's connection to the leader closes, it marks
// the leader lost (its ranks leave, as any lost process's: actors/elastic.ts) and the world takes over.
// The survivor lowest by rankOffset leads: it binds the rendezvous address itself (EADDRINUSE: another
// took it first, it follows that one) and adopts its own exchanges waiting (session.ts adopt). Every
// other survivor reconnects to that address with the world's token, authenticated exactly as a join
// (auth.ts), and sends a `resume` of what it knows (world/resume.ts): the new leader checks every field,
// takes the losses it names, gives each process the results it missed and gathers the rest anew
// without the old leader. A candidate that does not bind within its turn is passed over (the next one
// binds), and a follower that reaches no leader within its timeout fails the group, saying so.
// ElasticSession is what an elastic world's process holds: the side it plays now, behind one face.
import net from 'node:net';
import { debuglog } from 'node:util';

import { RankflowError } from '../core/errors.js';
import { sleepUnless } from '../core/abort.js';
import { FollowerAuth, LeaderAuth } from './auth.js';
import { AUTHENTICATED, Channel, UNAUTHENTICATED } from './channel.js';
import { FollowerSession } from './follower-session.js';
import { LIMITS, quote, who, type Incoming, type Join } from './protocol.js';
import type { ElasticRendezvous, Forming, PeerLost, RankFailure, RejoinedAt, Rendezvous, RendezvousPeer, RunRelease } from './rendezvous.js';
import { checkResume, refusal, resumeMessage, resumedProblem } from './resume.js';
import { LeaderSession } from './session.js';
import { exchangeLimit, type RejoinListener } from './session-base.js';

const debug = debuglog('rankflow');

// How long each candidate waits after the one before it before it binds the address itself.
const TURN_MS = 300;
// Reconnect backoff: the new leader binds within a ms or two of seeing the loss.
const FIRST_BACKOFF_MS = 5;
const MAX_BACKOFF_MS = 100;
// How often the new leader looks whether a follower that has not resumed yet still runs (one host: its pid).
const PROBE_MS = 20;

type Side = LeaderSession | FollowerSession;

export class ElasticSession implements ElasticRendezvous {
  private side: Side;
  private closed = false;
  /** a rejoining process serves once its createGroup has joined (startup.ts); until then it does not take over */
  private serving: boolean;
  private brokenBy?: RankflowError;
  private readonly broken = new Set<(e: RankflowError) => void>();
  readonly rejoined?: RejoinedAt;

  constructor(session: Rendezvous, private readonly f: Forming, private readonly me: Join) {
    this.side = session as Side;
    this.rejoined = (session as Partial<FollowerSession>).rejoined;
    this.serving = this.rejoined === undefined;
    this.follow();
  }

  get peers(): readonly RendezvousPeer[] { return this.side.peers; }
  get self(): number { return this.side.self; }
  get localAddress(): string { return this.side.localAddress; }
  get leaderAddress(): string { return this.side.leaderAddress; }
  get joinsAt(): number { return this.side.joinsAt; }
  exchange<T>(value: T, opts?: { timeoutMs?: number }): Promise<T[]> { return this.side.exchange(value, opts); }
  exchangeAmongLive<T>(value: T, opts?: { timeoutMs?: number }): Promise<Array<T | null>> { return this.side.exchangeAmongLive(value, opts); }
  exchangeJoin<T>(value: T, opts?: { timeoutMs?: number }): Promise<Array<T | null>> { return this.side.exchangeJoin(value, opts); }
  exchangeRunEnd(run: number, value: unknown, opts?: { timeoutMs?: number }): Promise<unknown[] | undefined> { return this.side.exchangeRunEnd(run, value, opts); }
  hitRunEnds(): void { this.side.hitRunEnds(); }
  onPeerLost(cb: (lost: PeerLost) => void): () => void { return this.side.onPeerLost(cb); }
  onRankFailed(cb: (f: RankFailure) => void): () => void { return this.side.onRankFailed(cb); }
  onRelease(cb: (r: RunRelease) => void): () => void { return this.side.onRelease(cb); }
  announceFailure(f: RankFailure): void { this.side.announceFailure(f); }
  announceRelease(r: RunRelease): void { this.side.announceRelease(r); }
  onRejoin(l: RejoinListener): void { this.side.onRejoin(l); }
  admitRejoin(at: Omit<RejoinedAt, 'liveSeq' | 'joinSeq'>): void { if (this.side instanceof LeaderSession) this.side.admitRejoin(at); }
  endRejoin(reason: string, pid?: number): void { if (this.side instanceof LeaderSession) this.side.endRejoin(reason, pid); }
  /** No leader could be reached after the leader was lost: the world is gone for this process. */
  onBroken(cb: (e: RankflowError) => void): void {
    this.broken.add(cb);
    const e = this.brokenBy;
    if (e) queueMicrotask(() => cb(e));  // broken already (a rejoiner's leader lost while it started its ranks)
  }
  served(): void { this.serving = true; }

  async close(): Promise<void> {
    this.closed = true;
    await this.side.close();
  }

  private follow(): void {
    if (this.side instanceof FollowerSession) this.side.onLeaderLost = (reason) => (this.serving ? void this.takeOver(this.side as FollowerSession, reason) : this.rejoinLost(this.side as FollowerSession, reason));
  }

  /**
   * A rejoining process whose leader was lost before it served: its windows and numbers are the old
   * membership's, which the survivors leave (follower-session.ts endRejoinHere): its rejoin fails at
   * once (RANK_FAILED); a new process takes the range back with world.rejoin.
   */
  private rejoinLost(old: FollowerSession, reason: string): void {
    const gone = old.peers[old.leaderIndex]!;
    this.fail(old, new RankflowError('RANK_FAILED', `${this.f.where}: the world's leader (${who(gone)}) was lost while this process rejoined (${reason}), ` +
      'before it served: the rejoin ended; start the process again with world.rejoin to take the range back', { rank: gone.rankOffset }));
  }

  /** The leader was lost (`old` marked it lost): lead, or reach the one that does, within the timeout. */
  private async takeOver(old: FollowerSession, reason: string): Promise<void> {
    const { timeoutMs, where } = this.f;
    const gone = old.peers[old.leaderIndex]!;
    old.endRejoinHere(`the leader (${who(gone)}) was lost`);
    const started = Date.now(), deadline = started + timeoutMs;
    const lost = new Set(old.state.lost.keys());
    const turn = old.peers.map((_, i) => i).filter((i) => !lost.has(i)).indexOf(old.self);
    debug('%s: the leader %s was lost (%s); this process is candidate %d', where, who(gone), reason, turn);
    let backoff = FIRST_BACKOFF_MS, last = 'none';
    while (!this.closed && Date.now() < deadline) {
      if (Date.now() - started >= turn * TURN_MS) {
        const server = await bind(this.f);
        if (server instanceof net.Server) return this.lead(old, server);
        last = server;
      }
      const r = await reach(this.f, old, this.me, deadline);
      if (this.closed) return r.kind === 'resumed' ? r.ch.destroy() : undefined;  // the group was destroyed meanwhile
      if (r.kind === 'resumed') {
        debug('%s: resumed with the new leader %s', where, who(old.peers[r.leader]!));
        return old.reconnect(r.ch, r.leader, r.lost);
      }
      if (r.kind === 'refused') return this.fail(old, r.error);
      last = r.reason;
      await sleepUnless(Math.min(backoff * (0.8 + 0.4 * Math.random()), Math.max(0, deadline - Date.now())), undefined);
      backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
    }
    if (!this.closed)
      this.fail(old, new RankflowError('RANK_FAILED', `${where}: the world's leader (${who(gone)}) was lost (${reason}) and no process took over ` +
        `within ${timeoutMs} ms (last attempt: ${last}): this process cannot re-form with the others; create the group again`, { rank: gone.rankOffset }));
  }

  private fail(old: FollowerSession, error: RankflowError): void {
    this.brokenBy ??= error;
    old.failWorld(error);
    for (const cb of this.broken) cb(error);
  }

  /** This process leads: a LeaderSession over what it knew as a follower, listening for the others' resumes (and rejoins). */
  private lead(old: FollowerSession, server: net.Server): void {
    const { timeoutMs, where } = this.f;
    const address = (server.address() as net.AddressInfo).address;
    const leader = new LeaderSession(old.peers as RendezvousPeer[], old.peers.map(() => undefined), timeoutMs, where, address, { self: old.self, state: old.state });
    const awaiting = old.peers.map((_, i) => i).filter((i) => i !== old.self && !old.state.lost.has(i));
    debug('%s: this process leads now; awaiting the resumes of %s', where, awaiting.map((i) => who(old.peers[i]!)).join(', ') || 'nobody');
    leader.adopt(old.handOver(), awaiting);
    // A follower that does not resume is lost: at once when its process is gone (one host: its pid), else at the timeout.
    const until = Date.now() + timeoutMs;
    const probe = setInterval(() => {
      const left = leader.awaits() as number[];
      if (left.length === 0) return clearInterval(probe);
      for (const i of left) {
        const p = leader.peers[i]!;
        if (!alive(p.pid)) leader.loseFollower(i, `its process (pid ${p.pid}) ended before it resumed with the new leader`);
        else if (Date.now() > until) leader.loseFollower(i, `it did not resume with the new leader within ${timeoutMs} ms`);
      }
    }, PROBE_MS);
    probe.unref();
    const door = openDoor(server, this.f, leader);
    leader.door = { close: () => { clearInterval(probe); door.close(); } };
    this.side = leader;
  }
}

/** Listens at the rendezvous address, or says why not (EADDRINUSE: another process took it). */
function bind(f: Forming): Promise<net.Server | string> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.once('error', (e: NodeJS.ErrnoException) => resolve(`cannot listen at ${f.host}:${f.port}: ${e.code ?? e.message}`));
    server.listen({ host: f.host, port: f.port }, () => {
      server.removeAllListeners('error');
      server.on('error', () => {});  // after listening, errors concern one connection, which says so itself
      resolve(server);
    });
  });
}

/** Whether process `pid` runs (this host's; EPERM: it does, another user's). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** The new leader's door: every connection authenticates first; then a resume (a survivor) or a join (a rejoin) is handed to the session. */
function openDoor(server: net.Server, f: Forming, leader: LeaderSession): { close(): void } {
  server.unref();  // listening does not keep the process alive
  const waiting = new Set<Channel>();
  const runValueBytes = exchangeLimit(leader.peers.length);
  server.on('connection', (socket) => {
    const ch = new Channel(socket, UNAUTHENTICATED);
    if (waiting.size >= LIMITS.pendingConnections) return void ch.destroy();
    waiting.add(ch);
    const auth = new LeaderAuth(f.key);
    let authenticated = false;
    const timer = setTimeout(() => ch.drop(`no resume or join within ${LIMITS.joinDeadlineMs} ms`), LIMITS.joinDeadlineMs);
    const done = (): void => { waiting.delete(ch); clearTimeout(timer); };
    ch.listen((m: Incoming) => {
      if (!authenticated) {
        const answer = auth.answer(m);
        if ('problem' in answer) return done(), ch.dismiss({ t: 'denied' });
        authenticated = true;
        ch.setLimits(AUTHENTICATED);
        return ch.send(answer.proof);
      }
      done();
      if (m.t === 'join') return leader.offerRejoin(ch, m);
      const r = checkResume(m, { peers: leader.peers, lost: new Set(leader.state.lost.keys()), leader: leader.self, awaits: (i) => leader.awaits(i) === true, runValueBytes });
      if ('problem' in r) {
        debug('%s: refused the resume from %s: %s', f.where, ch.remote, r.problem);
        return ch.dismiss({ t: 'error', code: 'EINVAL', message: `${f.where}: the new leader refused this resume: ${r.problem}` });
      }
      leader.resumed(ch, r.index, r.handOver);
    }, () => done());
    ch.send(auth.challenge());
  });
  return { close: () => { server.close(); for (const ch of waiting) ch.destroy(); } };
}

type Reached =
  | { kind: 'resumed'; ch: Channel; leader: number; lost: number[] }
  | { kind: 'refused'; error: RankflowError }
  | { kind: 'retry'; reason: string };

/** One attempt at the rendezvous address: authenticate as any join, resume, and wait for the new leader's answer. */
function reach(f: Forming, old: FollowerSession, me: Join, deadline: number): Promise<Reached> {
  return new Promise((resolve) => {
    const ch = new Channel(net.connect({ host: f.host, port: f.port }), UNAUTHENTICATED);
    const auth = new FollowerAuth(f.key);
    let stage: 'challenge' | 'proof' | 'resumed' = 'challenge', settled = false;
    const settle = (r: Reached): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (r.kind === 'resumed') ch.hold();  // what follows in the same chunk is the session's
      else ch.destroy();
      resolve(r);
    };
    const timer = setTimeout(() => settle({ kind: 'retry', reason: 'deadline reached' }), Math.max(0, deadline - Date.now()));
    ch.listen((m) => {
      if (stage === 'challenge') {
        const r = auth.respond(m);
        if ('problem' in r) return settle({ kind: 'retry', reason: `something answers at ${ch.remote} but ${r.problem}` });
        ch.send(r.reply);
        stage = 'proof';
      } else if (stage === 'proof') {
        const problem = auth.check(m);
        if (problem) return settle({ kind: 'retry', reason: problem });
        ch.setLimits(AUTHENTICATED);
        ch.send(resumeMessage(me, old.handOver()));
        stage = 'resumed';
      } else {
        const problem = resumedProblem(m, old.peers, old.self, old.state.lost);
        if (problem) return settle({ kind: 'refused', error: new RankflowError('EINVAL', `${f.where}: the new leader sent an invalid resumed: ${problem}`) });
        if (m.t === 'error') return settle({ kind: 'refused', error: new RankflowError('EINVAL', refusal(m)) });
        settle({ kind: 'resumed', ch, leader: m.leader as number, lost: m.lost as number[] });
      }
    }, (reason) => settle({ kind: 'retry', reason: stage === 'challenge' ? reason : `the connection closed before the new leader answered (${reason}) ${quote(stage)}` }));
  });
}
