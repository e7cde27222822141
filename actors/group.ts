// The main thread's view of a group of ranks: one worker per rank, a mirror of each rank's state
// (plain data, updated by the transitions the workers report), the collective operations in driver
// mode, rank programs, and teardown. Collectives are queued: calls on one group never interleave.
import type { Worker } from 'node:worker_threads';
import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'eventemitter3';
import * as Comlink from 'comlink/dist/esm/comlink.mjs';
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs';

import path from 'node:path';
import { pathToFileURL } from 'node:url';

import { config, PACKAGE_ROOT } from './core/config.js';
import { RankflowError, invalid } from './core/errors.js';
import { installErrorTransfer } from './core/comlink-errors.js';
import { ABORT, TRAFFIC, loadAddon, type ExportedSegments } from './core/addon.js';
import { cudaDeviceCount, probeCuda, resolveBackend, type Backend } from './core/backend.js';
import { checkArray, checkTensor, ELEMENT_BYTES, numel, type Tensor } from './core/tensor.js';
import {
  checkBufferConfig, checkCombineInput, checkDispatchInput, checkIntIn, checkOptions, checkPerRank, checkPositiveInt, checkSameShape, checkTestFirstSeq, describe,
  type BufferConfig, type CombineInput, type DispatchHandle, type DispatchInput,
} from './core/validate.js';
import { engramSizeHint, sessionBytes, sizeHint } from './core/hints.js';
import { checkWorld, exchangeSegments, meetWorld, worldWaitMs, type WorldOptions } from './world/join.js';
import { connectScaleOut } from './world/scaleout.js';
import type { Rendezvous } from './world/rendezvous.js';
import { rankMachine, type FailureInfo } from '../machines/index.js';
import { describeMachine } from './observe/machine-graph.js';
import { attachInspector, inspectorAddress, type InspectorHandle } from './observe/inspector.js';
import type { GroupObserver } from './observe/timeline.js';
import { TransitionDecoder } from '../workers/transition-log.js';
import { HandleRegistry } from './core/handles.js';
import { abortError, checkSignal } from './core/abort.js';
import { startWorker } from './core/worker-argv.js';
import type { CombineResult, DispatchResult } from './core/types.js';
import type { RankWorkerApi } from '../workers/rank.js';
import { isWorkerMessage, type RankInit, type TransitionEvent, type WorkerMessage } from '../workers/protocol.js';

export type { TransitionEvent };

export interface GroupOptions {
  ranks?: number;
  backend?: 'auto' | Backend;
  devices?: number[];
  /** Ranks per node: the physical NVLink domain (default: all ranks). */
  ranksPerNode?: number;
  buffer: BufferConfig;
  timeouts?: { cpuSeconds?: number; gpuSeconds?: number };
  /**
   * A function: every xstate inspection event of every rank, as plain data tagged with its rank.
   * A loopback URL ('http://127.0.0.1:PORT'): serve the live inspector page there for this group.
   */
  inspect?: ((record: Record<string, unknown>) => void) | string;
  /** This process hosts `ranks` of a world spread over several processes (API.md). */
  world?: WorldOptions;
  /** Watchers attached before the ranks start (a TimelineRecorder, an inspector server), so they see every transition. */
  observers?: GroupObserver[];
  /**
   * Aborts the creation, the wait for the other processes of a world included: every rank that was
   * started is torn down (workers, memory, fds, the rendezvous' sockets), then createGroup rejects with
   * RankflowError code 'ABORTED' (its cause: the signal's reason). No effect once the group is ready.
   */
  signal?: AbortSignal;
}

export interface RankSnapshot {
  rank: number;
  state: string;
  seq: number;
  error?: FailureInfo;
}

export interface TrafficReport {
  rank: number;
  scaleUpBytes: number;
  scaleOutBytes: number;
  scaleOutSeconds: number;
}

export interface GroupEvents {
  transition: (t: TransitionEvent) => void;
  failed: (f: { rank: number; error: RankflowError }) => void;
  inspect: (record: Record<string, unknown>) => void;
}

installErrorTransfer();

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

  constructor(readonly rank: number, private readonly group: Group) {}

  /** Ends the rank's worker abruptly, as a crash would (API.md, Faults). */
  terminate(): Promise<void> {
    return this.group.terminateRank(this.rank);
  }
}

interface Member {
  worker: Worker;
  api: Comlink.Remote<RankWorkerApi>;
  /** the rank's abort words (a SharedArrayBuffer its native waits and kernels read) */
  abort: SharedArrayBuffer;
  abortWords?: Int32Array;
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
function cutShort<T>(p: Promise<T>, cuts: Cuts[]): Promise<T> {
  const cut = cuts.find((c) => c.error);
  if (cut) return Promise.reject(cut.error);
  return new Promise<T>((resolve, reject) => {
    for (const c of cuts) c.add(reject);
    const done = (): void => { for (const c of cuts) c.delete(reject); };
    p.then((v) => { done(); resolve(v); }, (e: unknown) => { done(); reject(e); });
  });
}

function cutAll(cuts: Cuts, error: RankflowError): void {
  cuts.error ??= error;
  for (const reject of [...cuts]) reject(error);
  cuts.clear();
}

export class Group extends EventEmitter<GroupEvents> {
  readonly id = randomUUID();
  readonly ranks: RankHandle[];
  private readonly members: Member[] = [];
  private queue: Promise<unknown> = Promise.resolve();
  private destroying = false;
  private sessionOpen = false;
  private bufferBytes = 0;
  private workspaceBytes = 0;
  private symmetricBytes = 0;
  /** @internal */ detachers: Array<() => void> = [];
  /** @internal */ inspector?: InspectorHandle;
  /** The inspector page's URL ('http://127.0.0.1:PORT/', the port picked when 0 was asked) when created with `inspect: url`; else undefined. */
  get inspectorUrl(): string | undefined { return this.inspector?.url; }

