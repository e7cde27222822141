// The worker of one rank: it makes the rank's native context (its CUDA context, on cuda, is current
// on this thread), the runner (machine + reports) and the op table, serves the main thread's calls
// through comlink (one round trip per op), and runs rank programs with no thread hop. Every reply
// flushes the batched reports first, so a reply never overtakes the transitions before it.
import { parentPort, workerData } from 'node:worker_threads';
import { pathToFileURL } from 'node:url';
import * as Comlink from 'comlink/dist/esm/comlink.mjs';
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs';

import type { FailureInfo } from '../machines/index.js';
import { loadAddon, type ExportedSegments } from '../actors/core/addon.js';
import { RankflowError } from '../actors/core/errors.js';
import { installErrorTransfer } from '../actors/core/comlink-errors.js';
import type { Tensor } from '../actors/core/tensor.js';
import type { CombineInput, DispatchInput } from '../actors/core/validate.js';
import { RankOps } from './ops/index.js';
import { programHandle } from './program.js';
import { forgetAfterRecovery } from './session-views.js';
import type { Membership, RankInit, RankPosition, RunOutcome } from './protocol.js';
import { thrownOf, type ThrownValue } from '../actors/core/thrown.js';
import { RankRunner } from './runner.js';
import { RunAborts } from './run-abort.js';

if (!parentPort) throw new Error('workers/rank.js must run in a worker thread');
const port = parentPort;
installErrorTransfer();
const init = workerData as RankInit;

const addon = loadAddon();
// The rank's native context, handed to the op table (workers/ops/), which makes every call on it.
const native = new addon.Context({
  backend: init.backend,
  ...(init.device !== undefined ? { device: init.device } : {}),
  ...(init.deviceShare !== undefined ? { deviceShare: init.deviceShare } : {}),
  ...(init.nccl !== undefined ? { nccl: init.nccl } : {}),
  rank: init.rank,
  worldSize: init.worldSize,
  ranksPerNode: init.ranksPerNode,
  ...(init.scaleOut ? { scaleOut: true } : {}),
  ...init.buffer,
  cpuSeconds: init.cpuSeconds,
  gpuSeconds: init.gpuSeconds,
  ceMinBytes: init.tuning.ceMinBytes,
  cooperative: init.tuning.cooperative,
  graphLaunch: init.tuning.graphLaunch,
  fusedDispatch: init.tuning.fusedDispatch,
  ...(init.tuning.ncclHome ? { ncclHome: init.tuning.ncclHome } : {}),
  ...(init.tuning.ncclHostId ? { ncclHostId: init.tuning.ncclHostId } : {}),
  ...(init.firstSeq ? { firstSeq: init.firstSeq } : {}),
}, new Int32Array(init.abort));

const runner = new RankRunner(init.rank, {
  cpuSeconds: init.cpuSeconds, gpuSeconds: init.gpuSeconds, firstSeq: init.firstSeq ?? 0, ...(init.elastic ? { elastic: true } : {}),
  // not on cuda (a wait that timed out ends the waiter's protocol state: CudaBackend::mark_dead), nor in a world
  blamesTimeouts: init.blamesTimeouts === true,
}, port, init.inspect);
const ops = new RankOps(init, native, runner);
const { lifecycle } = ops;
if (init.traffic) lifecycle.trafficWords(new BigUint64Array(init.traffic));
runner.nativeSeq = () => lifecycle.seq();
const runs = new RunAborts(new Int32Array(init.runAbort));
// A wait that lasts: the main thread sees the rank's state while its thread is blocked in the op.
lifecycle.onSlowWait(() => runner.flush());

const buffersOf = (...arrays: Array<ArrayBufferView | undefined>): ArrayBuffer[] =>
  [...new Set(arrays.filter((a): a is ArrayBufferView => a !== undefined).map((a) => a.buffer as ArrayBuffer))];

