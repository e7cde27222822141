// A group spread over several processes (API.md "More than one process"): the processes meet at a
// TCP rendezvous (authenticated by the world's token), check that they describe the same world,
// and hand each other the fds of their ranks' symmetric segments over Unix sockets (SCM_RIGHTS;
// served only to the pids of the world's table), so every rank can map every peer.
import { randomUUID } from 'node:crypto';

import { RankflowError, invalid } from '../core/errors.js';
import { abortError } from '../core/abort.js';
import { config as env } from '../core/config.js';
import { loadAddon, type ExportedSegments } from '../core/addon.js';
import { isLoopbackHost, tokenProblem } from './auth.js';
import { hostId } from './host-id.js';
import { isText } from './protocol.js';
import { nodeIdProblem, parseRendezvousUrl, rendezvous, type Rendezvous, type RendezvousPeer } from './rendezvous.js';

export interface WorldOptions {
  /** ranks in the whole world, over all processes */
  size: number;
  /** global id of this process's first rank */
  rankOffset: number;
  /** 'tcp://host:port': the process with rankOffset 0 listens there */
  rendezvous: string;
  /** the world's shared secret (default RANKFLOW_WORLD_TOKEN); required unless the rendezvous is on loopback */
  token?: string;
  /** which node this process is on (default: this host's id, host-id.ts) */
  nodeId?: string;
}

/** The world options checked, with the token and nodeId defaults filled in. */
export function checkWorld(w: unknown, localRanks: number): WorldOptions {
  if (w === null || typeof w !== 'object') throw invalid('world', 'must be { size, rankOffset, rendezvous, token?, nodeId? }');
  const { size, rankOffset, rendezvous: url, token: given, nodeId: named } = w as WorldOptions;
  if (!Number.isInteger(size) || size < 1 || size > 64) throw invalid('world.size', `must be an integer in [1, 64] (got ${String(size)})`);
  if (!Number.isInteger(rankOffset) || rankOffset < 0 || rankOffset + localRanks > size)
    throw invalid('world.rankOffset', `(${String(rankOffset)}) + ranks (${localRanks}) must fit in world.size (${size})`);
  const at = parseRendezvousUrl(url);
  if (at === undefined) throw invalid('world.rendezvous', `must be 'tcp://host:port' (got ${String(url)})`);
  const token = given ?? env.worldToken;
  if (token !== undefined) {
    const problem = tokenProblem(token);
    if (problem) throw invalid(given !== undefined ? 'world.token' : 'RANKFLOW_WORLD_TOKEN', problem);
  } else if (!isLoopbackHost(at.host)) {
    throw invalid(
      'world.token',
      `is required: the rendezvous ${String(url)} is not a loopback address, so any machine that reaches it could join the world; ` +
        'set world.token (or RANKFLOW_WORLD_TOKEN) to the same secret in every process, e.g. the output of `openssl rand -hex 32`',
    );
  }
  const nodeId = named ?? hostId();
  const problem = nodeIdProblem(nodeId);
  if (problem) throw invalid('world.nodeId', problem);
  return { size, rankOffset, rendezvous: url, nodeId, ...(token !== undefined ? { token } : {}) };
}

/**
 * How long a process waits for its world (the rendezvous, the fd exchange): timeouts.cpuSeconds
 * when the caller gave it, otherwise RANKFLOW_RENDEZVOUS_TIMEOUT (default 60 s).
 */
export function worldWaitMs(cpuSeconds: number | undefined): number {
  if (cpuSeconds !== undefined) return cpuSeconds * 1000;
  if (!(env.rendezvousSeconds > 0) || !Number.isFinite(env.rendezvousSeconds))
    throw invalid('RANKFLOW_RENDEZVOUS_TIMEOUT', `must be a number of seconds > 0 (got ${env.rendezvousSeconds})`);
  return env.rendezvousSeconds * 1000;
}

export interface JoinedWorld {
  /** every rank's segments, in global rank order, as fds valid in this process */
  peers: Array<{ deviceFd: number; hostFd: number }>;
  /** fds received from other processes: close them once the local ranks have mapped them */
  received: number[];
  rv: Rendezvous;
}

interface Payload { fdSocket: string; config: string; withHost: boolean; gpus: string[] }

// The names joinWorld gives its fd sockets: abstract, and nothing else (a peer's payload is data).
const FD_SOCKET = /^@rankflow-\d+-[0-9a-f]{8}$/;
const GPU_UUID = /^GPU-[0-9a-f-]{36}$/;