  /** ranks in the whole world (equals `size` unless the group spans processes) */
  readonly worldSize: number;
  /** global id of this process's first rank */
  readonly rankOffset: number;
  private rv?: Rendezvous;
  /** @internal aborted with createGroup's signal: ends the wait for the world */
  readonly creation = new AbortController();

  private constructor(
    /** ranks hosted by this process: driver-mode collectives take one input per local rank */
    readonly size: number,
    readonly backend: Backend,
    readonly buffer: BufferConfig,
    private readonly opts: GroupOptions,
    private readonly world?: WorldOptions,
  ) {
    super();
    this.worldSize = world?.size ?? size;
    this.rankOffset = world?.rankOffset ?? 0;
    this.ranks = Array.from({ length: size }, (_, r) => new RankHandle(this.rankOffset + r, this));
  }

  /** @internal use createGroup() */
  static async create(opts: GroupOptions): Promise<Group> {
    checkOptions('options', opts, '{ buffer, ranks?, backend?, ... }', false);
    const backend = checkBackendOption(opts.backend);
    const resolved = resolveBackend(backend);
    const gpus = resolved === 'cuda' ? cudaDeviceCount() : 0;
    const size = opts.ranks ?? (resolved === 'cuda' ? (Array.isArray(opts.devices) ? opts.devices.length : gpus) : config.hostRanks);
    checkPositiveInt('ranks', size, 64);
    const world = opts.world !== undefined ? checkWorld(opts.world, size) : undefined;
    const worldSize = world?.size ?? size;
    const devices = checkDevices(opts.devices, size, resolved, gpus);
    if (resolved === 'cuda' && devices === undefined && size > gpus)
      throw invalid('ranks', `(${size}) exceeds the GPU count (${gpus}): backend 'cuda' runs one rank per GPU unless told otherwise; ` +
        `to share GPUs on purpose, name each rank's GPU, e.g. devices: [${Array.from({ length: size }, (_, r) => r % Math.max(1, gpus)).join(', ')}]`);
    if (world !== undefined && Array.isArray(opts.devices) && new Set(opts.devices).size < opts.devices.length)
      throw invalid('devices', 'names a GPU twice in a world: ranks may share a GPU only in a group of one process (no world), ' +
        'since a world\'s cuda ranks need NCCL, which refuses two ranks on one GPU');
    const buffer = checkBufferConfig(opts.buffer, worldSize);
    const ranksPerNode = opts.ranksPerNode ?? worldSize;
    checkPositiveInt('ranksPerNode', ranksPerNode, worldSize);
    if (worldSize % ranksPerNode !== 0) throw invalid('ranksPerNode', `(${ranksPerNode}) must divide the world size (${worldSize})`);
    checkOptions('timeouts', opts.timeouts, '{ cpuSeconds?, gpuSeconds? }');
    const cpuSeconds = checkTimeout('timeouts.cpuSeconds', opts.timeouts?.cpuSeconds ?? config.cpuSeconds);
    const gpuSeconds = checkTimeout('timeouts.gpuSeconds', opts.timeouts?.gpuSeconds ?? config.gpuSeconds);
    if (opts.inspect !== undefined && typeof opts.inspect !== 'function' && typeof opts.inspect !== 'string')
      throw invalid('inspect', "must be a function (record) => void or a loopback URL 'http://127.0.0.1:PORT'");
    let inspectAt: { host: string; port: number } | undefined;
    try {
      inspectAt = typeof opts.inspect === 'string' ? inspectorAddress(opts.inspect) : undefined;
    } catch (e) {
      throw new RankflowError('EINVAL', (e as Error).message);  // "inspect: host ... is not loopback"
    }
    if (opts.observers !== undefined && (!Array.isArray(opts.observers) || opts.observers.some((o) => typeof o?.attach !== 'function')))
      throw invalid('observers', 'must be an array of objects with attach(group)');
    const firstSeq = checkTestFirstSeq(config.testFirstSeq);
    const signal = checkSignal('signal', opts.signal);
    if (signal?.aborted) throw abortError('createGroup', signal);
    const layout = loadAddon().layout(buffer, worldSize);
    if (buffer.bytes !== undefined && buffer.bytes < layout.workspace.bytes + layout.alignment)
      throw invalid('buffer.bytes', `(${buffer.bytes}) leaves no room after the ${layout.workspace.bytes}-byte workspace`);

    const group = new Group(size, resolved, buffer, opts, world);
    if (typeof opts.inspect === 'function') group.on('inspect', opts.inspect);
    for (const o of opts.observers ?? []) group.detachers.push(o.attach(group));
    // An abort tears the ranks down at once (their waits end); start() then fails, and the error is ABORTED.
    const onAbort = (): void => {
      group.creation.abort(signal!.reason);
      void group.destroy().catch(() => {});
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      if (inspectAt) {
        group.inspector = await attachInspector(group, { ...inspectAt, machine: describeMachine(rankMachine), unref: true });
        process.stderr.write(`rankflow: inspector at ${group.inspector.url}\n`);
      }
      if (signal?.aborted) throw abortError('createGroup', signal);
      await group.start({ ranksPerNode, cpuSeconds, gpuSeconds, devices, firstSeq });
      if (signal?.aborted) throw abortError('createGroup', signal);
    } catch (e) {
      await group.destroy().catch(() => {});
      throw signal?.aborted ? abortError('createGroup', signal) : RankflowError.from(e);
    } finally {
      signal?.removeEventListener('abort', onAbort);
    }
    return group;
  }

