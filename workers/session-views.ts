// Rank programs' AGRS sessions that keep data in the symmetric buffer, and their asynchronous ops
// (API.md "Rank programs"; DeepEP V2's agrs_get_inplace_tensor, all_gather handles, engram fetch hooks):
//  - s.tensor(dtype, shape): my slot of a fresh session region (host: a typed array over the mapped
//    window; cuda: a device tensor there). Writing into it is how data enters the session; an
//    allGather of it moves no local copy, only the puts to the peers.
//  - s.allGather / s.reduceScatter(t, { async: true }): the op is issued and { result, wait() } comes
//    back at once; `result` is a view of the op's region (valid after wait(), until close). Without
//    async an ordinary tensor is copied in and out as before; a session tensor gives the view.
//  - engramFetchAsync (rank.engramFetch(ids, { async: true })): { wait() }, other ops run meanwhile.
// Each op is still one pass of the rank machine: its event in, the issue, ISSUED (the rank stays in
// the op's state while it is in flight), and COMPLETED (or FAILED) at its wait. The native calls
// (regions, views, issue, wait) are the op table's: workers/ops/session.ts.
import { invalid, RankflowError } from '../actors/core/errors.js';
import { DeviceTensor, isDeviceTensor } from '../actors/core/device-tensor.js';
import { checkTensor, ELEMENT_BYTES, fromBytes, isDType, numel, type DType, type Tensor } from '../actors/core/tensor.js';
import { ASYNC_OPTION_KEYS, type AsyncOptions, type InFlightCollective, type PendingFetch } from '../actors/core/types.js';
import { checkKnownKeys } from '../actors/core/option-keys.js';
import { checkPositiveInt } from '../actors/core/validate.js';
import type { InFlightKind } from '../machines/index.js';
import type { RankOps } from './ops/index.js';
import { SessionDeviceView } from './ops/session.js';
import { EVENTS } from './runner.js';

/** A session view: a host tensor over the window (host), a device tensor in it (cuda). */
export type SessionTensor<D extends DType = DType> = Tensor<D> & DeviceTensor<D>;
type AnyTensor = Tensor | DeviceTensor;

/** What each rank has in flight outside sessions (engram fetches), for clear refusals. */
const fetchesInFlight = new WeakMap<RankOps, number>();
/** Each rank's open sessions, and how many times it was recovered (ops in flight from before are gone). */
const openSessions = new WeakMap<RankOps, Set<RankSession>>();
const recoveries = new WeakMap<RankOps, number>();
const recoveriesOf = (ops: RankOps): number => recoveries.get(ops) ?? 0;

/**
 * The rank was recovered after a run's release (ops/recover.cc waited for its ops in flight and closed
 * its session): its sessions here are closed too, and the waits of what was in flight refuse.
 */
export function forgetAfterRecovery(ops: RankOps): void {
  recoveries.set(ops, recoveriesOf(ops) + 1);
  fetchesInFlight.delete(ops);
  for (const s of openSessions.get(ops) ?? []) s.closedByRecovery();
  openSessions.delete(ops);
}

/** STATE for the wait of an op issued before the rank was recovered (`since`: the count at its issue). */
function checkNotRecovered(ops: RankOps, since: number, what: string): void {
  if (recoveriesOf(ops) !== since)
    throw new RankflowError('STATE', `wait(): this ${what} was issued in an earlier run, whose end waited for it (the group recovered its ranks then)`);
}
/** At most this many engram fetches in flight per rank (native/src/runtime/inflight.hpp kMaxFetches). */
export const MAX_FETCHES_IN_FLIGHT = 16;

/** STATE while engram fetches of this rank are in flight (ops that would reuse or replace what they read). */
export function refuseWhileFetching(ops: RankOps, what: string): void {
  const n = fetchesInFlight.get(ops) ?? 0;
  if (n > 0) throw new RankflowError('STATE', `${what}: ${n} engram fetch(es) are in flight: wait() for them first`);
}

