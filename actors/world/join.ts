// A group spread over several processes (API.md "More than one process"): the processes meet at a
// TCP rendezvous (authenticated by the world's token), check that they describe the same world, find
// its nodes (topology.ts), and the processes of each node hand each other the fds of their ranks'
// symmetric segments over Unix sockets (SCM_RIGHTS; served only to the pids of the node's processes),
// so every rank maps every peer of its node. Across nodes the ranks talk over the scale-out leg
// (scaleout.ts).
import { randomUUID } from 'node:crypto';

import { invalid } from '../core/errors.js';
import { abortError } from '../core/abort.js';
import { checkKnownKeys, keysOf } from '../core/option-keys.js';
import { config as env } from '../core/config.js';
import { loadAddon, type ExportedSegments } from '../core/addon.js';
import { isLoopbackHost, tokenProblem } from './auth.js';
import { hostId } from './host-id.js';
import { isText, who } from './protocol.js';
import { nodeIdProblem, parseRendezvousUrl, rendezvous, type Rendezvous, type RendezvousPeer } from './rendezvous.js';
import { worldNodes, type WorldNodes } from './topology.js';

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
  /** an elastic world's process that takes back a range that left (API.md; world/rejoin.ts) */
  rejoin?: boolean;
}

/** Every key of createGroup's `world`. */
export const WORLD_KEYS = keysOf<WorldOptions>()(['size', 'rankOffset', 'rendezvous', 'token', 'nodeId', 'rejoin']);