  private async start(t: { ranksPerNode: number; cpuSeconds: number; gpuSeconds: number; devices?: number[]; firstSeq: number }): Promise<void> {
    // A world meets first: its nodes (by world.nodeId) decide the ranks' domains. Processes must not
    // share a GPU (their kernels time-slice: one waiting for a peer would crawl): each says which GPUs
    // its ranks use, and the world refuses a GPU named by two processes of a node.
    const waitMs = this.world ? worldWaitMs(this.opts.timeouts?.cpuSeconds) : 0;
    const met = this.world ? await meetWorld(this.world, {
      config: JSON.stringify({ ...this.buffer, ranksPerNode: this.opts.ranksPerNode, backend: this.backend }),
      withHost: (this.buffer.cpuBytes ?? 0) > 0, timeoutMs: waitMs, localRanks: this.size, backend: this.backend,
      gpus: this.backend === 'cuda' ? localGpuIds(this.size, this.rankOffset, t.devices) : [],
      ...(this.opts.ranksPerNode !== undefined ? { ranksPerNode: this.opts.ranksPerNode } : {}),
      ...(this.creation.signal ? { signal: this.creation.signal } : {}),
    }) : undefined;
    if (met && this.destroying) {  // torn down (aborted) while the world formed: its connections go too
      await met.rv.close();
      throw new RankflowError('STATE', 'the group was destroyed while its world formed');
    }
    if (met) this.watchWorld(met.rv);
    const ranksPerNode = met?.nodes.ranksPerNode ?? t.ranksPerNode;
    const scaleOut = (met?.nodes.count ?? 1) > 1;
    // Ranks of this process that share a GPU split its SMs between them, and make no NCCL
    // communicator: NCCL refuses two ranks on one GPU.
    const share = (d: number) => t.devices!.filter((e) => e === d).length;
    const sharing = t.devices !== undefined && new Set(t.devices).size < t.devices.length;
    for (let r = 0; r < this.size; r++) {
      const abort = new SharedArrayBuffer(ABORT.bytes);
      const runAbort = new SharedArrayBuffer(4);
      const init: RankInit = {
        rank: this.rankOffset + r, worldSize: this.worldSize, ranksPerNode, groupId: this.id, buffer: this.buffer,
        cpuSeconds: t.cpuSeconds, gpuSeconds: t.gpuSeconds, inspect: typeof this.opts.inspect === 'function',
        backend: this.backend, abort, runAbort, traffic: new SharedArrayBuffer(TRAFFIC.bytes), ...(t.firstSeq ? { firstSeq: t.firstSeq } : {}),
        tuning: { ceMinBytes: config.ceMinBytes, cooperative: config.cooperative, ...(config.ncclHome ? { ncclHome: config.ncclHome } : {}) },
        ...(t.devices ? { device: t.devices[r]!, deviceShare: share(t.devices[r]!), nccl: !sharing } : {}),
        ...(scaleOut ? { scaleOut } : {}),
      };
      this.ranks[r]!.seq = t.firstSeq;
      this.members.push(this.spawn(r, init));
    }
    const exported = await Promise.all(this.members.map((m, r) => this.call(r, () => m.api.exported())));
    const info = await this.call(0, () => this.members[0]!.api.info());
    this.bufferBytes = info.bufferBytes;
    this.workspaceBytes = info.workspaceBytes;
    this.symmetricBytes = info.symmetricBytes;
    if (!this.world || !met) {
      const peers = exported.map((e: ExportedSegments) => ({ deviceFd: e.deviceFd, hostFd: e.hostFd }));
      if (this.backend === 'cuda') {
        // One NCCL communicator per rank: rank 0 makes the unique id, every rank joins with it together.
        const id = await this.call(0, () => this.members[0]!.api.ncclUniqueId());
        if (id) await this.all((api) => api.ncclInit(id));
      }
      await this.all((api) => api.register(peers));
      return;
    }
    const joined = await exchangeSegments(met, this.world, exported, waitMs, this.creation.signal);
    if (this.destroying) {  // torn down (aborted) while the world formed
      loadAddon().closeFds(joined.received);
      throw new RankflowError('STATE', 'the group was destroyed while its world formed');
    }
    try {
      if (this.backend === 'cuda') {
        // NCCL's unique id travels from global rank 0's process through the rendezvous.
        const mine = this.rankOffset === 0 ? await this.call(0, () => this.members[0]!.api.ncclUniqueId()) : null;
        const ids = await joined.rv.exchange(mine ? Array.from(mine) : null);
        const root = ids[0] as number[] | null;
        if (root) await this.all((api) => api.ncclInit(Uint8Array.from(root)));
      }
      if (scaleOut) {
        await connectScaleOut({
          rv: joined.rv, localRanks: this.size, ...(this.world.token !== undefined ? { token: this.world.token } : {}),
          listen: (r, host) => this.call(r, () => this.members[r]!.api.scaleoutListen(host)),
          connect: (r, ends, key) => this.call(r, () => cutShort(this.members[r]!.api.scaleoutConnect(ends, key, waitMs), [this.members[r]!.untilFailed])),
        });
      }
      await this.all((api) => api.register(joined.peers));
    } finally {
      loadAddon().closeFds(joined.received);  // mapped by every local rank now (or never will be)
    }
  }

  /** The world's connections report lost processes and the failures of other processes' ranks. */
  private watchWorld(rv: Rendezvous): void {
    this.rv = rv;
    rv.onPeerLost((lost) => {
      if (this.destroying) return;  // the ranks are going: their proxies may be released already
      for (let g = lost.rankOffset; g < lost.rankOffset + lost.localRanks; g++) {
        const error = new RankflowError('RANK_FAILED', `rank ${g} is gone: its process left the world (${lost.reason})`, { rank: g });
        this.emit('failed', { rank: g, error });
        const info: FailureInfo = { code: 'RANK_FAILED', message: error.message, rank: g };
        this.members.forEach((m, r) => { if (!this.ranks[r]!.exited) this.tellPeerFailed(m, g, info); });
      }
    });
    // A rank of another process failed while its process lives on (a timeout, a terminated worker):
    // fail the local ranks as the origin's local peers are failed (markFailed).
    rv.onRankFailed((f) => {
      if (this.destroying) return;
      const error = new RankflowError('RANK_FAILED', f.message, { rank: f.rank, phase: f.phase });
      this.emit('failed', { rank: f.rank, error });
      const info: FailureInfo = { code: 'RANK_FAILED', message: f.message, rank: f.rank, phase: f.phase };
      this.members.forEach((m, r) => {
        const peer = this.ranks[r]!;
        if (!peer.exited && peer.state !== 'destroyed') this.tellPeerFailed(m, f.rank, info);
      });
    });
  }

