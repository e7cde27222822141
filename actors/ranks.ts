// The workers of this process's ranks, as the group's main thread holds them: starting each (its abort
// words, traffic counters, dispatch handles), calling them (a call ends with RANK_FAILED when its
// worker dies), mirroring the transitions they report into the public RankHandles, spreading a failure
// (the peers of a failed rank stop waiting at once) and tearing them down.
import type { Worker } from 'node:worker_threads';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import type { EventEmitter } from 'eventemitter3';
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs';

import { PACKAGE_ROOT } from './core/config.js';
import { RankflowError } from './core/errors.js';
import { TRAFFIC } from './core/addon.js';
import { AbortWords } from './core/abort-words.js';
import { HandleRegistry } from './core/handles.js';
import { releaseRemote, wrapRemote, type Remote } from './core/remote.js';
import { startWorker } from './core/worker-argv.js';
import type { FailureInfo } from '../machines/index.js';
import { TransitionDecoder } from '../workers/transition-log.js';
import type { RankWorkerApi } from '../workers/rank.js';
import { isWorkerMessage, type RankInit, type TransitionEvent, type WorkerMessage } from '../workers/protocol.js';
import type { GroupEvents } from './group.js';

// Always the built worker: tests run the TypeScript sources, but a worker thread needs JavaScript.
const WORKER_URL = pathToFileURL(path.join(PACKAGE_ROOT, 'dist', 'workers', 'rank.js'));
const DESTROY_GRACE_MS = 5000;

/** A rank as the main thread sees it: plain data kept current by the rank's transitions. */
export class RankHandle {
  state = 'init';
  seq = 0;
  error?: RankflowError;
  /** @internal */ exited = false;
  /** @internal terminate() was called: the rank is failed whatever its worker still reports */
  terminated = false;

  constructor(readonly rank: number, private readonly group: { terminateRank(rank: number): Promise<void> }) {}

  /** Ends the rank's worker abruptly, as a crash would (API.md, Faults). */
  terminate(): Promise<void> {
    return this.group.terminateRank(this.rank);
  }
}

export interface Member {
  worker: Worker;
  /** what the worker was started with (an elastic group's replacement starts from it) */
  init: RankInit;
  api: Remote<RankWorkerApi>;
  /** the rank's abort words (a SharedArrayBuffer its native waits and kernels read) */
  abort: SharedArrayBuffer;
  /** the words, once the worker said where they start in `abort` */
  abortWords?: AbortWords;
  /** the dispatch handles this rank returned to the caller: driver mode refuses any other */
  handles: HandleRegistry;
  /** rejects with RANK_FAILED when the worker exits */
  gone: Promise<never>;
  /** calls to end early with RANK_FAILED when the worker exits: every call to it */
  untilGone: Cuts;
  /** calls to end early with the rank's failure: collectives, whose rank programs may never notice it */
  untilFailed: Cuts;
  /** the rank's traffic counters (TRAFFIC words, written by its native side) */
  traffic: BigUint64Array;
  /** calls in flight: the worker keeps the process alive only while there are some */
  busy: number;
  /** the id of the run aborted last (workers/run-abort.ts) */
  runAbort: Int32Array;
}

/** The rejecters of calls in flight, to settle them early from outside. */
type Cuts = Set<(error: RankflowError) => void> & { error?: RankflowError };

/**
 * `p`, unless one of `cuts` is cut first. Not Promise.race against a promise that may never settle:
 * every race leaves a reaction on it that keeps the race's result alive, i.e. every collective's
 * output would stay in memory for the life of the group.
 */
export function cutShort<T>(p: Promise<T>, cuts: Cuts[]): Promise<T> {
  const cut = cuts.find((c) => c.error);
  if (cut) return Promise.reject(cut.error);
  return new Promise<T>((resolve, reject) => {
    for (const c of cuts) c.add(reject);
    const done = (): void => { for (const c of cuts) c.delete(reject); };
    p.then((v) => { done(); resolve(v); }, (e: unknown) => { done(); reject(e); });
  });
}

/** Of the errors of the ranks of one call, the root cause: the first that is not a consequence (RANK_FAILED of a peer). */
export const rootCause = (errors: RankflowError[]): RankflowError => errors.find((e) => e.code !== 'RANK_FAILED') ?? errors[0]!;

function cutAll(cuts: Cuts, error: RankflowError): void {
  cuts.error ??= error;
  for (const reject of [...cuts]) reject(error);
  cuts.clear();
}

