// A group spread over several processes (API.md "More than one process"): the processes meet at a
// TCP rendezvous, check that they describe the same world, and hand each other the fds of their
// ranks' symmetric segments over Unix sockets (SCM_RIGHTS), so every rank can map every peer.
import { randomUUID } from 'node:crypto';

import { RankflowError, invalid } from '../core/errors.js';
import { config as env } from '../core/config.js';
import { loadAddon, type ExportedSegments } from '../core/addon.js';
import { rendezvous, type Rendezvous } from './rendezvous.js';

export interface WorldOptions {
  /** ranks in the whole world, over all processes */
  size: number;
  /** global id of this process's first rank */
  rankOffset: number;
  /** 'tcp://host:port': the process with rankOffset 0 listens there */
  rendezvous: string;
}

export function checkWorld(w: unknown, localRanks: number): WorldOptions {
  if (w === null || typeof w !== 'object') throw invalid('world', 'must be { size, rankOffset, rendezvous }');
  const { size, rankOffset, rendezvous: url } = w as WorldOptions;
  if (!Number.isInteger(size) || size < 1 || size > 64) throw invalid('world.size', `must be an integer in [1, 64] (got ${String(size)})`);
  if (!Number.isInteger(rankOffset) || rankOffset < 0 || rankOffset + localRanks > size)
    throw invalid('world.rankOffset', `(${String(rankOffset)}) + ranks (${localRanks}) must fit in world.size (${size})`);
  if (typeof url !== 'string' || !/^tcp:\/\/[^/:]+:\d+$/.test(url)) throw invalid('world.rendezvous', `must be 'tcp://host:port' (got ${String(url)})`);
  return { size, rankOffset, rendezvous: url };
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

interface Payload { fdSocket: string; config: string; withHost: boolean }

export async function joinWorld(w: WorldOptions, local: ExportedSegments[], config: string, timeoutMs: number): Promise<JoinedWorld> {
  const addon = loadAddon();
  const withHost = local.some((e) => e.hostFd >= 0);
  const payload: Payload = { fdSocket: `@rankflow-${process.pid}-${randomUUID().slice(0, 8)}`, config, withHost };
  const rv = await rendezvous({ url: w.rendezvous, worldSize: w.size, rankOffset: w.rankOffset, localRanks: local.length, payload, timeoutMs });
  const received: number[] = [];
  try {
    const me = rv.peers[rv.self]!;
    for (const p of rv.peers) {
      const theirs = p.payload as Payload;
      if (theirs.config !== config)
        throw invalid('buffer', `differs between processes: ranks [${p.rankOffset}, ${p.rankOffset + p.localRanks}) use ${theirs.config}, this process ${config}`);
      if (p.hostId !== me.hostId)
        throw new RankflowError('BACKEND_UNAVAILABLE', `the host backend needs every rank on one host: ranks [${p.rankOffset}, ${p.rankOffset + p.localRanks}) are on ${p.hostId}, this process on ${me.hostId} (across machines, NCCL carries the scale-out domain: backend 'cuda')`);
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
      const fds = await addon.fdFetch((p.payload as Payload).fdSocket, timeoutMs, p.pid);
      received.push(...fds);
      for (let i = 0; i < p.localRanks; i++) peers[p.rankOffset + i] = { deviceFd: fds[i]!, hostFd: withHost ? fds[p.localRanks + i]! : -1 };
    }
    await serving;
    return { peers, received, rv };
  } catch (e) {
    addon.closeFds(received);
    await rv.close();
    throw e;
  }
}