  private spawn(local: number, init: RankInit): Member {
    const worker = startWorker(WORKER_URL, { workerData: init });
    const handle = this.ranks[local]!;
    const rank = handle.rank;
    worker.on('message', (m: unknown) => {
      if (isWorkerMessage(m)) this.onWorkerMessage(m, local);
    });
    const untilGone: Cuts = new Set();
    const untilFailed: Cuts = new Set();
    const gone = new Promise<never>((_, reject) => {
      const onGone = (why: string, cause?: { code?: unknown }): void => {
        if (handle.exited) return;
        handle.exited = true;
        // A rank that could not even build its context (memory that cannot be had, no driver) says why.
        const code = handle.state === 'init' && (cause?.code === 'EINVAL' || cause?.code === 'BACKEND_UNAVAILABLE') ? cause.code : 'RANK_FAILED';
        const message = code === 'RANK_FAILED' ? `rank ${rank} ${why}` : `${(cause as { message?: string }).message} (rank ${rank})`;
        const error = new RankflowError(code, message, { rank, state: handle.state });
        if (!this.destroying && handle.state !== 'destroyed') this.markFailed(local, error);
        cutAll(untilGone, error);
        reject(error);
      };
      worker.on('error', (e) => onGone(`crashed: ${e.message}`, e as { code?: unknown }));
      worker.on('exit', (code) => onGone(`exited (worker exit code ${code})`));
    });
    gone.catch(() => {});
    return {
      worker, api: Comlink.wrap<RankWorkerApi>(nodeEndpoint(worker)), abort: init.abort, handles: new HandleRegistry(), gone, untilGone, untilFailed,
      traffic: new BigUint64Array(init.traffic ?? new SharedArrayBuffer(TRAFFIC.bytes)), busy: 0, runAbort: new Int32Array(init.runAbort),
    };
  }

  private readonly decoders = new Map<number, TransitionDecoder>();
  private readonly onDecoded = (t: TransitionEvent) => this.onTransition(t);

  private onWorkerMessage(m: WorkerMessage, local: number): void {
    if (m.kind === 'started') {
      const member = this.members[local];
      if (member) member.abortWords = new Int32Array(member.abort, m.abortOffset, ABORT.words + ABORT.maxReason / 4);
    } else if (m.kind === 'transitions') {
      let d = this.decoders.get(m.rank);
      if (!d) this.decoders.set(m.rank, (d = new TransitionDecoder()));
      d.decode(m, this.onDecoded);
    } else if (m.kind === 'transition') this.onTransition(m.transition);
    else if (m.kind === 'inspect') this.emit('inspect', m.record);
    else if (m.kind === 'batch') for (const inner of m.messages) this.onWorkerMessage(inner, local);
  }

  private onTransition(t: TransitionEvent): void {
    const handle = this.ranks[t.rank - this.rankOffset]!;
    if (handle.terminated) return;
    handle.state = t.to;
    if (t.seq !== undefined) handle.seq = t.seq;
    this.emit('transition', t);
    if (t.to === 'failed' && t.error) {
      const error = new RankflowError(t.error.code as never, t.error.message, { rank: t.error.rank ?? t.rank, state: t.from, phase: t.error.phase });
      this.markFailed(t.rank - this.rankOffset, error, t.error.code !== 'RANK_FAILED');
    }
  }

  /** Records a local rank's failure once, tells the group, and fails its peers fast when it is the origin. */
  private markFailed(local: number, error: RankflowError, origin = true): void {
    const handle = this.ranks[local]!;
    if (handle.exited && handle.state !== 'destroyed') handle.state = 'failed';
    if (handle.error) return;
    handle.error = error;
    const rank = handle.rank;
    const m = this.members[local];
    if (m) cutAll(m.untilFailed, error);
    this.emit('failed', { rank, error });
    if (!origin || this.destroying) return;
    const info: FailureInfo = { code: 'RANK_FAILED', message: `rank ${rank} failed: ${error.message}`, rank, phase: error.phase };
    this.members.forEach((m, r) => {
      const peer = this.ranks[r]!;
      if (r !== local && !peer.exited && peer.state !== 'destroyed') this.tellPeerFailed(m, rank, info);
    });
    this.rv?.announceFailure({ rank, message: info.message, ...(error.phase !== undefined ? { phase: error.phase } : {}) });
  }

  /**
   * Rank `failed` is gone: its peers' waits end at once through their abort words (read natively, and
   * by their kernels, also while the worker's thread is blocked in an op), and their machines record it.
   */
  private tellPeerFailed(m: Member, failed: number, info: FailureInfo): void {
    const w = m.abortWords;
    if (w && Atomics.load(w, ABORT.failedRank) === 0) {
      // The reason first (the native side reads it after it sees the failed rank), then the rank.
      const reason = new TextEncoder().encode(info.message).subarray(0, ABORT.maxReason);
      new Uint8Array(w.buffer, w.byteOffset + ABORT.words * 4, ABORT.maxReason).set(reason);
      Atomics.store(w, ABORT.reasonBytes, reason.length);
      Atomics.store(w, ABORT.failedRank, failed + 1);
    }
    try {
      void m.api.peerFailed(info).catch(() => {});
    } catch {
      // the rank's proxy is released (the group is being destroyed): its abort words said it all
    }
  }

  /** The rank is being torn down: whatever it waits for, it stops waiting. */
  private stopRank(m: Member): void {
    if (m.abortWords) Atomics.store(m.abortWords, ABORT.stopping, 1);
  }

  /**
   * Calls rank r's worker; fails with RANK_FAILED if the worker dies first. While no call is in flight
   * the worker is unref'd: a process that forgets destroy() still exits when it has nothing else to do
   * (the workers then end with it); while one is, awaiting it keeps the process alive.
   */
  private call<T>(r: number, fn: () => Promise<T>): Promise<T> {
    const m = this.members[r]!;
    if (this.ranks[r]!.exited) return m.gone;
    if (m.busy++ === 0) m.worker.ref();
    const idle = (): void => {
      if (--m.busy === 0 && !this.destroying) m.worker.unref();
    };
    const p = cutShort(fn(), [m.untilGone]);
    p.then(idle, idle);
    return p;
  }

