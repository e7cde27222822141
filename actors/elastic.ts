// An elastic group's membership, as the main thread keeps it (createGroup({ elastic: true }): backend
// 'host', the ranks of one process or of a world on one host). A rank that fails leaves: its peers' ops in flight end at once
// with RANK_FAILED (the left word of their abort words, read by every wait and at every op's start),
// the group is 'degraded' and says so (rankLeft), and before the next op every survivor is put back
// in step (the group's sequence number, as after a run's release) and writes the new live mask into
// its workspace (ops/membership.cc), which its ops read: they leave the ranks outside it out.
// In a world the ranks of another process leave when it is lost or announces their failure, and the
// survivor processes agree on the numbers and the mask through the survivors' exchange
// (elastic-world.ts); a process started with world.rejoin takes a range back (elastic-join.ts). The
// leader process's loss is one more such loss: another process takes over its relay (world/takeover.ts).
// replaceRank(r) starts a fresh worker and context for r at the group's numbers; the survivors map
// its window over the old one and a barrier with it ends the join: the group is 'ready' again.
import type { EventEmitter } from 'eventemitter3';

import { RankflowError, invalid } from './core/errors.js';
import { ABORT, TRAFFIC, type ExportedSegments } from './core/addon.js';
import { checkIntIn } from './core/validate.js';
import type { FailureInfo } from '../machines/index.js';
import type { Membership as Told, RankInit } from '../workers/protocol.js';
import type { Ranks } from './ranks.js';
import type { GroupEvents } from './group.js';
import type { ElasticRendezvous, PeerLost, RejoinedAt, Rejoining, Rendezvous } from './world/rendezvous.js';
import { agreeOnMembership } from './elastic-world.js';
import { agreeOnJoinPoint, join, rangeOf, type Joining, type JoinSite } from './elastic-join.js';

/** group.on('rankLeft'): rank `rank` left the group at `at` (ms since the epoch), `cause` its failure. */
export interface RankLeft { rank: number; cause: RankflowError; at: number }
/** group.on('rankJoined'): a replacement of rank `rank` serves since `at`. */
export interface RankJoined { rank: number; at: number }

const now = (): number => performance.timeOrigin + performance.now();
const NO_SEGMENTS = { deviceFd: -1, hostFd: -1 };
/** How long the survivors wait for a leaving rank's worker to end before they go on without it. */
const EXIT_MS = 1000;
/** How long a survivor waits for a rejoiner's fds (it starts its workers first: ~0.1-1 s). */
const JOIN_MS = 30_000;

export class Membership {
  /** index = global rank: the whole world's ranks, those of other processes too */
  private readonly live: boolean[];
  private readonly offset: number;
  /** a world's: the survivors' exchange goes through it */
  private rv?: Rendezvous;
  /** a world's: the mask the survivors last agreed on and wrote; they re-form until it is every process's */
  private agreed: bigint;
  /** a world whose leader process was lost and no process took over cannot re-form: the group failed (API.md) */
  broken?: RankflowError;
  /** a world's: the group ops started, the point a rejoin is taken in at (elastic-join.ts) */
  private started = 0;
  /** a world's rejoin in progress, and whether its join runs now */
  private joining?: Joining;
  private joinRunning?: Joining;
  /** a rejoin the leader began while the last one was still ending here: started once it has */
  private nextRejoin?: Rejoining;
  /** a world's: the ops up to this count were in flight somewhere when ranks left: rejected here too (elastic-world.ts) */
  private rejectThrough = 0;
  /** the failure of the rank that left last (a run it ended says so: actors/run.ts) */
  lastLeft?: RankflowError;
  /** membership changes so far (a handle of another membership is refused: ops/dispatch.cc) */
  private epoch = 0;
  /** a rank left since the survivors were last put in step: they are, before the next op */
  private pending = false;
  /** the last change, for what it ended (an AGRS session open across it: since()) */
  private last = { rank: -1, what: 'left' };
  /** the ends of the workers that left and are not yet waited for: nothing of theirs may still write when the survivors go on */
  private exits: Array<Promise<unknown>> = [];