function checkAsyncOptions(opts: unknown): boolean {
  if (opts === undefined) return false;
  if (opts === null || typeof opts !== 'object' || Array.isArray(opts)) throw invalid('options', 'must be { async? }');
  checkKnownKeys('options', opts, ASYNC_OPTION_KEYS);
  const a = (opts as AsyncOptions).async;
  if (a !== undefined && typeof a !== 'boolean') throw invalid('options.async', 'must be a boolean');
  return a === true;
}

/** A collective's or fetch's wait: the native wait, then COMPLETED (its failure: FAILED, the rank failed). */
function finish(ops: RankOps, id: number, kind: InFlightKind): ArrayBuffer | undefined {
  const { runner, session } = ops;
  const state = runner.state();
  if (state === 'destroying' || state === 'destroyed') throw new RankflowError('STATE', `rank ${runner.rank} is ${state}: its ops in flight are gone`);
  const failure = runner.failure();
  if (failure) {
    try {
      session.wait(id); // its memory is the op's until this returns
    } catch {
      // the rank's own failure is the error that matters
    }
    throw failure;
  }
  let out: ArrayBuffer | undefined;
  try {
    out = session.wait(id);
  } catch (e) {
    runner.fail(e);
  }
  runner.inflight({ type: 'COMPLETED', kind });
  return out;
}

export class RankSession {
  private closed = false;
  private pending = 0;
  /** views a collective in flight writes (its result; its input gathered in place): no input until its wait */
  private readonly busy = new Map<object, number>();
  private readonly deviceViews: SessionDeviceView[] = [];
  private readonly W: number;
  private readonly cuda: boolean;
  private window: bigint | undefined;

  /** the views this session handed out: offsetOf answers for these only */
  private readonly mine = new WeakSet<object>();

  constructor(private readonly ops: RankOps, readonly maxBytes: number, readonly maxAllGathers: number) {
    this.W = ops.init.worldSize;
    this.cuda = ops.init.backend === 'cuda';
    let open = openSessions.get(ops);
    if (!open) openSessions.set(ops, (open = new Set()));
    open.add(this);
  }

  /** @internal the group's recovery closed the session natively (forgetAfterRecovery) */
  closedByRecovery(): void {
    this.closed = true;
    this.pending = 0;
    this.busy.clear();
    for (const v of this.deviceViews.splice(0)) v.revoke('this tensor is a view of an AGRS session closed when the group recovered from a released run');
  }

  /** A tensor in the session's buffer (my slot of a region of its own; one of the session's maxAllGathers). */
  tensor<D extends DType>(dtype: D, shape: number[]): SessionTensor<D> {
    this.checkOpen('tensor');
    if (!isDType(dtype)) throw invalid('dtype', `must be one of ${Object.keys(ELEMENT_BYTES).join(', ')}`);
    if (!Array.isArray(shape) || shape.some((d) => !Number.isInteger(d) || d < 0)) throw invalid('shape', 'must be a list of non-negative integers');
    const bytes = numel(shape) * ELEMENT_BYTES[dtype];
    if (bytes === 0) throw invalid('shape', 'a session tensor needs at least one element');
    if (bytes > this.maxBytes) throw invalid('shape', `[${shape.join(', ')}] ${dtype} is ${bytes} bytes; the session's maxBytes is ${this.maxBytes}`);
    if (!this.ops.runner.state().startsWith('session.')) throw new RankflowError('STATE', `rank ${this.ops.init.rank} is in state '${this.ops.runner.state()}': no session to hold a tensor`);
    return this.view(dtype, shape, this.ops.session.region(bytes));
  }

  /** allGather: [W * n, ...] in rank order. { async: true }: { result, wait() } at once (no local copy of a session tensor). */
  allGather<D extends DType>(t: Tensor<D> | DeviceTensor<D>, opts: AsyncOptions & { async: true }): InFlightCollective<SessionTensor<D>>;
  allGather<D extends DType>(t: DeviceTensor<D>, opts?: AsyncOptions): Promise<DeviceTensor<D>>;
  allGather<D extends DType>(t: Tensor<D>, opts?: AsyncOptions): Promise<Tensor<D>>;
  allGather(t: AnyTensor, opts?: AsyncOptions): InFlightCollective<SessionTensor> | Promise<AnyTensor> {
    if (checkAsyncOptions(opts)) return this.collective('gather', t, true) as InFlightCollective<SessionTensor>;
    return (async () => this.syncCollective('gather', t))();
  }

