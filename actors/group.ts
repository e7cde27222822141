// The main thread's view of a group of ranks: creating it (this process's ranks, and the world's other
// processes where it spans several), the collective operations in driver mode, AGRS sessions, rank
// programs, the layout probes, and teardown. Collectives are queued: calls on one group never
// interleave. The ranks' workers, calls and failure spreading are in ranks.ts; the options' checks in
// options.ts.
import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'eventemitter3';

import { RankflowError, invalid } from './core/errors.js';
import { installErrorTransfer } from './core/comlink-errors.js';
import { TRAFFIC } from './core/addon.js';
import type { Backend } from './core/backend.js';
import { checkArray, checkTensor, ELEMENT_BYTES, numel, type DType, type Tensor } from './core/tensor.js';
import {
  checkCombineInput, checkDispatchInput, checkGatherInputs, checkHandlesAgree, checkOptions, checkPerRank, checkPositiveInt, checkSameShape,
  type BufferConfig, type CombineInput, type DispatchDType, type DispatchInput,
} from './core/validate.js';
import { engramSizeHint, sessionBytes, sizeHint } from './core/hints.js';
import type { WorldOptions } from './world/join.js';
import type { Rendezvous } from './world/rendezvous.js';
import { rankMachine } from '../machines/index.js';
import { describeMachine } from './observe/machine-graph.js';
import { attachInspector, type InspectorHandle } from './observe/inspector.js';
import { abortError, checkSignal } from './core/abort.js';
import type { CombineResult, DispatchResult, RankSnapshot, TrafficReport } from './core/types.js';
import type { TransitionEvent } from '../workers/protocol.js';
import { planGroup, type GroupOptions, type GroupPlan } from './options.js';
import { RankHandle, Ranks } from './ranks.js';
import { Session } from './session.js';
import { startRanks } from './startup.js';
import { runPrograms, type RunDeps } from './run.js';
import { checkModuleUrl } from './core/module-url.js';
import { attachDebugLog } from './observe/debug-log.js';
import { Membership, type RankJoined, type RankLeft } from './elastic.js';
import { rankInfo, readWindow, writePeer, type ProbeSite } from './probes.js';

export type { GroupOptions, RankSnapshot, TrafficReport };
export { RankHandle, Session };
export type { TransitionEvent, RankJoined, RankLeft };

export interface GroupEvents {
  transition: (t: TransitionEvent) => void;
  failed: (f: { rank: number; error: RankflowError }) => void;
  inspect: (record: Record<string, unknown>) => void;
  rankLeft: (e: RankLeft) => void;
  rankJoined: (e: RankJoined) => void;
}

installErrorTransfer();