  /**
   * Runs fn on every rank; rejects with the root cause (a failure that is not a consequence). A rank's
   * part ends when the rank fails even if its call is still running (a rank program that never enters
   * the collective its peers wait in).
   */
  private async all<T>(fn: (api: Comlink.Remote<RankWorkerApi>, r: number) => Promise<T>): Promise<T[]> {
    const settled = await Promise.allSettled(this.members.map((m, r) => this.call(r, () => cutShort(fn(m.api, r), [m.untilFailed]))));
    const errors = settled.flatMap((s) => (s.status === 'rejected' ? [RankflowError.from(s.reason)] : []));
    if (errors.length > 0) throw errors.find((e) => e.code !== 'RANK_FAILED') ?? errors[0]!;
    return settled.map((s) => (s as PromiseFulfilledResult<T>).value);
  }

  /** Queues a collective: its checks run when its turn comes, against the ranks' current states. */
  private collective<T>(states: readonly string[], body: () => Promise<T>): Promise<T> {
    const run = async (): Promise<T> => {
      if (this.destroying) throw new RankflowError('STATE', 'the group is destroyed');
      for (const h of this.ranks) {
        if (h.error) throw new RankflowError(h.error.code, h.error.message, { rank: h.error.rank ?? h.rank, state: h.state, phase: h.error.phase });
        if (!states.includes(h.state)) {
          const why = h.state === 'session.open' ? 'an AGRS session is open: close() it first' : `rank ${h.rank} is in state '${h.state}'`;
          throw new RankflowError('STATE', `${why} (rank ${h.rank} is in state '${h.state}'; this operation needs ${states.join(' or ')})`, { rank: h.rank, state: h.state });
        }
      }
      return body();
    };
    const p = this.queue.then(run, run);
    this.queue = p.then(() => {}, () => {});  // not p.catch(): that would keep the last result alive
    return p;
  }

  /**
   * Per local rank, what it has sent since the group was made: bytes into the windows of ranks of its
   * node (scale-up), bytes of payload over the scale-out leg to ranks of other nodes (its frames'
   * headers not counted), and the seconds its scale-out exchanges took. Read from counters the ranks
   * keep in shared memory: current even while an op runs. Counted by the host backend; the cuda
   * backend's kernels do not count yet (its ranks report 0).
   */
  traffic(): TrafficReport[] {
    return this.members.map((m, r) => ({
      rank: this.rankOffset + r,
      scaleUpBytes: Number(Atomics.load(m.traffic, TRAFFIC.scaleUpBytes)),
      scaleOutBytes: Number(Atomics.load(m.traffic, TRAFFIC.scaleOutBytes)),
      scaleOutSeconds: Number(Atomics.load(m.traffic, TRAFFIC.scaleOutNs)) / 1e9,
    }));
  }

  snapshot(): RankSnapshot[] {
    return this.ranks.map((h) => ({ rank: h.rank, state: h.state, seq: h.seq, ...(h.error ? { error: h.error.toJSON() } : {}) }));
  }

  barrier(opts?: { withCpuSync?: boolean }): Promise<void> {
    let withCpuSync: boolean;
    try {
      const o = checkOptions<{ withCpuSync: unknown }>('options', opts, '{ withCpuSync? }');
      if (o.withCpuSync !== undefined && typeof o.withCpuSync !== 'boolean') throw invalid('withCpuSync', 'must be a boolean');
      withCpuSync = o.withCpuSync ?? false;
    } catch (e) {
      return Promise.reject(e);
    }
    return this.collective(['ready'], async () => {
      await this.all((api) => api.barrier(withCpuSync));
    });
  }