  /** reduceScatter of [W * n, ...] fp32|bf16: my [n, ...] fp32-accumulated sums. { async: true } as allGather. */
  reduceScatter<D extends DType>(t: Tensor<D> | DeviceTensor<D>, opts: AsyncOptions & { async: true }): InFlightCollective<SessionTensor<D>>;
  reduceScatter<D extends DType>(t: DeviceTensor<D>, opts?: AsyncOptions): Promise<DeviceTensor<D>>;
  reduceScatter<D extends DType>(t: Tensor<D>, opts?: AsyncOptions): Promise<Tensor<D>>;
  reduceScatter(t: AnyTensor, opts?: AsyncOptions): InFlightCollective<SessionTensor> | Promise<AnyTensor> {
    if (checkAsyncOptions(opts)) return this.collective('reduce', t, true) as InFlightCollective<SessionTensor>;
    return (async () => this.syncCollective('reduce', t))();
  }

  /** The byte offset of a session tensor or result in the rank's window: the same offset in every peer's window. */
  offsetOf(t: AnyTensor): number {
    const key = isDeviceTensor(t) ? t : ArrayBuffer.isView((t as Tensor)?.data) ? (t as Tensor).data.buffer : undefined;
    const at = key !== undefined ? viewOffsets.get(key) : undefined;
    if (at === undefined) throw invalid('tensor', "is not a view of a session's buffer (s.tensor() or a collective's result)");
    // Another session's view names memory this one may reuse: its offset would be stale.
    if (!this.mine.has(key!)) throw new RankflowError('STATE', "offsetOf: the tensor is a view of another AGRS session's buffer (a closed one's memory is reused)");
    this.checkOpen('offsetOf');
    return at + (isDeviceTensor(t) ? 0 : (t as Tensor).data.byteOffset);
  }