  constructor(
    private readonly ranks: Ranks,
    private readonly events: EventEmitter<GroupEvents>,
    /** the group's queue of collectives: a membership change waits for the op in progress */
    private readonly queue: <T>(body: () => Promise<T>) => Promise<T>,
    /** the survivors' sessions were closed (ops/recover.cc): the group forgets its open one */
    private readonly sessionsClosed: () => void,
    worldSize = ranks.handles.length,
  ) {
    this.live = Array.from({ length: worldSize }, () => true);
    this.offset = ranks.handles[0]!.rank;
    this.agreed = maskOf(this.live);
    ranks.elastic = this;
  }

  /** Whether local rank `local` serves (it has not left, or its replacement has joined). */
  serves(local: number): boolean {
    return this.live[this.offset + local] === true;
  }
  get degraded(): boolean {
    return this.live.includes(false);
  }
  /** The global ids of the ranks serving, ascending (of every process of a world). */
  get liveRanks(): number[] {
    return this.live.flatMap((l, g) => (l ? [g] : []));
  }
  /** A run in a world (actors/run.ts): its op's number (the same in every process), whether a rank left since the survivors re-formed, each leaving as it comes. */
  get op(): number { return this.started; }
  get unformed(): boolean { return this.rv ? maskOf(this.live) !== this.agreed : this.pending; }
  onLeft(cb: () => void): () => void { this.events.on('rankLeft', cb); return () => void this.events.off('rankLeft', cb); }
  /** For what begins now (an AGRS session): its end, RANK_FAILED naming the change, once the membership changed; until then undefined. */
  since(): () => RankflowError | undefined {
    const at = this.epoch;
    return () => {
      if (this.epoch === at) return undefined;
      const { rank, what } = this.last;
      return new RankflowError('RANK_FAILED', `this AGRS session ended when rank ${rank} ${what} the group (the ranks re-formed without its buffer parts): open another once the group is 'ready'`, { rank });
    };
  }
  private locals(): number[] {
    return this.ranks.handles.flatMap((_, r) => (this.live[this.offset + r] ? [r] : []));
  }
  private told(live: boolean[], epoch: number, sessions: number): Told {
    const ids = live.flatMap((l, g) => (l ? [g] : []));
    return { mask: maskOf(live), epoch, live: ids, sessions };
  }

  /** A world (group.ts watchWorld): its lost processes' ranks leave, and so do the ranks another process says failed. */
  watch(rv: Rendezvous): void {
    this.rv = rv;
    rv.onPeerLost((lost: PeerLost) => {
      if (this.joining?.peer.rankOffset === lost.rankOffset) this.abandon(this.joining, `the rejoining process was lost (${lost.reason})`);
      const error = (g: number) => new RankflowError('RANK_FAILED', `rank ${g} is gone: its process left the world (${lost.reason})`, { rank: g });
      for (let g = lost.rankOffset; g < lost.rankOffset + lost.localRanks; g++) this.gone(g, error(g));
    });
    rv.onRankFailed((f) => this.gone(f.rank, new RankflowError('RANK_FAILED', f.message, { rank: f.rank, phase: f.phase })));
    const erv = rv as ElasticRendezvous;
    erv.onBroken?.((e) => this.fail(e));
    if (typeof erv.onRejoin === 'function') erv.onRejoin({ rejoining: (r) => this.rejoining(r), ended: (i, why) => {
      if (this.nextRejoin?.index === i) this.nextRejoin = undefined;
      else if (this.joining?.index === i) this.abandon(this.joining, why);
    }, joining: (i) => this.joining?.index === i && this.joining.ended === undefined });
    if (erv.rejoined) this.adopt(erv.rejoined);
  }

