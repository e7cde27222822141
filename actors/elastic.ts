// An elastic group's membership, as the main thread keeps it (createGroup({ elastic: true }): backend
// 'host', the ranks of one process). A rank that fails leaves: its peers' ops in flight end at once
// with RANK_FAILED (the left word of their abort words, read by every wait and at every op's start),
// the group is 'degraded' and says so (rankLeft), and before the next op every survivor is put back
// in step (the group's sequence number, as after a run's release) and writes the new live mask into
// its workspace (ops/membership.cc), which its ops read: they leave the ranks outside it out.
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

/** group.on('rankLeft'): rank `rank` left the group at `at` (ms since the epoch), `cause` its failure. */
export interface RankLeft { rank: number; cause: RankflowError; at: number }
/** group.on('rankJoined'): a replacement of rank `rank` serves since `at`. */
export interface RankJoined { rank: number; at: number }

const now = (): number => performance.timeOrigin + performance.now();
const NO_SEGMENTS = { deviceFd: -1, hostFd: -1 };
/** How long the survivors wait for a leaving rank's worker to end before they go on without it. */
const EXIT_MS = 1000;

export class Membership {
  private readonly live: boolean[];
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
  ) {
    this.live = ranks.handles.map(() => true);
    ranks.elastic = this;
  }

  /** Whether local rank `local` serves (it has not left, or its replacement has joined). */
  serves(local: number): boolean {
    return this.live[local] === true;
  }
  get degraded(): boolean {
    return this.live.includes(false);
  }
  /** The global ids of the ranks serving, ascending. */
  get liveRanks(): number[] {
    return this.ranks.handles.filter((_, r) => this.live[r]).map((h) => h.rank);
  }
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
    return this.live.flatMap((l, r) => (l ? [r] : []));
  }
  private told(live: boolean[], epoch: number, sessions: number): Told {
    const ids = this.ranks.handles.filter((_, r) => live[r]).map((h) => h.rank);
    return { mask: ids.reduce((m, r) => m | (1n << BigInt(r)), 0n), epoch, live: ids, sessions };
  }

  /** Local rank `local` failed (Ranks.markFailed): it leaves; its peers' ops end with RANK_FAILED, and the group goes on without it. */
  leave(local: number, error: RankflowError): void {
    if (!this.live[local]) return;
    this.live[local] = false;
    this.epoch++;
    this.last = { rank: this.ranks.handles[local]!.rank, what: 'left' };
    this.exits.push(this.ranks.members[local]!.gone.catch(() => {}));
    this.pending = true;
    const h = this.ranks.handles[local]!;
    const message = error.message.startsWith(`rank ${h.rank} left the group`) ? error.message : `rank ${h.rank} left the group: ${error.message}`;
    const info: FailureInfo = { code: 'RANK_FAILED', message, rank: h.rank, ...(error.phase !== undefined ? { phase: error.phase } : {}) };
    this.ranks.members.forEach((m, r) => {
      if (r === local || this.ranks.handles[r]!.exited) return;
      m.abortWords?.left(h.rank, message);  // read natively: a wait in progress ends now
      try {
        void m.api.peerLeft(info).catch(() => {});
      } catch {
        // its proxy is released (the group is being destroyed): the left word said it all
      }
    });
    this.events.emit('rankLeft', { rank: h.rank, cause: error, at: now() });
    // A rank that failed alive (a wait that timed out) goes: nothing of it may write into its peers' windows.
    if (!h.exited) void this.ranks.terminate(local).catch(() => {});
    void this.queue(() => this.settle()).catch(() => {});
  }

  /** Before an op: once after every change, the survivors in step at the group's numbers, with the new live mask. */
  async settle(): Promise<void> {
    while (this.pending) {
      this.pending = false;
      // A worker ends once its native call returned (its stop word ends any wait at once); one that does not
      // within EXIT_MS is stuck outside every wait, and writes nothing more either.
      const exits = this.exits.splice(0);
      await Promise.race([Promise.all(exits), new Promise((r) => setTimeout(r, EXIT_MS).unref())]);
      const locals = this.locals();
      const at = await Promise.allSettled(locals.map((r) => this.ranks.call(r, (api) => api.position())));
      if (at.some((p) => p.status === 'rejected')) continue;  // a survivor died meanwhile: it left (pending again)
      const positions = at.map((p) => (p as PromiseFulfilledResult<{ seq: number; sessions: number }>).value);
      const seq = Math.max(...positions.map((p) => p.seq)), sessions = Math.max(...positions.map((p) => p.sessions));
      for (const r of locals) this.ranks.members[r]!.abortWords?.clearLeft();
      const m = this.told(this.live, this.epoch, sessions);
      const done = await Promise.allSettled(locals.map((r) => this.ranks.call(r, (api) => api.remask(seq, m))));
      this.sessionsClosed();
      // A survivor that cannot go on has failed: it leaves too, and the loop goes round again.
      done.forEach((d, i) => {
        if (d.status === 'rejected') this.ranks.markFailed(locals[i]!, RankflowError.from(d.reason));
      });
    }
  }

  /** group.replaceRank(rank): a fresh worker and context for a rank that left; resolves once it serves. */
  replace(rank: number): Promise<void> {
    const local = rank - this.ranks.handles[0]!.rank;
    try {
      checkIntIn('rank', local, 0, this.live.length - 1);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.queue(async () => {
      await this.settle();
      if (this.live[local]) throw invalid('rank', `${rank} serves: replaceRank takes a rank that left the group (liveRanks: [${this.liveRanks.join(', ')}])`);
      const locals = this.locals();
      if (locals.length === 0) throw new RankflowError('STATE', `replaceRank(${rank}): no rank serves, so there is no group to join`);
      if (!this.ranks.handles[local]!.exited) await this.ranks.terminate(local);
      const at = await Promise.all(locals.map((r) => this.ranks.call(r, (api) => api.position()))).catch((e: unknown) => {
        const why = RankflowError.from(e);  // a survivor left meanwhile: the next op re-forms without it
        throw new RankflowError(why.code, `replaceRank(${rank}): ${why.message}`, { rank: why.rank, cause: why });
      });
      const seq = Math.max(...at.map((p) => p.seq)), sessions = Math.max(...at.map((p) => p.sessions));
      const live = this.live.map((l, r) => l || r === local);
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
      this.live[local] = true;
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
      r === local || this.live[r] ? this.ranks.call(r, (api) => api.exported()) : Promise.resolve(null))).catch((e: unknown) => (end(e), []));
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