  async close(): Promise<void> {
    if (this.closed) throw new RankflowError('STATE', 'this AGRS session is closed');
    if (this.pending > 0) throw new RankflowError('STATE', `close(): ${this.pending} collective(s) of this session are in flight: wait() for them first`);
    this.ops.sessionClose(); // natively: host views detached
    this.closed = true;
    openSessions.get(this.ops)?.delete(this);
    for (const v of this.deviceViews.splice(0)) v.revoke('this tensor is a view of a closed AGRS session (the next session reuses its memory)');
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.closed && this.pending === 0) await this.close();
  }

  private checkOpen(what: string): void {
    if (this.closed) throw new RankflowError('STATE', `${what}: this AGRS session is closed`);
  }

  private checkInput(kind: 'gather' | 'reduce', t: AnyTensor): { arg: ArrayBufferView | bigint; size: number; bf16: boolean; shape: number[] } {
    const name = 'input';
    if (isDeviceTensor(t)) {
      if (!this.cuda) throw invalid(name, "device tensors need backend 'cuda'");
      if (kind === 'reduce' && t.dtype !== 'fp32' && t.dtype !== 'bf16') throw invalid(`${name}.dtype`, `must be fp32 or bf16 (got ${t.dtype})`);
    } else {
      if (t !== null && typeof t === 'object' && ArrayBuffer.isView((t as Tensor).data) && (t as Tensor).data.buffer.byteLength === 0 && numel((t as Tensor).shape ?? []) > 0)
        throw new RankflowError('STATE', `${name}: its memory is gone (a view of a closed AGRS session, or a transferred buffer)`);
      checkTensor(name, t, kind === 'reduce' ? { dtypes: ['fp32', 'bf16'] } : {});
    }
    const shape = t.shape;
    const elems = numel(shape);
    if (kind === 'gather') return { arg: isDeviceTensor(t) ? t.ptr : t.data, size: elems * ELEMENT_BYTES[t.dtype], bf16: false, shape: [this.W * (shape[0] ?? 1), ...shape.slice(1)] };
    if (shape.length < 1 || shape[0]! % this.W !== 0) throw invalid(`${name}.shape[0]`, `must be a multiple of the world size (${this.W})`);
    return { arg: isDeviceTensor(t) ? t.ptr : t.data, size: elems / this.W, bf16: t.dtype === 'bf16', shape: [shape[0]! / this.W, ...shape.slice(1)] };
  }

  private async syncCollective(kind: 'gather' | 'reduce', t: AnyTensor): Promise<AnyTensor> {
    this.checkOpen(kind === 'gather' ? 'allGather' : 'reduceScatter');
    // Session tensors (and their results) stay in the buffer: a view comes back, no copy either way.
    if (isDeviceTensor(t) ? t instanceof SessionDeviceView : this.isHostView(t)) return this.collective(kind, t, false) as SessionTensor;
    // Otherwise copied in, and out into a tensor of the result's shape (a device tensor of its own on cuda).
    this.checkInput(kind, t);
    return kind === 'gather' ? this.ops.sessionAllGather(t) : this.ops.sessionReduceScatter(t);
  }

  /** The op through the machine: its event in, the native issue, then ISSUED (async) or the wait and DONE. */
  private collective(kind: 'gather' | 'reduce', t: AnyTensor, async: boolean): InFlightCollective<SessionTensor> | SessionTensor {
    const what = kind === 'gather' ? 'allGather' : 'reduceScatter';
    this.checkOpen(what);
    const { runner, session } = this.ops;
    if (this.ops.capturing) throw new RankflowError('STATE', `${what}: session collectives cannot be captured into a graph`);
    const { arg, size, bf16, shape } = this.checkInput(kind, t);
    // Refused here, before the machine: natively this is a STATE that would fail the rank.
    if (this.busy.has(this.keyOf(t)))
      throw new RankflowError('STATE', `${what}: its input lies in the region a collective in flight is still writing: wait() for it first`);
    runner.enter(kind === 'gather' ? EVENTS.sessionAllGather : EVENTS.sessionReduceScatter);
    let id = 0, at = 0;
    try {
      [id, at] = session.issue(kind === 'reduce', arg, size, bf16);
    } catch (e) {
      runner.fail(e);
    }
    const result = this.view(t.dtype, shape, at);
    if (!async) {
      try {
        session.wait(id);
      } catch (e) {
        runner.fail(e);
      }
      runner.done();
      return result;
    }
    runner.inflight({ type: 'ISSUED', kind });
    this.pending++;
    // What it writes: its result, and the tensor it gathers in place (the same region).
    const writes = [this.keyOf(result)];
    if (kind === 'gather' && viewOffsets.has(this.keyOf(t)) && this.offsetOf(t) === at + this.ops.init.rank * size) writes.push(this.keyOf(t));
    for (const k of writes) this.busy.set(k, (this.busy.get(k) ?? 0) + 1);
    let waited = false;
    const since = recoveriesOf(this.ops);
    return {
      result,
      wait: async () => {
        if (waited) throw new RankflowError('STATE', `wait(): this ${what} was waited for already (wait() once)`);
        checkNotRecovered(this.ops, since, what);
        waited = true;
        this.pending--;
        for (const k of writes) {
          const n = (this.busy.get(k) ?? 1) - 1;
          if (n > 0) this.busy.set(k, n);
          else this.busy.delete(k);
        }
        finish(this.ops, id, kind);
        return result;
      },
    };
  }

  /** What identifies a view's memory: its ArrayBuffer (host; subarrays share it), the view itself (cuda). */
  private keyOf(t: AnyTensor): object {
    return isDeviceTensor(t) ? t : (t as Tensor).data.buffer;
  }

  private isHostView(t: AnyTensor): boolean {
    const data = (t as Tensor)?.data;
    return !this.cuda && ArrayBuffer.isView(data) && hostViews.has(data.buffer);
  }

  /** A view of `shape` at window offset `offset`: host, a tensor over the mapped window; cuda, a device tensor there. */
  private view<D extends DType>(dtype: D, shape: number[], offset: number): SessionTensor<D> {
    const bytes = numel(shape) * ELEMENT_BYTES[dtype];
    const { session } = this.ops;
    if (!this.cuda) {
      const ab = session.hostView(offset, bytes);
      hostViews.add(ab);
      viewOffsets.set(ab, offset);
      this.mine.add(ab);
      return fromBytes(dtype, shape, new Uint8Array(ab)) as SessionTensor<D>;
    }
    this.window ??= session.window();
    const v = session.deviceView(dtype, shape, this.window + BigInt(offset));
    this.deviceViews.push(v);
    viewOffsets.set(v, offset);
    this.mine.add(v);
    return v as unknown as SessionTensor<D>;
  }
}