export class Ranks {
  readonly members: Member[] = [];
  /** the group is being destroyed: exits and failures are expected, and not spread */
  stopping = false;
  private readonly decoders = new Map<number, TransitionDecoder>();
  private readonly onDecoded = (t: TransitionEvent) => this.onTransition(t);
  /** an elastic group's membership (actors/elastic.ts): who serves, and where a failure's origin goes instead of failing its peers */
  elastic?: { serves(local: number): boolean; leave(local: number, error: RankflowError): void };

  constructor(
    /** the public handles, index = local rank */
    readonly handles: RankHandle[],
    private readonly rankOffset: number,
    private readonly events: EventEmitter<GroupEvents>,
    /** a local rank failed first: tell the other processes of the world */
    private readonly announce: (f: { rank: number; message: string; phase?: string }) => void,
  ) {}

  /** Starts local rank `local`'s worker. */
  spawn(local: number, init: RankInit): void {
    const worker = startWorker(WORKER_URL, { workerData: init });
    const handle = this.handles[local]!;
    const rank = handle.rank;
    // A replaced rank's old worker says nothing more about the handle (elastic groups).
    const current = (): boolean => this.members[local]?.worker === worker;
    worker.on('message', (m: unknown) => {
      if (isWorkerMessage(m) && current()) this.onWorkerMessage(m, local);
    });
    const untilGone: Cuts = new Set();
    const untilFailed: Cuts = new Set();
    const gone = new Promise<never>((_, reject) => {
      const onGone = (why: string, cause?: { code?: unknown }): void => {
        if (handle.exited || !current()) return;
        handle.exited = true;
        // A rank that could not even build its context (memory that cannot be had, no driver) says why.
        const code = handle.state === 'init' && (cause?.code === 'EINVAL' || cause?.code === 'BACKEND_UNAVAILABLE') ? cause.code : 'RANK_FAILED';
        const message = code === 'RANK_FAILED' ? `rank ${rank} ${why}` : `${(cause as { message?: string }).message} (rank ${rank})`;
        const error = new RankflowError(code, message, { rank, state: handle.state });
        if (!this.stopping && handle.state !== 'destroyed') this.markFailed(local, error);
        cutAll(untilGone, error);
        reject(error);
      };
      worker.on('error', (e) => onGone(`crashed: ${e.message}`, e as { code?: unknown }));
      worker.on('exit', (code) => onGone(`exited (worker exit code ${code})`));
    });
    gone.catch(() => {});
    this.members[local] = {
      worker, init, api: wrapRemote<RankWorkerApi>(nodeEndpoint(worker)), abort: init.abort, handles: new HandleRegistry(), gone, untilGone, untilFailed,
      traffic: new BigUint64Array(init.traffic ?? new SharedArrayBuffer(TRAFFIC.bytes)), busy: 0, runAbort: new Int32Array(init.runAbort),
    };
  }

  private onWorkerMessage(m: WorkerMessage, local: number): void {
    if (m.kind === 'started') {
      const member = this.members[local];
      if (member) member.abortWords = new AbortWords(member.abort, m.abortOffset);
    } else if (m.kind === 'transitions') {
      let d = this.decoders.get(m.rank);
      if (!d) this.decoders.set(m.rank, (d = new TransitionDecoder()));
      d.decode(m, this.onDecoded);
    } else if (m.kind === 'transition') this.onTransition(m.transition);
    else if (m.kind === 'inspect') this.events.emit('inspect', m.record);
    else if (m.kind === 'batch') for (const inner of m.messages) this.onWorkerMessage(inner, local);
  }

  private onTransition(t: TransitionEvent): void {
    const handle = this.handles[t.rank - this.rankOffset]!;
    if (handle.terminated) return;
    handle.state = t.to;
    if (t.seq !== undefined) handle.seq = t.seq;
    this.events.emit('transition', t);
    // Only a failure fails the rank: a release (to 'released') leaves it alive, and the run recovers it.
    if (t.to === 'failed' && t.error) {
      const error = new RankflowError(t.error.code as never, t.error.message, { rank: t.error.rank ?? t.rank, state: t.from, phase: t.error.phase });
      this.markFailed(t.rank - this.rankOffset, error, t.error.code !== 'RANK_FAILED');
    } else if (t.to === 'masking' && t.error?.rank !== undefined && this.elastic) {
      // A peer it waited for did not answer in time (workers/runner.ts blameTimeout): that peer fails
      // and leaves, if it still serves (a peer that left already is the usual case here). A rank of
      // another process of a world is not this process's to fail: its own process, or its loss, says so.
      const local = t.error.rank - this.rankOffset;
      const mine = local >= 0 && local < this.handles.length && local !== t.rank - this.rankOffset;
      if (mine && this.elastic.serves(local) && !this.handles[local]!.error)
        this.markFailed(local, new RankflowError('RANK_FAILED', t.error.message, { rank: t.error.rank, state: this.handles[local]!.state, phase: t.error.phase }));
    }
  }