  /** A rejoining process starts where the survivors are (its table: world/rejoin.ts). */
  private adopt(at: RejoinedAt): void {
    const mask = BigInt(`0x${at.mask}`);
    this.live.forEach((_, g) => { this.live[g] = ((mask >> BigInt(g)) & 1n) === 1n; });
    this.agreed = mask;
    this.epoch = at.epoch;
    this.started = at.started;
  }

  /**
   * Before each of the group's ops (group.ts): re-formed if ranks left, a rejoin taken in once its point
   * came, counted; `ended` (an AGRS session's since()): refused once the membership changed under it.
   */
  async beforeOp(ended?: () => RankflowError | undefined): Promise<void> {
    await this.settle();
    if (this.started < this.rejectThrough) {
      this.started++;
      const g = this.lastLeft?.rank;
      throw new RankflowError('RANK_FAILED', `${g !== undefined ? `rank ${g}` : 'a rank'} left the group while this op ran in another process of the world ` +
        `(it ended there, so it ends here too): ${this.lastLeft?.message ?? ''}`, g !== undefined ? { rank: g } : undefined);
    }
    await this.joinIfDue(true);
    this.started++;
    if (this.joining?.at === this.started) void this.queue(() => this.joinIfDue(false)).catch(() => {});
    const gone = ended?.();  // what the re-forming ended (an AGRS session: since()) says so
    if (gone) throw gone;
  }

