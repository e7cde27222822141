// The worker of one rank: it owns the rank's native context and its xstate actor, serves the main
// thread's requests through comlink, reports every transition on the same port (so a reply never
// overtakes the transition that preceded it), and runs rank programs with no thread hop.
import { parentPort, workerData } from 'node:worker_threads';
import { pathToFileURL } from 'node:url';
import * as Comlink from 'comlink/dist/esm/comlink.mjs';
import nodeEndpoint from 'comlink/dist/esm/node-adapter.mjs';
import { createActor, type InspectionEvent } from 'xstate';

import { rankMachine, statePath, type FailureInfo, type PhaseName, type RankEvent } from '../machines/index.js';
import { loadAddon, type ExportedSegments, type NativeContext } from '../actors/core/addon.js';
import { RankflowError } from '../actors/core/errors.js';
import { installErrorTransfer } from '../actors/core/comlink-errors.js';
import { RankOps, type RankInit } from './ops.js';
import { REPORT_BATCH_MS, type WorkerMessage } from './protocol.js';

if (!parentPort) throw new Error('workers/rank.js must run in a worker thread');
const port = parentPort;
installErrorTransfer();
const init = workerData as RankInit;

// comlink sends only the message, name and stack of a thrown Error: keep rankflow's code, rank, state
// and phase too, or the main thread sees every failure of this rank as a plain error.
const throwHandler = Comlink.transferHandlers.get('throw')!;
Comlink.transferHandlers.set('throw', {
  ...throwHandler,
  serialize(thrown: unknown) {
    const [wire, transfer] = throwHandler.serialize(thrown);
    const error = (thrown as { value?: unknown }).value as Partial<RankflowError> | undefined;
    const value = (wire as { isError?: boolean; value?: Record<string, unknown> }).value;
    if ((wire as { isError?: boolean }).isError && value && error) {
      for (const k of ['code', 'rank', 'state', 'phase'] as const) if (error[k] !== undefined) value[k] = error[k];
    }
    return [wire, transfer];
  },
});

const now = (): number => performance.timeOrigin + performance.now();
// Reports to the main thread are batched for up to REPORT_BATCH_MS: a post per transition cost a
// rank program more than the machine itself. Every comlink reply flushes the batch first (see the
// endpoint below), so a reply still never overtakes the transitions that preceded it.
const outbox: WorkerMessage[] = [];
let flushTimer: ReturnType<typeof setTimeout> | undefined;
const flush = (): void => {
  if (flushTimer !== undefined) clearTimeout(flushTimer);
  flushTimer = undefined;
  if (outbox.length === 0) return;
  const batch = outbox.splice(0);
  port.postMessage(batch.length === 1 ? batch[0] : { kind: 'batch', messages: batch });
};
const post = (m: WorkerMessage): void => {
  outbox.push(m);
  flushTimer ??= setTimeout(flush, REPORT_BATCH_MS);
};

/** Requests in flight, by call id: what a phase needs, and how to answer. */
interface Pending {
  resolve: (v: unknown) => void;
  reject: (e: unknown) => void;
  phases: Partial<Record<string, () => Promise<unknown>>>;
}
const pending = new Map<number, Pending>();
let nextCall = 1;

const addon = loadAddon();
const native: NativeContext = new addon.Context({
  backend: init.backend,
  ...(init.device !== undefined ? { device: init.device } : {}),
  rank: init.rank,
  worldSize: init.worldSize,
  ranksPerNode: init.ranksPerNode,
  ...init.buffer,
  cpuSeconds: init.cpuSeconds,
  gpuSeconds: init.gpuSeconds,
});

// Entering a phase state starts the phase function the request registered under that phase's name;
// its settling is sent back as PHASE_DONE / PHASE_FAILED naming the call and the phase, which the
// state takes only while it still serves that call (a late answer after a backstop moves nothing).
function startPhase(call: number, phase: PhaseName): void {
  const fn = pending.get(call)?.phases[phase];
  let settled: Promise<unknown>;
  if (!fn) {
    settled = Promise.reject(new RankflowError('STATE', `rank ${init.rank}: no request ${call} for phase ${phase}`));
  } else {
    try {
      settled = fn();
    } catch (e) {
      settled = Promise.reject(e);
    }
  }
  // A stopped actor (destroyed) takes nothing: a phase abandoned before that has no one to tell.
  const send = (e: RankEvent): void => {
    if (actor.getSnapshot().status === 'active') actor.send(e);
  };
  settled.then(
    (output) => send({ type: 'PHASE_DONE', call, phase, output }),
    (error: unknown) => send({ type: 'PHASE_FAILED', call, phase, error }),
  );
}

const machine = rankMachine.provide({
  actions: {
    startPhase: ({ context }, { phase }) => startPhase(context.call!, phase),
    reply: (_, { call, output }) => {
      const p = pending.get(call);
      pending.delete(call);
      p?.resolve(output);
    },
    replyError: (_, { call, error }) => {
      const p = pending.get(call);
      pending.delete(call);
      p?.reject(RankflowError.from(error));
    },
  },
});