function payloadOf(p: RendezvousPeer): Payload {
  const { fdSocket, config, withHost, gpus } = p.payload;
  if (typeof fdSocket !== 'string' || !FD_SOCKET.test(fdSocket) || !isText(config, 8192) || typeof withHost !== 'boolean' ||
      !Array.isArray(gpus) || gpus.length > 64 || !gpus.every((g) => typeof g === 'string' && GPU_UUID.test(g)))
    throw invalid('world', `ranks [${p.rankOffset}, ${p.rankOffset + p.localRanks}) (pid ${p.pid}) sent a payload that is not a rankflow group's`);
  return { fdSocket, config, withHost, gpus: gpus as string[] };
}

/**
 * gpus: the UUIDs of the GPUs this process's ranks use (cuda): no two processes may share one.
 * signal: ends the wait for the other processes (ABORTED); the fd exchange that follows the table
 * (every process present, bounded by the timeout) is not cut short, the abort is seen after it.
 */
export async function joinWorld(w: WorldOptions, local: ExportedSegments[], config: string, timeoutMs: number, gpus: string[] = [], signal?: AbortSignal): Promise<JoinedWorld> {
  const addon = loadAddon();
  const withHost = local.some((e) => e.hostFd >= 0);
  const payload: Payload = { fdSocket: `@rankflow-${process.pid}-${randomUUID().slice(0, 8)}`, config, withHost, gpus };
  const rv = await rendezvous({
    url: w.rendezvous, worldSize: w.size, rankOffset: w.rankOffset, localRanks: local.length, payload: { ...payload }, timeoutMs,
    ...(w.token !== undefined ? { token: w.token } : {}), ...(w.nodeId !== undefined ? { nodeId: w.nodeId } : {}),
    ...(signal !== undefined ? { signal } : {}),
  });
  const received: number[] = [];
  try {
    if (signal?.aborted) throw abortError(`rendezvous at ${w.rendezvous}`, signal);
    const me = rv.peers[rv.self]!;
    for (const p of rv.peers) {
      const theirs = payloadOf(p);
      if (theirs.config !== config)
        throw invalid('buffer', `differs between processes: ranks [${p.rankOffset}, ${p.rankOffset + p.localRanks}) use ${theirs.config}, this process ${config}`);
      const shared = p === me ? [] : theirs.gpus.filter((g) => gpus.includes(g));
      if (shared.length > 0 && p.hostId === me.hostId)
        throw invalid('devices', `GPU ${shared[0]} is used by this process and by ranks [${p.rankOffset}, ${p.rankOffset + p.localRanks}) of another: ` +
          'processes must not share a GPU (kernels of different processes time-slice, so one waiting for a peer would crawl); ' +
          'give each process its own GPUs (CUDA_VISIBLE_DEVICES or devices), or share a GPU between the ranks of one process');
      // Until the scale-out transport exists, every process of a world shares memory with every other.
      if (p.hostId !== me.hostId || p.nodeId !== me.nodeId)
        throw new RankflowError('BACKEND_UNAVAILABLE', `ranks [${p.rankOffset}, ${p.rankOffset + p.localRanks}) are on node ${p.nodeId} (host ${p.hostId}), this process on node ${me.nodeId} (host ${me.hostId}): processes on different nodes or hosts would talk over the scale-out transport, which is not built yet; run every process of the world on one host with one nodeId`);
    }
    const mine = [...local.map((e) => e.deviceFd), ...(withHost ? local.map((e) => e.hostFd) : [])];
    const others = rv.peers.filter((_, i) => i !== rv.self);
    // Only the world's processes may fetch (the socket's abstract name is visible to every local process).
    const serving = others.length > 0 ? addon.fdServe(payload.fdSocket, mine, others.map((p) => p.pid), timeoutMs) : Promise.resolve();
    serving.catch(() => {});
    const peers: JoinedWorld['peers'] = new Array(w.size);
    local.forEach((e, i) => { peers[w.rankOffset + i] = { deviceFd: e.deviceFd, hostFd: e.hostFd }; });
    // One at a time: each fetch holds a libuv pool thread while it waits for its server.
    for (const p of others) {
      const fds = await addon.fdFetch(payloadOf(p).fdSocket, timeoutMs, p.pid);
      received.push(...fds);
      if (fds.length !== p.localRanks * (withHost ? 2 : 1))
        throw invalid('world', `ranks [${p.rankOffset}, ${p.rankOffset + p.localRanks}) (pid ${p.pid}) passed ${fds.length} fds, not ${p.localRanks * (withHost ? 2 : 1)}`);
      for (let i = 0; i < p.localRanks; i++) peers[p.rankOffset + i] = { deviceFd: fds[i]!, hostFd: withHost ? fds[p.localRanks + i]! : -1 };
    }
    await serving;
    if (signal?.aborted) throw abortError(`rendezvous at ${w.rendezvous}`, signal);
    return { peers, received, rv };
  } catch (e) {
    addon.closeFds(received);
    await rv.close();
    throw e;
  }
}