  /** Records a local rank's failure once, tells the group, and fails its peers fast when it is the origin. */
  markFailed(local: number, error: RankflowError, origin = true): void {
    const handle = this.handles[local]!;
    if (handle.exited && handle.state !== 'destroyed') handle.state = 'failed';
    if (handle.error) return;
    handle.error = error;
    const rank = handle.rank;
    const m = this.members[local];
    if (m) cutAll(m.untilFailed, error);
    this.events.emit('failed', { rank, error });
    if (this.elastic && !this.stopping) return this.elastic.leave(local, error);  // any failure: it leaves, its peers mask it and go on
    if (!origin || this.stopping) return;
    const info: FailureInfo = { code: 'RANK_FAILED', message: `rank ${rank} failed: ${error.message}`, rank, phase: error.phase };
    this.tellPeers(rank, info, local);
    this.announce({ rank, message: info.message, ...(error.phase !== undefined ? { phase: error.phase } : {}) });
  }

  /**
   * A rank of another process failed (`lost`: its whole process left the world): every live local rank
   * is told, as the origin's local peers are (markFailed).
   */
  failedElsewhere(rank: number, error: RankflowError, lost: boolean): void {
    if (this.stopping) return;  // the ranks are going: their proxies may be released already
    this.events.emit('failed', { rank, error });
    const info: FailureInfo = { code: 'RANK_FAILED', message: error.message, rank, ...(error.phase !== undefined ? { phase: error.phase } : {}) };
    this.tellPeers(rank, info, -1, lost);
  }

  /** Tells every local rank still running (but `except`; with `evenDestroyed`, destroyed ones too) that `failed` failed. */
  private tellPeers(failed: number, info: FailureInfo, except: number, evenDestroyed = false): void {
    this.members.forEach((m, r) => {
      const peer = this.handles[r]!;
      if (r !== except && !peer.exited && (evenDestroyed || peer.state !== 'destroyed')) this.tellPeerFailed(m, failed, info);
    });
  }

  /**
   * Rank `failed` is gone: its peers' waits end at once through their abort words (read natively, and
   * by their kernels, also while the worker's thread is blocked in an op), and their machines record it.
   */
  private tellPeerFailed(m: Member, failed: number, info: FailureInfo): void {
    m.abortWords?.fail(failed, info.message);
    try {
      void m.api.peerFailed(info).catch(() => {});
    } catch {
      // the rank's proxy is released (the group is being destroyed): its abort words said it all
    }
  }

  /** The rank is being torn down: whatever it waits for, it stops waiting. */
  private stopRank(m: Member): void {
    m.abortWords?.stop();
  }

  /**
   * A rank program ended (rank `origin`, global id; `message` says how): every local rank's ops
   * numbered `above` and later end with ABORTED, whatever they wait in (1n: every op). A release only
   * grows (AbortWords.release).
   */
  release(origin: number, above: bigint, message: string): void {
    for (const m of this.members) m.abortWords?.release(origin, above, message);
  }

  /** Whether a release is raised on any local rank. */
  get released(): boolean {
    return this.members.some((m) => (m.abortWords?.releasedAbove ?? 0n) !== 0n);
  }

  /** The run is over and its ranks are back in step: their ops run again. */
  clearReleases(): void {
    for (const m of this.members) m.abortWords?.clearRelease();
  }

  /**
   * Calls local rank r's worker; fails with RANK_FAILED if the worker dies first. While no call is in
   * flight the worker is unref'd: a process that forgets destroy() still exits when it has nothing else
   * to do (the workers then end with it); while one is, awaiting it keeps the process alive.
   */
  call<T>(r: number, fn: (api: Remote<RankWorkerApi>) => Promise<T>): Promise<T> {
    const m = this.members[r]!;
    if (this.handles[r]!.exited) return m.gone;
    if (m.busy++ === 0) m.worker.ref();
    const idle = (): void => {
      if (--m.busy === 0 && !this.stopping) m.worker.unref();
    };
    const p = cutShort(fn(m.api), [m.untilGone]);
    p.then(idle, idle);
    return p;
  }