/** The ArrayBuffers of host session views (detached natively when their session closes). */
const hostViews = new WeakSet<ArrayBufferLike>();
/** Window offsets of views: host, by ArrayBuffer; cuda, by device tensor. */
const viewOffsets = new WeakMap<object, number>();

/** rank.openSession: every rank enters the session state (collective), then gets its handle. */
export function openRankSession(ops: RankOps, opts: { maxBytes: number; maxAllGathers: number }): RankSession {
  if (opts === null || typeof opts !== 'object' || Array.isArray(opts)) throw invalid('options', 'must be an object { maxBytes, maxAllGathers }');
  checkKnownKeys('options', opts, ['maxBytes', 'maxAllGathers']);
  checkPositiveInt('maxBytes', opts.maxBytes);
  checkPositiveInt('maxAllGathers', opts.maxAllGathers, 1 << 16);
  refuseWhileFetching(ops, 'openSession');
  ops.sessionOpen(opts.maxBytes, opts.maxAllGathers);
  return new RankSession(ops, opts.maxBytes, opts.maxAllGathers);
}

/**
 * rank.engramFetch(ids, { async: true }): the fetch starts now (host: on the rank's fetch thread;
 * cuda: on its stream); wait() gives the rows: a host tensor, or on cuda a device tensor of its own.
 */
export function engramFetchAsync(ops: RankOps, ids: Int32Array): PendingFetch<Tensor | DeviceTensor> {
  const { runner, session } = ops;
  if (ops.capturing) throw new RankflowError('STATE', 'engramFetch: an asynchronous fetch cannot be captured into a graph');
  const inFlight = fetchesInFlight.get(ops) ?? 0;
  if (inFlight >= MAX_FETCHES_IN_FLIGHT)
    throw new RankflowError('STATE', `engramFetch: ${inFlight} fetches are in flight already (at most ${MAX_FETCHES_IN_FLIGHT}): wait() for one first`);
  const meta = ops.engram;
  if (!meta) throw new RankflowError('STATE', 'engramFetch before engramWrite: no table is stored');
  runner.enter(EVENTS.engramFetch);
  let id = 0, ptr = 0n;
  try {
    [id, ptr] = session.fetchIssue(ids);
  } catch (e) {
    runner.fail(e);
  }
  runner.inflight({ type: 'ISSUED', kind: 'fetch' });
  fetchesInFlight.set(ops, (fetchesInFlight.get(ops) ?? 0) + 1);
  const shape = [ids.length, ...meta.rowShape];
  let waited = false;
  const since = recoveriesOf(ops);
  return {
    wait: async () => {
      if (waited) throw new RankflowError('STATE', 'wait(): this engramFetch was waited for already (wait() once)');
      checkNotRecovered(ops, since, 'engramFetch');
      waited = true;
      fetchesInFlight.set(ops, (fetchesInFlight.get(ops) ?? 1) - 1);
      const owned = ops.init.backend === 'cuda' ? session.fetchedRows(meta.dtype, shape, ptr) : null;
      let rows: ArrayBuffer | undefined;
      try {
        rows = finish(ops, id, 'fetch');
      } catch (e) {
        owned?.free();
        throw e;
      }
      return owned ?? fromBytes(meta.dtype, shape, new Uint8Array(rows!));
    },
  };
}