export class Group extends EventEmitter<GroupEvents> {
  readonly id = randomUUID();
  readonly ranks: RankHandle[];
  /** this process's ranks' workers */
  private readonly workers: Ranks;
  private queue: Promise<unknown> = Promise.resolve();
  private destroying = false;
  private sessionOpen = false;
  private bufferBytes = 0;
  private workspaceBytes = 0;
  private symmetricBytes = 0;
  /** each rank's host segment as made (buffer.cpuBytes rounded up to 2 MiB): what an engram table may fill */
  private cpuBytes = 0;
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
    this.workers = new Ranks(this.ranks, this.rankOffset, this, (f) => this.rv?.announceFailure(f));
    if (opts.elastic === true) this.membership = new Membership(this.workers, this, (body) => this.collective([], body, false), () => { this.sessionOpen = false; }, this.worldSize);
  }
  private readonly membership?: Membership;  // elastic groups (actors/elastic.ts): who serves, leaving, replacing
  /** 'degraded' while ranks of an elastic group are out; 'failed' once a rank of another group failed; else 'ready'. */
  get state(): 'ready' | 'degraded' | 'failed' | 'destroyed' {
    if (this.destroying) return 'destroyed';
    return this.membership ? (this.membership.broken ? 'failed' : this.membership.degraded ? 'degraded' : 'ready') : this.ranks.some((h) => h.error) ? 'failed' : 'ready';
  }
  /** The global ids of the ranks serving now, ascending: all of them, but those that left an elastic group. */
  get liveRanks(): number[] {
    return this.membership?.liveRanks ?? (this.ranks.some((h) => h.error) ? [] : this.ranks.map((h) => h.rank));
  }
  /** Elastic groups: a fresh rank `rank` (new worker, new context) in place of one that left; resolves once it serves. */
  replaceRank(rank: number): Promise<void> {
    return this.membership?.replace(rank) ?? Promise.reject(new RankflowError('EINVAL', 'replaceRank: the group is not elastic (createGroup({ elastic: true }))'));
  }
  /** Of per-rank entries, those of the ranks that serve (a rank that left an elastic group takes null), with their index. */
  private serving<T>(list: T[]): Array<[T, number]> {
    return list.flatMap((x, r) => (this.workers.serves(r) ? [[x, r] as [T, number]] : []));
  }

  /** @internal use createGroup() */
  static async create(opts: GroupOptions): Promise<Group> {
    const plan = planGroup(opts);
    const { signal } = plan;
    const group = new Group(plan.size, plan.backend, plan.buffer, opts, plan.world);
    if (typeof opts.inspect === 'function') group.on('inspect', opts.inspect);
    group.detachers.push(attachDebugLog(group));  // DEBUG=rankflow: the group's life in the log (observe/debug-log.ts)
    for (const o of opts.observers ?? []) group.detachers.push(o.attach(group));
    // An abort tears the ranks down at once (their waits end); start() then fails, and the error is ABORTED.
    const onAbort = (): void => {
      group.creation.abort(signal!.reason);
      void group.destroy().catch(() => {});
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    try {
      if (plan.inspectAt) {
        group.inspector = await attachInspector(group, { ...plan.inspectAt, machine: describeMachine(rankMachine), unref: true });
        process.stderr.write(`rankflow: inspector at ${group.inspector.url}\n`);
      }
      if (signal?.aborted) throw abortError('createGroup', signal);
      await group.start(plan);
      if (signal?.aborted) throw abortError('createGroup', signal);
    } catch (e) {
      await group.destroy().catch(() => {});
      throw signal?.aborted ? abortError('createGroup', signal) : RankflowError.from(e);
    } finally {
      signal?.removeEventListener('abort', onAbort);
    }
    return group;
  }

  private async start(plan: GroupPlan): Promise<void> {
    const sizes = await startRanks({
      id: this.id, size: this.size, worldSize: this.worldSize, rankOffset: this.rankOffset, backend: this.backend,
      buffer: this.buffer, opts: this.opts, ranks: this.ranks, workers: this.workers, signal: this.creation.signal,
      destroying: () => this.destroying, watchWorld: (rv) => this.watchWorld(rv), ...(this.world ? { world: this.world } : {}),
    }, plan);
    ({ bufferBytes: this.bufferBytes, workspaceBytes: this.workspaceBytes, symmetricBytes: this.symmetricBytes, cpuBytes: this.cpuBytes } = sizes);
  }

  /** The world's connections report lost processes and the failures of other processes' ranks. */
  private watchWorld(rv: Rendezvous): void {
    this.rv = rv;
    if (this.membership) return this.membership.watch(rv);  // elastic: the ranks of other processes leave
    rv.onPeerLost((lost) => {
      for (let g = lost.rankOffset; g < lost.rankOffset + lost.localRanks; g++)
        this.workers.failedElsewhere(g, new RankflowError('RANK_FAILED', `rank ${g} is gone: its process left the world (${lost.reason})`, { rank: g }), true);
    });
    // A rank of another process failed while its process lives on (a timeout, a terminated worker).
    rv.onRankFailed((f) => this.workers.failedElsewhere(f.rank, new RankflowError('RANK_FAILED', f.message, { rank: f.rank, phase: f.phase }), false));
  }

  /** Queues a collective: its checks run when its turn comes, against the ranks' current states. */
  private collective<T>(states: readonly string[], body: () => Promise<T>, settle = true, ended?: () => RankflowError | undefined): Promise<T> {
    const run = async (): Promise<T> => {
      if (this.destroying) throw new RankflowError('STATE', 'the group is destroyed');
      if (settle) await this.membership?.beforeOp(ended);  // a rank left: the survivors re-form first
      for (const h of this.ranks) {
        if (states.length === 0 || !this.workers.serves(h.rank - this.rankOffset)) continue;
        if (h.error) throw new RankflowError(h.error.code, h.error.message, { rank: h.error.rank ?? h.rank, state: h.state, phase: h.error.phase });
        if (!states.includes(h.state)) {
          const why = h.state === 'session.open' ? 'an AGRS session is open: close() it first' : `rank ${h.rank} is in state '${h.state}'`;
          throw new RankflowError('STATE', `${why} (rank ${h.rank} is in state '${h.state}'; this operation needs ${states.join(' or ')})`, { rank: h.rank, state: h.state });
        }
      }
      return this.membership && settle ? this.membership.counted(body) : body();
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
    return this.workers.members.map((m, r) => ({
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
      await this.workers.all((api) => api.barrier(withCpuSync));
    });
  }

  allGather<D extends DType>(tensors: Tensor<D>[]): Promise<Tensor<D>[]> {
    try {
      checkGatherInputs('tensors', tensors, this.size, this.worldSize, this.bufferBytes, (r) => this.workers.serves(r));
    } catch (e) {
      return Promise.reject(e);
    }
    return this.collective(['ready'], () => this.workers.all((api, r) => api.allGather(tensors[r]!) as Promise<Tensor<D>>));
  }

  /** The sum over the ranks of their parts (fp32 or bf16, one shape), on every rank, in rank order with fp32 accumulation: the same bits on each. */
  allReduce<D extends 'fp32' | 'bf16'>(parts: Tensor<D>[], opts?: { op?: 'sum' }): Promise<Tensor<D>[]> {
    try {
      const o = checkOptions<{ op: unknown }>('options', opts, '{ op? }');
      if (o.op !== undefined && o.op !== 'sum') throw invalid('op', `must be 'sum' (got ${String(o.op)})`);
      const list = this.serving(checkPerRank<Tensor>('parts', parts, this.size));
      list.forEach(([t, r]) => checkTensor(`parts[${r}]`, t, { dtypes: ['fp32', 'bf16'] }));
      checkSameShape('parts', list.map(([t]) => t));
    } catch (e) {
      return Promise.reject(e);
    }
    return this.collective(['ready'], () => this.workers.all((api, r) => api.allReduce(parts[r]!) as Promise<Tensor<D>>));
  }

  dispatch<D extends DispatchDType>(inputs: DispatchInput<D>[]): Promise<DispatchResult<D>[]> {
    try {
      const list = this.serving(checkPerRank<DispatchInput>('inputs', inputs, this.size));
      list.forEach(([d, r]) => checkDispatchInput(`inputs[${r}]`, d, this.buffer, this.worldSize, this.rankOffset + r, this.id, this.workers.members[r]!.handles));
      checkHandlesAgree('inputs', list.map(([d]) => d.handle));
    } catch (e) {
      return Promise.reject(e);
    }
    return this.collective(['ready'], async () => {
      const out = await this.workers.all((api, r) => api.dispatch(inputs[r]!) as Promise<DispatchResult<D>>);
      out.forEach((o, r) => o && this.workers.members[r]!.handles.add(o.handle));  // the handles this group may take back
      return out;
    });
  }

  combine(inputs: CombineInput[]): Promise<CombineResult[]> {
    let biases: Tensor[][];
    try {
      const list = this.serving(checkPerRank<CombineInput>('inputs', inputs, this.size));
      biases = [];
      for (const [c, r] of list) biases[r] = checkCombineInput(`inputs[${r}]`, c, this.buffer, this.rankOffset + r, this.id, this.workers.members[r]!.handles);
      checkHandlesAgree('inputs', list.map(([c]) => c.handle));
    } catch (e) {
      return Promise.reject(e);
    }
    return this.collective(['ready'], () => this.workers.all((api, r) => api.combine(inputs[r]!, biases[r]!)));
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
      await this.workers.all((api) => api.sessionOpen(opts.maxBytes, opts.maxAllGathers));
    });
    this.sessionOpen = true;
    return new Session(this, opts.maxBytes, opts.maxAllGathers, this.membership?.since());
  }

  /** @internal */ sessionCollective<T>(body: (all: Ranks['all']) => Promise<T>, ended?: () => RankflowError | undefined): Promise<T> {
    return this.collective(['session.open'], () => body(this.workers.all.bind(this.workers)), true, ended);
  }
  /** @internal */ get sessionIsOpen(): boolean { return this.sessionOpen; } set sessionIsOpen(v: boolean) { this.sessionOpen = v; }
  /** @internal */ get disposedOrFailed(): boolean { return this.destroying || this.ranks.some((h) => h.error !== undefined); }

  engramWrite(storages: Tensor[]): Promise<void> {
    try {
      const list = this.serving(checkPerRank<Tensor>('storages', storages, this.size)).map(([t, r]) => {
        checkTensor(`storages[${r}]`, t, { rank: 2 });
        return t;
      });
      checkSameShape('storages', list);
      const [entries, hidden] = list[0]!.shape as [number, number];
      if (hidden === 0) throw invalid('storages[0].shape[1]', 'must be positive: a row needs at least one element');
      const need = engramSizeHint({ entriesPerRank: entries, hidden, dtype: list[0]!.dtype });
      // the segment the ranks made (info().cpuBytes), not the bytes asked for: the ranks take what fits it
      if (this.cpuBytes < entries * hidden * ELEMENT_BYTES[list[0]!.dtype])
        throw invalid('buffer.cpuBytes', `is ${this.buffer.cpuBytes ?? 0} (a host segment of ${this.cpuBytes} bytes); this engram table needs a host segment of ${need} bytes (engramSizeHint)`);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.collective(['ready'], async () => {
      await this.workers.all((api, r) => api.engramWrite(storages[r]!));
    });
  }

  engramFetch(indices: Int32Array[]): Promise<Tensor[]> {
    try {
      this.serving(checkPerRank<Int32Array>('indices', indices, this.size)).forEach(([ids, r]) => checkArray(`indices[${r}]`, ids, Int32Array));
    } catch (e) {
      return Promise.reject(e);
    }
    // The table is the one stored by the engramWrite queued before: checked when this call's turn comes.
    return this.collective(['ready'], async () => {
      // Asked, not remembered: a rank program may have written the table.
      const entries = await this.workers.call(this.serving(this.ranks)[0]?.[1] ?? 0, (api) => api.engramEntries());
      if (entries < 0) throw new RankflowError('STATE', 'engramFetch before engramWrite: no table is stored');
      const total = entries * this.worldSize;
      this.serving(indices).forEach(([ids, r]) => {
        const bad = ids.findIndex((g) => g < 0 || g >= total);
        if (bad >= 0) throw invalid(`indices[${r}][${bad}]`, `${ids[bad]} is outside [0, ${total})`);
      });
      return this.workers.all((api, r) => api.engramFetch(indices[r]!));
    });
  }

  /** Pipeline send/recv on the ring: out[r] = tensors[r - 1]. */
  ppExchange<D extends DType>(tensors: Tensor<D>[]): Promise<Tensor<D>[]> {
    try {
      checkGatherInputs('tensors', tensors, this.size, this.worldSize, Number.POSITIVE_INFINITY, (r) => this.workers.serves(r)); // the bound that holds is per rank: below
      const [first] = this.serving(tensors)[0] ?? [tensors[0]!];
      const bytes = numel(first.shape) * ELEMENT_BYTES[first.dtype];
      if (bytes > this.bufferBytes) throw invalid('tensors', `${bytes} bytes per rank exceed the buffer (${this.bufferBytes} bytes; see ppSizeHint)`);
    } catch (e) {
      return Promise.reject(e);
    }
    return this.collective(['ready'], () => this.workers.all((api, r) => api.ppExchange(tensors[r]!) as Promise<Tensor<D>>));
  }

  /**
   * Rank-program mode: loads moduleUrl in every rank's worker and calls its default export (rank, args).
   * How a run ends (a program that throws or returns early releases its peers; the ranks are put back
   * in step before it settles; `signal` skips or aborts it) is actors/run.ts's.
   */
  run<T = unknown>(moduleUrl: string | URL, args?: unknown, opts?: { signal?: AbortSignal }): Promise<T[]> {
    let signal: AbortSignal | undefined;
    let url: string;
    try {
      url = checkModuleUrl('moduleUrl', moduleUrl);
      signal = checkSignal('options.signal', checkOptions<{ signal: unknown }>('options', opts, '{ signal? }').signal);
      if (signal?.aborted) throw abortError('group.run', signal);
    } catch (e) {
      return Promise.reject(e);
    }
    return runPrograms<T>(this.runDeps, url, args, signal);
  }
  private runs = 0;
  private get runDeps(): RunDeps {
    return {
      queue: (body) => this.collective(['ready'], body), workers: this.workers, rankOffset: this.rankOffset, nextId: () => ++this.runs,
      destroying: () => this.destroying, world: () => this.rv, elastic: this.membership,
    };
  }

  /** Layout probes (tests): write `bytes` through local rank `from`'s translated pointer into global rank `to`'s window at `offset` (probes.ts). */
  writePeer(from: number, to: number, offset: number, bytes: Uint8Array): Promise<bigint> {
    return writePeer(this.probeSite, from, to, offset, bytes);
  }
  /** Layout probes (tests): `length` bytes of local rank `rank`'s own window from `offset` (within the symmetric segment). */
  readWindow(rank: number, offset: number, length: number): Promise<Uint8Array> {
    return readWindow(this.probeSite, rank, offset, length);
  }
  /** What local rank `rank` (an index in [0, size)) says of itself: memory kind, windows, domains, seq, state. */
  info(rank: number) {
    return rankInfo(this.probeSite, rank);
  }
  private get probeSite(): ProbeSite {
    return { size: this.size, worldSize: this.worldSize, rankOffset: this.rankOffset, symmetricBytes: this.symmetricBytes, destroyed: this.destroying, workers: this.workers };
  }

  /** @internal */
  async terminateRank(rank: number): Promise<void> {
    const local = rank - this.rankOffset;
    if (!this.workers.members[local]) throw invalid('rank', `${rank} is not a rank of this process's part of the group`);
    await this.workers.terminate(local);
  }

  /** Every rank ends 'destroyed'; all memory, fds and workers are released. Safe to call twice. */
  async destroy(): Promise<void> {
    if (this.destroying) return this.destroyed;
    this.destroying = true;
    this.destroyed = (async () => {
      await this.workers.destroy();
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

export function createGroup(opts: GroupOptions): Promise<Group> {
  return Group.create(opts);
}

export { sizeHint };