let lastPath = 'init';
const inspect = (rec: InspectionEvent): void => {
  if (init.inspect) post({ kind: 'inspect', record: plainInspection(rec) });
  if (rec.type !== '@xstate.snapshot' || rec.actorRef !== actor) return;
  const snap = actor.getSnapshot();
  const to = statePath(snap.value);
  if (to === lastPath) return;
  const from = lastPath;
  lastPath = to;
  const error = snap.context.error;
  post({
    kind: 'transition',
    transition: {
      rank: init.rank, from, to, event: rec.event.type, at: now(),
      ...(snap.context.op ? { op: snap.context.op } : {}),
      seq: snap.context.seq,
      ...(to === 'failed' && error ? { phase: error.phase ?? error.state, error } : {}),
    },
  });
};

const actor = createActor(machine, { input: { rank: init.rank, cpuSeconds: init.cpuSeconds, gpuSeconds: init.gpuSeconds }, inspect });
actor.start();

function plainInspection(rec: InspectionEvent): Record<string, unknown> {
  const out: Record<string, unknown> = { type: rec.type, rank: init.rank, actorId: (rec.actorRef as { id?: string }).id, sessionId: rec.actorRef.sessionId, at: now() };
  if ('event' in rec && rec.event) out.event = plainEvent(rec.event as { type: string });
  if (rec.type === '@xstate.snapshot') {
    const s = rec.snapshot as { value?: unknown; status?: string };
    out.value = s.value;
    out.status = s.status;
  }
  if (rec.type === '@xstate.action') out.action = { type: rec.action.type };
  return out;
}
function plainEvent(e: { type: string }): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(e)) if (v === null || ['string', 'number', 'boolean'].includes(typeof v)) o[k] = v;
  return o;
}

/** The rank's state machine decides: a request it cannot take now is refused with STATE. */
function request<T>(event: RankEvent & { call: number }, phases: Pending['phases']): Promise<T> {
  const snap = actor.getSnapshot();
  const state = statePath(snap.value);
  // A failed rank answers every request with its failure, except DESTROY: it still tears down in order.
  if (state === 'failed' && snap.context.error && event.type !== 'DESTROY') {
    const e = snap.context.error;
    return Promise.reject(new RankflowError(e.code as never, e.message, { rank: e.rank, state: 'failed', phase: e.phase }));
  }
  if (!snap.can(event)) {
    return Promise.reject(new RankflowError('STATE', `rank ${init.rank} is in state '${state}' and cannot take ${event.type}`, { rank: init.rank, state }));
  }
  return new Promise<T>((resolve, reject) => {
    pending.set(event.call, { resolve: resolve as (v: unknown) => void, reject, phases });
    actor.send(event);
  });
}
const newCall = (): number => nextCall++;

const ops = new RankOps(init, native, request, newCall, () => actor.getSnapshot().context.seq);

const api = {
  exported(): ExportedSegments {
    return native.exported();
  },
  info() {
    return { ...native.info(), state: lastPath };
  },
  ncclUniqueId(): Promise<Uint8Array | null> {
    return native.ncclUniqueId();
  },
  ncclInit(id: Uint8Array): Promise<void> {
    return native.ncclInit(id);
  },
  async register(peers: Array<{ deviceFd: number; hostFd: number }>): Promise<void> {
    const call = newCall();
    await request({ type: 'REGISTER', call }, { registerWindow: () => native.importPeers(peers) });
  },
  /** A peer is gone: pending and later collectives fail with RANK_FAILED naming it. */
  peerFailed(rank: number, error: FailureInfo): void {
    native.failPeer(rank);
    actor.send({ type: 'PEER_FAILED', error });
  },
  state(): string {
    return lastPath;
  },
  /** Writes through this rank's translated pointer into `peer`'s window (layout tests). */
  writePeer(peer: number, offset: number, bytes: Uint8Array): bigint {
    return native.writePeer(peer, offset, bytes);
  },
  readWindow(offset: number, length: number): Uint8Array {
    return native.readWindow(offset, length);
  },
  async run(moduleUrl: string, args: unknown): Promise<unknown> {
    const url = moduleUrl.startsWith('file:') || moduleUrl.includes('://') ? moduleUrl : pathToFileURL(moduleUrl).href;
    const mod = (await import(url)) as { default?: (rank: unknown, args: unknown) => unknown };
    if (typeof mod.default !== 'function') throw new RankflowError('EINVAL', `moduleUrl: ${moduleUrl} has no default export function (rank, args)`);
    return mod.default(ops.programHandle(), args);
  },
  async destroy(): Promise<void> {
    const state = lastPath;
    if (state === 'destroyed') return;
    const call = newCall();
    await request({ type: 'DESTROY', call }, { destroy: async () => native.destroy() }).catch((e: unknown) => {
      // A rank that cannot take DESTROY now (mid-operation) is torn down anyway: memory is freed below.
      if ((e as RankflowError).code !== 'STATE') throw e;
    });
    native.destroy();
    actor.stop();
  },
  ...ops.driverApi(),
};

export type RankWorkerApi = typeof api;
const endpoint = nodeEndpoint(port);
Comlink.expose(api, {
  ...endpoint,
  postMessage: (message: unknown, transfer?: Parameters<typeof endpoint.postMessage>[1]) => {
    flush();
    endpoint.postMessage(message, transfer);
  },
});
post({ kind: 'started', rank: init.rank });