  /**
   * An op's body (after beforeOp). A combine whose dispatch's membership changed is refused before it
   * sends anything: not counted, as a process that skipped it (its dispatch rejected there) counts none.
   */
  async counted<T>(body: () => Promise<T>): Promise<T> {
    try {
      return await body();
    } catch (e) {
      const err = e as { code?: string; message?: string };
      if (this.rv && err.code === 'EINVAL' && /before the group's membership changed/.test(err.message ?? '')) this.started--;
      throw e;
    }
  }

  /** A rejoin began (every survivor process hears it from the leader): they agree on the point to take it in. */
  private rejoining(r: Rejoining): void {
    if (this.broken || !this.rv) return;
    if (this.joining) {
      this.nextRejoin = r;
      return;
    }
    let settled!: () => void, fail!: (e: RankflowError) => void;
    const gone = new Promise<never>((_, reject) => (fail = reject));
    gone.catch(() => {});
    const j: Joining = { ...r, agreed: new Promise<void>((resolve) => (settled = resolve)), settled: () => settled(), gone };
    this.joinFail.set(j, fail);
    this.joining = j;
    agreeOnJoinPoint(this.rv as ElasticRendezvous, this.started).then((at) => {
      j.at = at;
      j.settled();
      void this.queue(() => this.joinIfDue(false)).catch(() => {});
    }, (e: unknown) => this.abandon(j, RankflowError.from(e).message));
  }

  /** The rejoin ends without the rejoiner: the leader tells it; a survivor's join in progress ends (its barrier: the left word). */
  private abandon(j: Joining, reason: string): void {
    if (j.ended !== undefined) return;
    j.ended = reason;
    j.settled();
    this.joinFail.get(j)?.(new RankflowError('RANK_FAILED', `the rejoin of ranks [${j.peer.rankOffset}, ${j.peer.rankOffset + j.peer.localRanks}) ended: ${reason}`, { rank: j.peer.rankOffset }));
    (this.rv as ElasticRendezvous).endRejoin?.(reason, j.peer.pid);
    if (this.joinRunning !== j) {
      if (this.joining === j) this.finished();
      return;
    }
    for (const g of rangeOf(j.peer)) for (const m of this.ranks.members) m.abortWords?.left(g, `rank ${g}'s rejoin ended: ${reason}`);
  }

  /** In the group's queue: the rejoin's join, if this process is at its point (hold: wait for the point first). */
  private async joinIfDue(hold: boolean): Promise<void> {
    const j = this.joining;
    if (j === undefined) return;
    if (j.at === undefined && j.ended === undefined) {
      if (!hold) return;
      await j.agreed;
    }
    if (this.joining !== j || j.at !== this.started || j.ended !== undefined) {
      if (j.ended !== undefined && this.joining === j) this.finished();
      return;
    }
    await this.settle();
    this.joinRunning = j;
    try {
      const site: JoinSite = {
        rv: this.rv as ElasticRendezvous, ranks: this.ranks, live: this.live, epoch: this.epoch, started: this.started, timeoutMs: JOIN_MS,
        locals: () => this.locals(), told: (live, epoch, sessions) => this.told(live, epoch, sessions),
      };
      const told = await join(site, j);
      if (j.ended !== undefined) throw new RankflowError('RANK_FAILED', `the rejoin of ${rangeOf(j.peer).join(', ')} ended: ${j.ended}`, { rank: j.peer.rankOffset });
      for (const g of rangeOf(j.peer)) this.live[g] = true;
      this.agreed = told.mask;
      this.epoch = told.epoch;
      this.last = { rank: j.peer.rankOffset, what: 'joined' };
      const at = now();
      for (const g of rangeOf(j.peer)) this.events.emit('rankJoined', { rank: g, at });
    } catch (e) {
      this.abandon(j, RankflowError.from(e).message);
      // Some survivor ranks may have taken it in: every process re-forms without it, at a later epoch.
      this.agreed = -1n;
      this.epoch += 2;
    } finally {
      this.joinRunning = undefined;
      this.finished();
    }
  }

  /** The rejoin in progress is over: the next one the leader began meanwhile starts. */
  private finished(): void {
    this.joining = undefined;
    const next = this.nextRejoin;
    this.nextRejoin = undefined;
    if (next && !this.live[next.peer.rankOffset]) this.rejoining(next);
  }
  private readonly joinFail = new WeakMap<Joining, (e: RankflowError) => void>();

  /** The leader process was lost and no process took over its relay (world/takeover.ts): the world cannot re-form; every rank fails, as without elastic. */
  private fail(e: RankflowError): void {
    this.broken ??= new RankflowError('RANK_FAILED', e.message, { ...(e.rank !== undefined ? { rank: e.rank } : {}), cause: e });
    this.live.forEach((_, g) => (g >= this.offset && g < this.offset + this.ranks.handles.length) || this.ranks.failedElsewhere(g, this.broken!, true));
  }

  /** Local rank `local` failed (Ranks.markFailed): it leaves; its peers' ops end with RANK_FAILED, and the group goes on without it. */
  leave(local: number, error: RankflowError): void {
    const h = this.ranks.handles[local]!;
    if (!this.live[h.rank] || this.broken) return;
    this.exits.push(this.ranks.members[local]!.gone.catch(() => {}));
    // The other processes of a world mask it too (they leave it when the announcement arrives).
    this.rv?.announceFailure({ rank: h.rank, message: error.message, ...(error.phase !== undefined ? { phase: error.phase } : {}) });
    this.gone(h.rank, error, false);
    // A rank that failed alive (a wait that timed out) goes: nothing of it may write into its peers' windows.
    if (!h.exited) void this.ranks.terminate(local).catch(() => {});
    void this.queue(() => this.settle()).catch(() => {});
  }

  /** Global rank `g` left: the ops in flight of this process's ranks end (RANK_FAILED), rankLeft; then (`settle`) the survivors re-form. */
  private gone(g: number, error: RankflowError, settle = true): void {
    if (!this.live[g] || this.broken) return;
    this.live[g] = false;
    this.epoch++;
    this.pending = true;
    this.last = { rank: g, what: 'left' };
    const message = error.message.startsWith(`rank ${g} left the group`) ? error.message : `rank ${g} left the group: ${error.message}`;
    this.lastLeft = error;
    const info: FailureInfo = { code: 'RANK_FAILED', message, rank: g, ...(error.phase !== undefined ? { phase: error.phase } : {}) };
    this.ranks.members.forEach((m, r) => {
      if (this.offset + r === g || this.ranks.handles[r]!.exited) return;
      m.abortWords?.left(g, message);  // read natively: a wait in progress ends now
      try {
        void m.api.peerLeft(info).catch(() => {});
      } catch {
        // its proxy is released (the group is being destroyed): the left word said it all
      }
    });
    this.events.emit('rankLeft', { rank: g, cause: error, at: now() });
    if (settle) void this.queue(() => this.settle()).catch(() => {});
  }

  /** Before an op: once after every change, the survivors in step at the group's numbers, with the new live mask. */
  async settle(): Promise<void> {
    if (this.broken) throw this.broken;
    // A world re-forms until every survivor process wrote the mask it knows (each round is one survivors' exchange).
    while (this.rv ? maskOf(this.live) !== this.agreed : this.pending) {
      if (this.broken) throw this.broken;
      this.pending = false;
      // A worker ends once its native call returned (its stop word ends any wait at once); one that does not
      // within EXIT_MS is stuck outside every wait, and writes nothing more either.
      const exits = this.exits.splice(0);
      await Promise.race([Promise.all(exits), new Promise((r) => setTimeout(r, EXIT_MS).unref())]);
      const locals = this.locals();
      const at = await Promise.allSettled(locals.map((r) => this.ranks.call(r, (api) => api.position())));
      if (at.some((p) => p.status === 'rejected')) continue;  // a survivor died meanwhile: it left (pending again)
      const positions = at.map((p) => (p as PromiseFulfilledResult<{ seq: number; sessions: number }>).value);
      let seq = Math.max(0, ...positions.map((p) => p.seq)), sessions = Math.max(0, ...positions.map((p) => p.sessions)), epoch = this.epoch;
      if (this.rv) {
        const agreed = await agreeOnMembership(this.rv, { live: this.live, seq, sessions, epoch, started: this.started }, (g, e) => this.gone(g, e, false))
          .catch((e: unknown) => this.broke(RankflowError.from(e)));
        if (agreed === null) continue;  // the processes knew different masks: now each knows them all, once more
        ({ seq, sessions, epoch } = agreed);
        this.epoch = epoch;
        this.rejectThrough = Math.max(this.rejectThrough, agreed.started);
      }
      for (const r of locals) this.ranks.members[r]!.abortWords?.clearLeft();
      const m = this.told(this.live, epoch, sessions);
      const done = await Promise.allSettled(locals.map((r) => this.ranks.call(r, (api) => api.remask(seq, m))));
      this.agreed = m.mask;
      this.sessionsClosed();
      // A survivor that cannot go on has failed: it leaves too, and the loop goes round again.
      done.forEach((d, i) => {
        if (d.status === 'rejected') this.ranks.markFailed(locals[i]!, RankflowError.from(d.reason));
      });
    }
  }

  /** The survivors' exchange failed (a survivor process said nothing in time): the group cannot re-form. */
  private broke(e: RankflowError): never {
    this.broken ??= new RankflowError(e.code, `the survivor processes could not re-form: ${e.message}`, { ...(e.rank !== undefined ? { rank: e.rank } : {}), cause: e });
    throw this.broken;
  }

  /** group.replaceRank(rank): a fresh worker and context for a rank that left; resolves once it serves. */
  replace(rank: number): Promise<void> {
    const local = rank - this.offset;
    if (this.rv) return Promise.reject(invalid('rank', `${rank}: replaceRank is for the ranks of one process; in a world a process started with ` +
      'world.rejoin takes a range back (docs/api.md, "Elastic worlds")'));
    try {
      checkIntIn('rank', local, 0, this.live.length - 1);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.queue(async () => {
      await this.settle();
      if (this.live[rank]) throw invalid('rank', `${rank} serves: replaceRank takes a rank that left the group (liveRanks: [${this.liveRanks.join(', ')}])`);
      const locals = this.locals();
      if (locals.length === 0) throw new RankflowError('STATE', `replaceRank(${rank}): no rank serves, so there is no group to join`);
      if (!this.ranks.handles[local]!.exited) await this.ranks.terminate(local);
      const at = await Promise.all(locals.map((r) => this.ranks.call(r, (api) => api.position()))).catch((e: unknown) => {
        const why = RankflowError.from(e);  // a survivor left meanwhile: the next op re-forms without it
        throw new RankflowError(why.code, `replaceRank(${rank}): ${why.message}`, { rank: why.rank, cause: why });
      });
      const seq = Math.max(...at.map((p) => p.seq)), sessions = Math.max(...at.map((p) => p.sessions));
      const live = this.live.map((l, g) => l || g === rank);
      const m = this.told(live, this.epoch + 1, sessions);
      // Counted now: a survivor that rejoined and then re-forms without a failed replacement takes a later one.
      this.epoch = m.epoch;
      this.last = { rank, what: 'joined' };
      const old = this.ranks.members[local]!.init;
      const init: RankInit = {
        ...old, abort: new SharedArrayBuffer(ABORT.bytes), runAbort: new SharedArrayBuffer(4), traffic: new SharedArrayBuffer(TRAFFIC.bytes),
        firstSeq: seq, membership: m,
      };
      this.ranks.respawn(local, init);
      await this.join(local, locals, m);
      this.live[rank] = true;
      this.agreed = m.mask;
      this.events.emit('rankJoined', { rank, at: now() });
    });
  }

  /** The replacement registers (its barrier) while the survivors map it and rejoin (theirs, the same op); a side that fails ends the join. */
  private async join(local: number, locals: number[], m: Told): Promise<void> {
    const rank = this.ranks.handles[local]!.rank;
    let why: RankflowError | undefined;
    const end = (e: unknown): void => {
      why ??= RankflowError.from(e);
      for (const r of locals) this.ranks.members[r]!.abortWords?.left(rank, `rank ${rank}'s replacement did not join: ${why.message}`);
      this.ranks.members[local]!.abortWords?.stop();
    };
    const abandon = (e: unknown): never => {
      end(e);
      throw e;
    };
    // The windows to map (a survivor that died meanwhile ends the join here too). A rank that is out
    // has no window to map (its old fds are closed): it stays unmapped.
    const exported = await Promise.all(this.ranks.members.map((_, r) =>
      r === local || this.live[this.offset + r] ? this.ranks.call(r, (api) => api.exported()) : Promise.resolve(null))).catch((e: unknown) => (end(e), []));
    if (!why) {
      const peers = exported.map((e: ExportedSegments | null) => (e ? { deviceFd: e.deviceFd, hostFd: e.hostFd } : NO_SEGMENTS));
      const parts = [
        this.ranks.call(local, (api) => api.register(peers)),
        ...locals.map((r) => this.ranks.call(r, (api) => api.rejoin(rank, peers[local]!, m))),
      ].map((p) => p.catch(abandon));
      await Promise.allSettled(parts);
    }
    if (!why) return;
    // The group goes on without the replacement: it is ended, the survivors re-form (settle).
    if (!this.ranks.handles[local]!.exited) await this.ranks.terminate(local).catch(() => {});
    this.pending = true;
    this.epoch++;  // not the membership the survivors rejoined into: their handles of it are refused too
    await this.settle();
    throw new RankflowError(why.code, `replaceRank(${rank}): ${why.message}`, { rank, cause: why });
  }
}

/** The live mask of `live` (index = global rank): bit g set, rank g serves. */
function maskOf(live: boolean[]): bigint {
  return live.reduce((m, l, g) => (l ? m | (1n << BigInt(g)) : m), 0n);
}