  /**
   * Runs fn on every rank; rejects with the root cause (a failure that is not a consequence). A rank's
   * part ends when the rank fails even if its call is still running (a rank program that never enters
   * the collective its peers wait in).
   */
  async all<T>(fn: (api: Remote<RankWorkerApi>, r: number) => Promise<T>): Promise<T[]> {
    // An elastic group's rank that left takes no part: its entry is null.
    const settled = await Promise.allSettled(this.members.map((m, r) =>
      this.serves(r) ? this.call(r, () => cutShort(fn(m.api, r), [m.untilFailed])) : Promise.resolve(null as T)));
    const errors = settled.flatMap((s) => (s.status === 'rejected' ? [RankflowError.from(s.reason)] : []));
    if (errors.length > 0) throw rootCause(errors);
    return settled.map((s) => (s as PromiseFulfilledResult<T>).value);
  }

  /** Ends local rank `local` abruptly (RankHandle.terminate): its peers are told first. */
  async terminate(local: number): Promise<void> {
    const m = this.members[local]!;
    // The peers are told first, as a lost process is reported: the killed rank's teardown must not
    // wait on peers that still wait for it (on cuda: a barrier kernel, NCCL's teardown).
    const h = this.handles[local]!;
    if (!h.exited && !this.stopping && h.state !== 'destroyed') {
      this.markFailed(local, new RankflowError('RANK_FAILED', `rank ${h.rank} was terminated`, { rank: h.rank, state: h.state }));
      // Dead from now on: what its worker still had in flight is no longer its state.
      h.terminated = true;
      h.state = 'failed';
    }
    this.stopRank(m);
    // The process waits for the end it awaits: a worker's ref alone does not hold it (a call cut short
    // by the failure above unrefs the worker when it settles).
    await holdProcess((async () => {
      await m.worker.terminate();
      await m.gone.catch(() => {});
    })());
  }

  /** Whether local rank r takes part in the group's ops (all do, but those that left an elastic group). */
  serves(r: number): boolean {
    return this.elastic?.serves(r) ?? true;
  }

  /** Elastic: local rank `local`'s worker (gone) is replaced by a fresh one started with `init`; the same public handle. */
  respawn(local: number, init: RankInit): void {
    const h = this.handles[local]!;
    Object.assign(h, { state: 'init', seq: init.firstSeq ?? 0, exited: false, terminated: false, error: undefined });
    this.decoders.delete(h.rank);
    releaseRemote(this.members[local]!.api);
    this.spawn(local, init);
  }

  /** Every rank ends 'destroyed': asked to destroy its context, then its worker is terminated. */
  async destroy(): Promise<void> {
    this.stopping = true;
    // A rank with a call in flight (a run, a collective) stops waiting now, so that its program ends
    // and its thread takes the destroy; an idle rank tears down through its machine.
    for (const m of this.members) if (m.busy > 0) this.stopRank(m);
    await holdProcess(Promise.all(this.members.map(async (m, r) => {
      if (!this.handles[r]!.exited) {
        const timer = new Promise<void>((resolve) => setTimeout(resolve, DESTROY_GRACE_MS).unref());
        await Promise.race([this.call(r, (api) => api.destroy()).catch(() => {}), timer]);
      }
      // A worker blocked in a wait (a peer that never came) only takes terminate() once it stops waiting.
      this.stopRank(m);
      releaseRemote(m.api);
      m.worker.ref();
      await m.worker.terminate();
      const h = this.handles[r]!;
      if (h.state !== 'destroyed') {
        const from = h.state;
        h.state = 'destroyed';
        this.events.emit('transition', { rank: h.rank, from, to: 'destroyed', event: 'TERMINATED', at: performance.timeOrigin + performance.now() });
      }
    })));
  }
}

/** `p`, keeping the process alive until it settles (a pending promise alone does not). */
function holdProcess<T>(p: Promise<T>): Promise<T> {
  const timer = setInterval(() => {}, 1 << 30);
  return p.finally(() => clearInterval(timer));
}