  allGather(tensors: Tensor[]): Promise<Tensor[]> {
    try {
      this.checkGatherInputs('tensors', tensors, this.bufferBytes);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.collective(['ready'], () => this.all((api, r) => api.allGather(tensors[r]!)));
  }

  private checkGatherInputs(name: string, tensors: unknown, capacity: number): void {
    const list = checkPerRank<Tensor>(name, tensors, this.size);
    list.forEach((t, r) => checkTensor(`${name}[${r}]`, t, {}));
    checkSameShape(name, list);
    const bytes = numel(list[0]!.shape) * ELEMENT_BYTES[list[0]!.dtype];
    if (bytes * this.worldSize > capacity) throw invalid(name, `${bytes} bytes per rank need ${bytes * this.worldSize} buffer bytes; ${capacity} are available (raise buffer.bytes)`);
  }

  dispatch(inputs: DispatchInput[]): Promise<DispatchResult[]> {
    try {
      const list = checkPerRank<DispatchInput>('inputs', inputs, this.size);
      list.forEach((d, r) => checkDispatchInput(`inputs[${r}]`, d, this.buffer, this.worldSize, this.rankOffset + r, this.id, this.members[r]!.handles));
      this.checkHandlesAgree('inputs', list.map((d) => d.handle));
    } catch (e) {
      return Promise.reject(e);
    }
    return this.collective(['ready'], async () => {
      const out = await this.all((api, r) => api.dispatch(inputs[r]!));
      out.forEach((o, r) => this.members[r]!.handles.add(o.handle));  // the handles this group may take back
      return out;
    });
  }

  combine(inputs: CombineInput[]): Promise<CombineResult[]> {
    let biases: Tensor[][];
    try {
      const list = checkPerRank<CombineInput>('inputs', inputs, this.size);
      biases = list.map((c, r) => checkCombineInput(`inputs[${r}]`, c, this.buffer, this.rankOffset + r, this.id, this.members[r]!.handles));
      this.checkHandlesAgree('inputs', list.map((c) => c.handle));
    } catch (e) {
      return Promise.reject(e);
    }
    return this.collective(['ready'], () => this.all((api, r) => api.combine(inputs[r]!, biases[r]!)));
  }

  /** Handles used together must come from the same dispatch, or none may be given (cached dispatch). */
  private checkHandlesAgree(name: string, handles: Array<DispatchHandle | undefined>): void {
    const given = handles.filter((h) => h !== undefined);
    if (given.length === 0) return;
    if (given.length !== handles.length) throw invalid(`${name}[${handles.findIndex((h) => h === undefined)}].handle`, 'is missing: either every rank passes a handle or none does');
    const seq = given[0]!.seq;
    const bad = handles.findIndex((h) => h!.seq !== seq);
    if (bad >= 0) throw invalid(`${name}[${bad}].handle`, `comes from another dispatch (collective #${handles[bad]!.seq}, rank 0's from #${seq})`);
  }

  async openSession(opts: { maxBytes: number; maxAllGathers: number }): Promise<Session> {
    checkOptions('options', opts, '{ maxBytes, maxAllGathers }', false);
    checkPositiveInt('maxBytes', opts.maxBytes);
    checkPositiveInt('maxAllGathers', opts.maxAllGathers, 1 << 16);
    if (this.sessionOpen) throw new RankflowError('STATE', 'an AGRS session is already open on this group: close() it before opening another');
    const need = sessionBytes(opts.maxBytes, opts.maxAllGathers, this.worldSize);
    if (need > this.bufferBytes) {
      const bytes = Math.ceil((this.workspaceBytes + need) / (2 << 20)) * (2 << 20);
      throw invalid('maxBytes', `maxBytes * ranks * maxAllGathers = ${need} bytes exceeds the buffer (${this.bufferBytes} bytes): ` +
        `create the group with buffer.bytes of at least ${bytes} (sessionSizeHint({ maxBytes: ${opts.maxBytes}, maxAllGathers: ${opts.maxAllGathers}, numExperts: ${this.buffer.numExperts} }, ${this.worldSize}))`);
    }
    await this.collective(['ready'], async () => {
      await this.all((api) => api.sessionOpen(opts.maxBytes, opts.maxAllGathers));
    });
    this.sessionOpen = true;
    return new Session(this, opts.maxBytes, opts.maxAllGathers);
  }

  /** @internal */ sessionCollective<T>(body: (all: Group['all']) => Promise<T>): Promise<T> {
    return this.collective(['session.open'], () => body(this.all.bind(this)));
  }
  /** @internal */ get sessionIsOpen(): boolean { return this.sessionOpen; }
  /** @internal */ set sessionIsOpen(v: boolean) { this.sessionOpen = v; }
  /** @internal */ get disposedOrFailed(): boolean { return this.destroying || this.ranks.some((h) => h.error !== undefined); }

  engramWrite(storages: Tensor[]): Promise<void> {
    try {
      const list = checkPerRank<Tensor>('storages', storages, this.size);
      list.forEach((t, r) => checkTensor(`storages[${r}]`, t, { rank: 2 }));
      checkSameShape('storages', list);
      const [entries, hidden] = list[0]!.shape as [number, number];
      if (hidden === 0) throw invalid('storages[0].shape[1]', 'must be positive: a row needs at least one element');
      const need = engramSizeHint({ entriesPerRank: entries, hidden, dtype: list[0]!.dtype });
      const have = this.buffer.cpuBytes ?? 0;
      if (have < entries * hidden * ELEMENT_BYTES[list[0]!.dtype])
        throw invalid('buffer.cpuBytes', `is ${have}; this engram table needs a host segment of ${need} bytes (engramSizeHint)`);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.collective(['ready'], async () => {
      await this.all((api, r) => api.engramWrite(storages[r]!));
    });
  }

  engramFetch(indices: Int32Array[]): Promise<Tensor[]> {
    try {
      const list = checkPerRank<Int32Array>('indices', indices, this.size);
      list.forEach((ids, r) => checkArray(`indices[${r}]`, ids, Int32Array));
    } catch (e) {
      return Promise.reject(e);
    }
    // The table is the one stored by the engramWrite queued before: checked when this call's turn comes.
    return this.collective(['ready'], async () => {
      // Asked, not remembered: a rank program may have written the table.
      const entries = await this.call(0, () => this.members[0]!.api.engramEntries());
      if (entries < 0) throw new RankflowError('STATE', 'engramFetch before engramWrite: no table is stored');
      const total = entries * this.worldSize;
      indices.forEach((ids, r) => {
        const bad = ids.findIndex((g) => g < 0 || g >= total);
        if (bad >= 0) throw invalid(`indices[${r}][${bad}]`, `${ids[bad]} is outside [0, ${total})`);
      });
      return this.all((api, r) => api.engramFetch(indices[r]!));
    });
  }

  /** Pipeline send/recv on the ring: out[r] = tensors[r - 1]. */
  ppExchange(tensors: Tensor[]): Promise<Tensor[]> {
    try {
      this.checkGatherInputs('tensors', tensors, Number.POSITIVE_INFINITY); // the bound that holds is per rank: below
      const bytes = numel(tensors[0]!.shape) * ELEMENT_BYTES[tensors[0]!.dtype];
      if (bytes > this.bufferBytes) throw invalid('tensors', `${bytes} bytes per rank exceed the buffer (${this.bufferBytes} bytes; see ppSizeHint)`);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.collective(['ready'], () => this.all((api, r) => api.ppExchange(tensors[r]!)));
  }

  /**
   * Rank-program mode: loads moduleUrl in every rank's worker and calls its default export (rank, args).
   * `signal`: aborted before the run's turn (runs queue like collectives), the run is skipped; aborted
   * while the programs run, they see it (rank.aborted, rank.signal, rank.anyAborted(): a program stops
   * when it chooses to, ideally after the same collective on every rank) and the run rejects with
   * ABORTED once every program has ended. Either way the rejection is RankflowError code 'ABORTED'.
   */
  run<T = unknown>(moduleUrl: string | URL, args?: unknown, opts?: { signal?: AbortSignal }): Promise<T[]> {
    let signal: AbortSignal | undefined;
    try {
      if (typeof moduleUrl !== 'string' && !(moduleUrl instanceof URL)) throw invalid('moduleUrl', `must be a string or URL (got ${describe(moduleUrl)})`);
      signal = checkSignal('options.signal', checkOptions<{ signal: unknown }>('options', opts, '{ signal? }').signal);
      if (signal?.aborted) throw abortError('group.run', signal);
    } catch (e) {
      return Promise.reject(e);
    }
    const url = moduleUrl.toString();
    if (!signal) return this.collective(['ready'], () => this.all((api) => api.run(url, args) as Promise<T>));
    return this.runUnless(url, args, signal);
  }
  private runs = 0;

  private runUnless<T>(url: string, args: unknown, signal: AbortSignal): Promise<T[]> {
    return new Promise<T[]>((resolve, reject) => {
      let running = 0;  // the run's id while its programs run
      let early = false;
      const onAbort = (): void => {
        if (running === 0) {
          early = true;  // skipped when its turn comes
          return reject(abortError('group.run', signal));
        }
        const reason = abortError('group.run', signal).message;
        for (const m of this.members) {
          Atomics.store(m.runAbort, 0, running);
          void m.api.abortRun(running, reason).catch(() => {});
        }
      };
      signal.addEventListener('abort', onAbort, { once: true });
      let aborted = false;
      this.collective(['ready'], async () => {
        if (early) throw abortError('group.run', signal);
        running = ++this.runs;
        try {
          return await this.all((api) => api.run(url, args, running) as Promise<T>);
        } finally {
          aborted = signal.aborted;
          running = 0;
        }
      }).then(
        (out) => (aborted ? reject(abortError('group.run', signal)) : resolve(out)),
        // A failure of the ranks themselves is not hidden behind the abort.
        (e: unknown) => reject(aborted && !this.ranks.some((h) => h.error) ? abortError('group.run', signal) : e),
      ).finally(() => signal.removeEventListener('abort', onAbort));
    });
  }

  /**
   * Layout probes (tests): write `bytes` through local rank `from`'s translated pointer into global rank
   * `to`'s window at `offset` (within the symmetric segment: [0, symmetricBytes - bytes.length]).
   */
  async writePeer(from: number, to: number, offset: number, bytes: Uint8Array): Promise<bigint> {
    this.checkProbe('from', from);
    checkIntIn('to', to, 0, this.worldSize - 1);
    if (!(bytes instanceof Uint8Array)) throw invalid('bytes', `must be a Uint8Array (got ${describe(bytes)})`);
    checkIntIn('offset', offset, 0, Math.max(0, this.symmetricBytes - bytes.length));
    if (bytes.length > this.symmetricBytes) throw invalid('bytes', `has ${bytes.length} bytes; the symmetric segment has ${this.symmetricBytes}`);
    return this.call(from, () => this.members[from]!.api.writePeer(to, offset, bytes));
  }
  /** Layout probes (tests): `length` bytes of local rank `rank`'s own window from `offset` (within the symmetric segment). */
  async readWindow(rank: number, offset: number, length: number): Promise<Uint8Array> {
    this.checkProbe('rank', rank);
    checkIntIn('offset', offset, 0, this.symmetricBytes);
    checkIntIn('length', length, 0, this.symmetricBytes - offset);
    return this.call(rank, () => this.members[rank]!.api.readWindow(offset, length));
  }
  /** What local rank `rank` (an index in [0, size)) says of itself: memory kind, windows, domains, seq, state. */
  async info(rank: number) {
    this.checkProbe('rank', rank);
    return this.call(rank, () => this.members[rank]!.api.info());
  }
  /** A probe names a local rank of a group that is not destroyed. */
  private checkProbe(name: string, rank: unknown): void {
    checkIntIn(name, rank, 0, this.size - 1);
    if (this.destroying) throw new RankflowError('STATE', 'the group is destroyed', { rank: this.rankOffset + (rank as number), state: 'destroyed' });
  }

  /** @internal */
  async terminateRank(rank: number): Promise<void> {
    const local = rank - this.rankOffset;
    const m = this.members[local];
    if (!m) throw invalid('rank', `${rank} is not a rank of this process's part of the group`);
    // The peers are told first, as a lost process is reported: the killed rank's teardown must not
    // wait on peers that still wait for it (on cuda: a barrier kernel, NCCL's teardown).
    const h = this.ranks[local]!;
    if (!h.exited && !this.destroying && h.state !== 'destroyed') {
      this.markFailed(local, new RankflowError('RANK_FAILED', `rank ${rank} was terminated`, { rank, state: h.state }));
      // Dead from now on: what its worker still had in flight is no longer its state.
      h.terminated = true;
      h.state = 'failed';
    }
    this.stopRank(m);
    m.worker.ref();  // the process waits for the worker's end it awaits
    await m.worker.terminate();
    await m.gone.catch(() => {});
  }

  /** Every rank ends 'destroyed'; all memory, fds and workers are released. Safe to call twice. */
  async destroy(): Promise<void> {
    if (this.destroying) return this.destroyed;
    this.destroying = true;
    this.destroyed = (async () => {
      await Promise.all(this.members.map(async (m, r) => {
        if (!this.ranks[r]!.exited) {
          const timer = new Promise<void>((resolve) => setTimeout(resolve, DESTROY_GRACE_MS).unref());
          await Promise.race([this.call(r, () => m.api.destroy()).catch(() => {}), timer]);
        }
        // A worker blocked in a wait (a peer that never came) only takes terminate() once it stops waiting.
        this.stopRank(m);
        m.api[Comlink.releaseProxy]();
        m.worker.ref();
        await m.worker.terminate();
        const h = this.ranks[r]!;
        if (h.state !== 'destroyed') {
          const from = h.state;
          h.state = 'destroyed';
          this.emit('transition', { rank: r, from, to: 'destroyed', event: 'TERMINATED', at: performance.timeOrigin + performance.now() });
        }
      }));
      for (const detach of this.detachers.splice(0)) detach();
      await this.inspector?.close();
      await this.rv?.close();
    })();
    return this.destroyed;
  }
  private destroyed: Promise<void> = Promise.resolve();

  /** `await using group = await createGroup(...)`: destroy() when the scope ends. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.destroy();
  }
}

/** An AGRS session: every rank is in its `session` state until close(). */
export class Session {
  private closed = false;
  /** collectives started in this session: the ranks refuse more than maxAllGathers */
  private collectives = 0;
  constructor(private readonly group: Group, readonly maxBytes: number, readonly maxAllGathers: number) {}

  allGather(tensors: Tensor[]): Promise<Tensor[]> {
    try {
      this.checkOpen();
      const list = checkPerRank<Tensor>('tensors', tensors, this.group.size);
      list.forEach((t, r) => checkTensor(`tensors[${r}]`, t, {}));
      checkSameShape('tensors', list);
      const bytes = numel(list[0]!.shape) * ELEMENT_BYTES[list[0]!.dtype];
      if (bytes > this.maxBytes) throw invalid('tensors', `${bytes} bytes per rank exceed the session's maxBytes (${this.maxBytes})`);
      this.takeSlot();
    } catch (e) {
      return Promise.reject(e);
    }
    return this.group.sessionCollective((all) => all((api, r) => api.sessionAllGather(tensors[r]!)));
  }

  reduceScatter(tensors: Tensor[]): Promise<Tensor[]> {
    const W = this.group.worldSize;
    try {
      this.checkOpen();
      const list = checkPerRank<Tensor>('tensors', tensors, this.group.size);
      list.forEach((t, r) => {
        checkTensor(`tensors[${r}]`, t, { dtypes: ['fp32', 'bf16'] });
        if (t.shape.length < 1 || t.shape[0]! % W !== 0) throw invalid(`tensors[${r}].shape[0]`, `must be a multiple of the world size (${W}), got ${t.shape[0]}`);
      });
      checkSameShape('tensors', list);
      const bytes = (numel(list[0]!.shape) / W) * ELEMENT_BYTES[list[0]!.dtype];
      if (bytes > this.maxBytes) throw invalid('tensors', `${bytes} bytes per rank chunk exceed the session's maxBytes (${this.maxBytes})`);
      this.takeSlot();
    } catch (e) {
      return Promise.reject(e);
    }
    return this.group.sessionCollective((all) => all((api, r) => api.sessionReduceScatter(tensors[r]!)));
  }

  async close(): Promise<void> {
    this.checkOpen();
    await this.group.sessionCollective(async (all) => {
      await all((api) => api.sessionClose());
    });
    this.closed = true;
    this.group.sessionIsOpen = false;
  }

  private checkOpen(): void {
    if (this.closed) throw new RankflowError('STATE', 'this AGRS session is closed');
  }

  /**
   * `await using s = await group.openSession(...)`: close() when the scope ends, unless the session is
   * closed already or its group is destroyed or failed (nothing is left to close then).
   */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.closed || this.group.disposedOrFailed) return;
    await this.close();
  }

  /** Every collective takes a fresh part of the session's buffer: refuse the one that would not fit. */
  private takeSlot(): void {
    if (this.collectives >= this.maxAllGathers)
      throw invalid('maxAllGathers', `this session allows ${this.maxAllGathers} collectives and all are used: close() it and open another`);
    this.collectives++;
  }
}

/**
 * `devices`: the GPU ordinal of each rank, below the GPU count (cuda only; ignored on host). A GPU may
 * be named more than once: those ranks share it (one process only).
 */
function checkDevices(devices: unknown, size: number, backend: Backend, gpus: number): number[] | undefined {
  if (devices === undefined) return undefined;
  if (!Array.isArray(devices)) throw invalid('devices', `must be an array of GPU ordinals, one per rank (got ${typeof devices})`);
  if (devices.length !== size) throw invalid('devices', `has ${devices.length} entries; it needs one GPU ordinal per rank (${size})`);
  devices.forEach((d, i) => {
    if (!Number.isInteger(d) || (d as number) < 0) throw invalid(`devices[${i}]`, `must be a non-negative integer GPU ordinal (got ${String(d)})`);
    if (backend === 'cuda' && (d as number) >= gpus) throw invalid(`devices[${i}]`, `GPU ${d} does not exist: the driver sees ${gpus} GPU(s)`);
  });
  return backend === 'cuda' ? (devices as number[]) : undefined;
}

/** The GPUs (UUIDs) this process's cuda ranks use: `devices`, or rank % GPU count as the native side picks. */
function localGpuIds(size: number, rankOffset: number, devices?: number[]): string[] {
  const gpus = (probeCuda().gpus ?? []) as Array<{ uuid?: string }>;
  if (gpus.length === 0) return [];
  return Array.from({ length: size }, (_, r) => gpus[devices ? devices[r]! : (rankOffset + r) % gpus.length]?.uuid ?? '').filter((u) => u !== '');
}

/**
 * Longest timeout, in seconds: each rank machine's backstop timer ((seconds + margin) * 1000 ms) must
 * fit the 32-bit setTimeout of Node, which fires at once when given more (or Infinity).
 */
const MAX_TIMEOUT_SECONDS = 2_000_000;

function checkTimeout(name: string, v: unknown): number {
  if (typeof v !== 'number' || !(v > 0) || v > MAX_TIMEOUT_SECONDS)
    throw invalid(name, `must be a number of seconds in (0, ${MAX_TIMEOUT_SECONDS}] (got ${String(v)})`);
  return v;
}

function checkBackendOption(b: unknown): 'auto' | Backend | undefined {
  if (b === undefined || b === 'auto' || b === 'cuda' || b === 'host') return b;
  throw invalid('backend', `must be 'auto', 'cuda' or 'host' (got ${String(b)})`);
}

export function createGroup(opts: GroupOptions): Promise<Group> {
  return Group.create(opts);
}

export { sizeHint };