/** The world options checked, with the token and nodeId defaults filled in. */
export function checkWorld(w: unknown, localRanks: number): WorldOptions {
  if (w === null || typeof w !== 'object') throw invalid('world', 'must be { size, rankOffset, rendezvous, token?, nodeId? }');
  checkKnownKeys('world', w, WORLD_KEYS);
  const { size, rankOffset, rendezvous: url, token: given, nodeId: named, rejoin } = w as WorldOptions;
  if (rejoin !== undefined && typeof rejoin !== 'boolean') throw invalid('world.rejoin', `must be a boolean (got ${String(rejoin)})`);
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
  return { size, rankOffset, rendezvous: url, nodeId, ...(token !== undefined ? { token } : {}), ...(rejoin === true ? { rejoin } : {}) };
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

/** A world whose processes met: the rendezvous, the checked table, and the nodes found in it. */
export interface MetWorld {
  rv: Rendezvous;
  nodes: WorldNodes;
  /** the node of this process */
  node: number;
  withHost: boolean;
  fdSocket: string;
}

export interface JoinedWorld {
  /** every rank's segments, in global rank order, as fds valid in this process; -1 for ranks of other nodes */
  peers: Array<{ deviceFd: number; hostFd: number }>;
  /** fds received from other processes: close them once the local ranks have mapped them */
  received: number[];
  rv: Rendezvous;
}

interface Payload { fdSocket: string; config: string; withHost: boolean; gpus: string[] }

// The names joinWorld gives its fd sockets: abstract, and nothing else (a peer's payload is data).
const FD_SOCKET = /^@rankflow-\d+-[0-9a-f]{8}$/;
const GPU_UUID = /^GPU-[0-9a-f-]{36}$/;

export function payloadOf(p: RendezvousPeer): Payload {
  const { fdSocket, config, withHost, gpus } = p.payload;
  if (typeof fdSocket !== 'string' || !FD_SOCKET.test(fdSocket) || !isText(config, 8192) || typeof withHost !== 'boolean' ||
      !Array.isArray(gpus) || gpus.length > 64 || !gpus.every((g) => typeof g === 'string' && GPU_UUID.test(g)))
    throw invalid('world', `ranks [${p.rankOffset}, ${p.rankOffset + p.localRanks}) (pid ${p.pid}) sent a payload that is not a rankflow group's`);
  return { fdSocket, config, withHost, gpus: gpus as string[] };
}

/**
 * Meets the other processes of the world (before this process's ranks start: their domains depend on
 * the nodes found). config: what must be equal in every process; withHost: the ranks export host
 * segments; gpus: the UUIDs of the GPUs this process's ranks use (cuda), one per rank: no two processes
 * of a node may share one, and in a world of one node no process may name one twice. ranksPerNode: createGroup's, where the caller gave it. signal: ends the wait for the
 * other processes (ABORTED).
 */
export async function meetWorld(
  w: WorldOptions,
  opts: { config: string; withHost: boolean; timeoutMs: number; gpus?: string[]; ranksPerNode?: number; localRanks: number; signal?: AbortSignal; elastic?: boolean },
): Promise<MetWorld> {
  const gpus = opts.gpus ?? [];
  const payload: Payload = { fdSocket: `@rankflow-${process.pid}-${randomUUID().slice(0, 8)}`, config: opts.config, withHost: opts.withHost, gpus };
  const rv = await rendezvous({
    url: w.rendezvous, worldSize: w.size, rankOffset: w.rankOffset, localRanks: opts.localRanks, payload: { ...payload }, timeoutMs: opts.timeoutMs,
    ...(w.token !== undefined ? { token: w.token } : {}), ...(w.nodeId !== undefined ? { nodeId: w.nodeId } : {}),
    ...(opts.signal !== undefined ? { signal: opts.signal } : {}),
    ...(opts.elastic === true ? { elastic: true } : {}), ...(w.rejoin === true ? { rejoin: true } : {}),
  });
  try {
    if (opts.signal?.aborted) throw abortError(`rendezvous at ${w.rendezvous}`, opts.signal);
    const me = rv.peers[rv.self]!;
    for (const p of rv.peers) {
      const theirs = payloadOf(p);
      if (theirs.config !== opts.config)
        throw invalid('buffer', `differs between processes: ranks [${p.rankOffset}, ${p.rankOffset + p.localRanks}) use ${theirs.config}, this process ${opts.config}`);
      // Processes of one node must not share a GPU: their kernels time-slice, and a kernel waiting for
      // a node peer's stores would crawl. Processes of different nodes (simulated nodes on one
      // machine) may: nothing of theirs waits on the other's memory, only on NCCL between them.
      const shared = p === me ? [] : theirs.gpus.filter((g) => gpus.includes(g));
      if (shared.length > 0 && p.hostId === me.hostId && p.nodeId === me.nodeId)
        throw invalid('devices', `GPU ${shared[0]} is used by this process and by ranks [${p.rankOffset}, ${p.rankOffset + p.localRanks}) of another of its node: ` +
          "a node's processes must not share a GPU (kernels of different processes time-slice, so one waiting for a peer would crawl); " +
          'give each process its own GPUs (CUDA_VISIBLE_DEVICES or devices), or share a GPU between the ranks of one process');
      // Processes of one node share memory (fds over Unix sockets): they must be on one host.
      if (p.nodeId === me.nodeId && p.hostId !== me.hostId)
        throw invalid('world.nodeId', `ranks [${p.rankOffset}, ${p.rankOffset + p.localRanks}) name this process's node ${JSON.stringify(me.nodeId)} but run on host ${p.hostId}, this process on ${me.hostId}: ` +
          "a node's processes share memory, so they must be on one host; give each host its own world.nodeId");
    }
    const nodes = worldNodes(rv.peers, w.size, opts.ranksPerNode);
    // Ranks of one process may share a GPU, but in a world of one node every rank joins one NCCL
    // communicator, which refuses two ranks on one GPU; across nodes each joins its rail's (one rank
    // per node), so they may. Every process reads the same table, so every one refuses alike.
    const twice = nodes.count === 1 ? rv.peers.find((p) => new Set(payloadOf(p).gpus).size < payloadOf(p).gpus.length) : undefined;
    if (twice !== undefined)
      throw invalid('devices', `${who(twice)}${twice === me ? ', this process,' : ''} name a GPU twice in a world of one node: ` +
        "its cuda ranks join one NCCL communicator, which refuses two ranks on one GPU; share a GPU between ranks of a group of one process " +
        '(no world), or between ranks of a node in a world that spans nodes (world.nodeId)');
    return { rv, nodes, node: nodes.ofProcess[rv.self]!, withHost: opts.withHost, fdSocket: payload.fdSocket };
  } catch (e) {
    await rv.close();
    throw e;
  }
}

/**
 * Hands this process's ranks' segments to the other processes of its node and maps theirs (fds over
 * Unix sockets, served only to the pids of the node's processes). Ranks of other nodes share no memory:
 * their entries are -1. On failure the rendezvous stays open (the caller closes it).
 */
export async function exchangeSegments(met: MetWorld, w: WorldOptions, local: ExportedSegments[], timeoutMs: number, signal?: AbortSignal): Promise<JoinedWorld> {
  const addon = loadAddon();
  const { rv, withHost } = met;
  const received: number[] = [];
  try {
    const mine = [...local.map((e) => e.deviceFd), ...(withHost ? local.map((e) => e.hostFd) : [])];
    if (mine.some((fd) => fd < 0)) throw invalid('buffer', 'a rank of this process exported no segment');
    const others = rv.peers.filter((_, i) => i !== rv.self && met.nodes.ofProcess[i] === met.node);
    // Only the node's processes may fetch (the socket's abstract name is visible to every local process).
    const serving = others.length > 0 ? addon.fdServe(met.fdSocket, mine, others.map((p) => p.pid), timeoutMs) : Promise.resolve();
    serving.catch(() => {});
    const peers: JoinedWorld['peers'] = Array.from({ length: w.size }, () => ({ deviceFd: -1, hostFd: -1 }));
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
    // The exchange (every process present, bounded by the timeout) is not cut short: the abort is seen after it.
    if (signal?.aborted) throw abortError(`rendezvous at ${w.rendezvous}`, signal);
    return { peers, received, rv };
  } catch (e) {
    addon.closeFds(received);
    throw e;
  }
}