const api = {
  exported(): ExportedSegments {
    return lifecycle.exported();
  },
  info() {
    return { ...lifecycle.info(), state: runner.state() };
  },
  ncclUniqueId(): Uint8Array | null {
    return lifecycle.ncclUniqueId();
  },
  ncclInit(id: Uint8Array): void {
    lifecycle.ncclInit(id);
  },
  register(peers: Array<{ deviceFd: number; hostFd: number }>): void {
    // A replacement takes the group's membership first: its registration's barrier is among those ranks.
    if (init.membership) lifecycle.startIn(init.membership);
    ops.register(peers);
    runner.alignSeq();
  },
  /** A world that spans nodes: the rank's scale-out listener, then its connections (before register). */
  scaleoutListen(host: string): number {
    return lifecycle.scaleoutListen(host);
  },
  scaleoutConnect(endpoints: Array<{ host: string; port: number }>, key: Uint8Array, timeoutMs: number): void {
    lifecycle.scaleoutConnect(endpoints, key, timeoutMs);
  },
  /** Elastic: a peer left (the main thread already raised the left word): the machine masks it. */
  peerLeft(error: FailureInfo): void {
    runner.peerLeft(error);
  },
  /** Elastic: the group goes on with `m`'s ranks, in step at the group's seq and session count (ops/membership.cc). */
  remask(seq: number, m: Membership): void {
    lifecycle.remask(seq, m);
    forgetAfterRecovery(ops);
  },
  /** Elastic: rank `peer`'s replacement joins (its window mapped, a barrier with it). */
  rejoin(peer: number | number[], segments: { deviceFd: number; hostFd: number } | Array<{ deviceFd: number; hostFd: number }>, m: Membership): void {
    lifecycle.rejoin(peer, segments, m);
  },
  /** A peer is gone (the main thread already raised the abort words): the machine records it. */
  peerFailed(error: FailureInfo): void {
    runner.peerFailed(error);
  },
  state(): string {
    return runner.state();
  },
  /** entries per rank of the engram table this rank stores (written in driver mode or by a rank program), -1 if none */
  engramEntries(): number {
    return ops.engramEntries;
  },
  /** Layout probes (tests): through this rank's translated pointer into `peer`'s window. */
  writePeer(peer: number, offset: number, bytes: Uint8Array): bigint {
    return lifecycle.writePeer(peer, offset, bytes);
  },
  readWindow(offset: number, length: number): Uint8Array {
    return lifecycle.readWindow(offset, length);
  },
  /**
   * Runs the program; how it ended (its value, or what it threw) and where the rank stands then: the
   * group decides from every rank's outcome whether the run released anyone and must re-synchronise.
   * runId: the group's number for this run, written to the runAbort word when it is aborted.
   */
  async run(moduleUrl: string, args: unknown, runId: number): Promise<RunOutcome> {
    let ended: { ok: true; value: unknown } | { ok: false; thrown: ThrownValue };
    try {
      const url = moduleUrl.startsWith('file:') || moduleUrl.includes('://') ? moduleUrl : pathToFileURL(moduleUrl).href;
      const mod = (await import(url)) as { default?: (rank: unknown, args: unknown) => unknown };
      if (typeof mod.default !== 'function') throw new RankflowError('EINVAL', `moduleUrl: ${moduleUrl} has no default export function (rank, args)`);
      const state = runs.begin(runId);
      try {
        ended = { ok: true, value: await mod.default(programHandle(ops, state), args) };
      } finally {
        runs.end(state);
      }
    } catch (e) {
      ended = { ok: false, thrown: thrownOf(e) };
    }
    return { ...ended, ...api.position() };
  },
  /** Where the rank stands (its seq, sessions and state); seq -1 once its context is destroyed. */
  position(): RankPosition {
    try {
      return { seq: lifecycle.seq(), sessions: lifecycle.sessionCount(), state: runner.state() };
    } catch {
      return { seq: -1, sessions: -1, state: runner.state() };
    }
  },
  /** After a released run, the rank in step with the group: `seq` and `sessions` are the group's (ops/recover.cc). */
  recover(seq: number, sessions: number): void {
    lifecycle.recover(seq, sessions);
    forgetAfterRecovery(ops);
  },
  abortRun(runId: number, reason: string): void {
    runs.abort(runId, reason);
  },
  destroy(): void {
    if (runner.state() === 'destroyed') return;
    lifecycle.destroy();
    runner.flush();
    runner.stop();
  },
  // driver mode: inputs were checked on the main thread; results are transferred, not copied
  barrier: (withCpuSync: boolean) => ops.barrier(withCpuSync),
  allGather: (t: Tensor) => {
    const r = ops.allGather(t) as Tensor;
    return Comlink.transfer(r, buffersOf(r.data));
  },
  allReduce: (t: Tensor) => {
    const r = ops.allReduce(t, false) as Tensor;
    return Comlink.transfer(r, buffersOf(r.data));
  },
  dispatch: (d: DispatchInput) => {
    const r = ops.dispatch(d);
    return Comlink.transfer(r, buffersOf(r.x.data, r.scales?.data, r.topkIdx, r.topkWeights, r.srcRank, r.srcToken));
  },
  combine: (c: CombineInput, bias: Tensor[]) => {
    const r = ops.combine(c, bias);
    return Comlink.transfer(r, buffersOf(r.x.data, r.topkWeights));
  },
  sessionOpen: (maxBytes: number, maxAllGathers: number) => ops.sessionOpen(maxBytes, maxAllGathers),
  sessionAllGather: (t: Tensor) => {
    const r = ops.sessionAllGather(t) as Tensor;
    return Comlink.transfer(r, buffersOf(r.data));
  },
  sessionReduceScatter: (t: Tensor) => {
    const r = ops.sessionReduceScatter(t) as Tensor;
    return Comlink.transfer(r, buffersOf(r.data));
  },
  sessionClose: () => ops.sessionClose(),
  engramWrite: (t: Tensor) => ops.engramWrite(t),
  engramFetch: (ids: Int32Array) => {
    const r = ops.engramFetch(ids);
    return Comlink.transfer(r, buffersOf(r.data));
  },
  ppExchange: (t: Tensor) => {
    const r = ops.ppExchange(t);
    return Comlink.transfer(r, buffersOf(r.data));
  },
};

export type RankWorkerApi = typeof api;
const endpoint = nodeEndpoint(port);
Comlink.expose(api, {
  ...endpoint,
  postMessage: (message: unknown, transfer?: Parameters<typeof endpoint.postMessage>[1]) => {
    runner.flush();
    endpoint.postMessage(message, transfer);
  },
});
runner.post({ kind: 'started', rank: init.rank, abortOffset: lifecycle.abortOffset });
runner.flush();
