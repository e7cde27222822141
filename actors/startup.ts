// Starting a group's ranks: where the group spans processes, the world meets first (its nodes decide
// the ranks' domains); then one worker per local rank, each exporting its memory segments; the
// segments are exchanged (fds within this process, through the rendezvous across processes), NCCL
// communicators are made where the backend uses NCCL (across nodes on cuda: one per rail, which is its
// scale-out leg; world/nccl.ts), the host backend's scale-out rails connect between nodes, and every
// rank registers its peers' windows.
import { config } from './core/config.js';
import { RankflowError } from './core/errors.js';
import { ABORT, TRAFFIC, loadAddon, type ExportedSegments } from './core/addon.js';
import type { Backend } from './core/backend.js';
import type { BufferConfig } from './core/validate.js';
import { exchangeSegments, meetWorld, worldWaitMs, type WorldOptions } from './world/join.js';
import { ncclHostIdFor, railIds } from './world/nccl.js';
import { connectScaleOut } from './world/scaleout.js';
import type { ElasticRendezvous, RejoinedAt, Rendezvous } from './world/rendezvous.js';
import type { Membership, RankInit } from '../workers/protocol.js';
import { rejoinSegments } from './elastic-join.js';
import { localGpuIds, type GroupOptions, type GroupPlan } from './options.js';
import { cutShort, type RankHandle, type Ranks } from './ranks.js';

/** What starting needs of the group. */
export interface StartSite {
  id: string;
  size: number;
  worldSize: number;
  rankOffset: number;
  backend: Backend;
  buffer: BufferConfig;
  opts: GroupOptions;
  world?: WorldOptions;
  ranks: RankHandle[];
  workers: Ranks;
  /** createGroup's abort (ends the wait for the world) */
  signal: AbortSignal;
  /** the group is being destroyed (an abort): stop */
  destroying(): boolean;
  /** the world formed: watch its connections for lost processes */
  watchWorld(rv: Rendezvous): void;
}

/** Starts every local rank and registers the windows; resolves with the buffer's sizes as rank 0 reports them. */
export async function startRanks(g: StartSite, t: GroupPlan): Promise<{ bufferBytes: number; workspaceBytes: number; symmetricBytes: number; cpuBytes: number }> {
  // A world meets first: its nodes (by world.nodeId) decide the ranks' domains. Processes of a node
  // must not share a GPU (their kernels time-slice: one waiting for a peer would crawl): each says
  // which GPUs its ranks use, and the world refuses a GPU named by two processes of a node.
  const waitMs = g.world ? worldWaitMs(g.opts.timeouts?.cpuSeconds) : 0;
  const met = g.world ? await meetWorld(g.world, {
    config: JSON.stringify({ ...g.buffer, ranksPerNode: g.opts.ranksPerNode, backend: g.backend }),
    withHost: (g.buffer.cpuBytes ?? 0) > 0, timeoutMs: waitMs, localRanks: g.size,
    gpus: g.backend === 'cuda' ? localGpuIds(g.size, g.rankOffset, t.devices) : [],
    ...(g.opts.ranksPerNode !== undefined ? { ranksPerNode: g.opts.ranksPerNode } : {}),
    ...(g.signal ? { signal: g.signal } : {}), ...(t.elastic ? { elastic: true } : {}),
  }) : undefined;
  if (met && g.destroying()) {  // torn down (aborted) while the world formed: its connections go too
    await met.rv.close();
    throw new RankflowError('STATE', 'the group was destroyed while its world formed');
  }
  if (g.world?.rejoin && !t.elastic) {
    await met!.rv.close();
    throw new RankflowError('EINVAL', 'world.rejoin: needs elastic: true (a rejoin takes back a range that left an elastic world)');
  }
  if (met) g.watchWorld(met.rv);
  // A rejoining process starts at the survivors' numbers, in their membership (elastic-join.ts).
  const rejoined = (met?.rv as ElasticRendezvous | undefined)?.rejoined;
  const firstSeq = rejoined?.seq ?? t.firstSeq;
  const ranksPerNode = met?.nodes.ranksPerNode ?? t.ranksPerNode;
  const scaleOut = (met?.nodes.count ?? 1) > 1;
  if (scaleOut && t.elastic) {
    await met!.rv.close();
    throw new RankflowError('EINVAL', 'elastic: is supported within one node only (this world spans nodes by world.nodeId: the scale-out legs do not mask ranks yet)');
  }
  // Ranks of this process that share a GPU split its SMs between them, and make no world
  // communicator: NCCL refuses two ranks of one communicator on one GPU. Across nodes each rank makes
  // its rail's, which holds no other rank of its node, so ranks sharing a GPU make theirs too.
  const share = (d: number) => t.devices!.filter((e) => e === d).length;
  const sharing = t.devices !== undefined && new Set(t.devices).size < t.devices.length;
  const nccl = scaleOut || !sharing;
  // NCCL's host identity for this process (world/nccl.ts): set natively before its first NCCL call.
  const ncclHostId = met && g.backend === 'cuda' ? ncclHostIdFor(met.rv.peers, met.rv.peers[met.rv.self]!.nodeId, config.ncclHostId) : undefined;
  for (let r = 0; r < g.size; r++) {
    const abort = new SharedArrayBuffer(ABORT.bytes);
    const runAbort = new SharedArrayBuffer(4);
    const init: RankInit = {
      rank: g.rankOffset + r, worldSize: g.worldSize, ranksPerNode, groupId: g.id, buffer: g.buffer,
      cpuSeconds: t.cpuSeconds, gpuSeconds: t.gpuSeconds, inspect: typeof g.opts.inspect === 'function',
      backend: g.backend, abort, runAbort, traffic: new SharedArrayBuffer(TRAFFIC.bytes), ...(firstSeq ? { firstSeq } : {}),
      ...(rejoined ? { membership: membershipOf(rejoined, g.worldSize) } : {}),
      tuning: {
        ceMinBytes: config.ceMinBytes, cooperative: config.cooperative, graphLaunch: config.graphLaunch, fusedDispatch: config.fusedDispatch,
        ...(config.ncclHome ? { ncclHome: config.ncclHome } : {}),
        ...(ncclHostId !== undefined ? { ncclHostId } : {}),
      },
      ...(t.devices ? { device: t.devices[r]!, deviceShare: share(t.devices[r]!), nccl } : {}),
      ...(scaleOut ? { scaleOut } : {}), ...(t.elastic ? { elastic: true } : {}),
      // A peer's timeout is that peer's failure where the waiter survives it (host) and the peer is this process's to fail.
      ...(t.elastic && g.backend === 'host' && !met ? { blamesTimeouts: true } : {}),
    };
    g.ranks[r]!.seq = firstSeq;
    g.workers.spawn(r, init);
  }
  const exported = await Promise.all(g.ranks.map((_, r) => g.workers.call(r, (api) => api.exported())));
  const info = await g.workers.call(0, (api) => api.info());
  const sizes = { bufferBytes: info.bufferBytes, workspaceBytes: info.workspaceBytes, symmetricBytes: info.symmetricBytes, cpuBytes: info.cpuBytes };
  if (!g.world || !met) {
    const peers = exported.map((e: ExportedSegments) => ({ deviceFd: e.deviceFd, hostFd: e.hostFd }));
    if (g.backend === 'cuda') {
      // One NCCL communicator per rank: rank 0 makes the unique id, every rank joins with it together.
      const id = await g.workers.call(0, (api) => api.ncclUniqueId());
      if (id) await g.workers.all((api) => api.ncclInit(id));
    }
    await g.workers.all((api) => api.register(peers));
    return sizes;
  }
  // A rejoiner whose leader is lost before it serves fails at once (world/takeover.ts): its waits end with it.
  let cut: RankflowError | undefined;
  const broken = new Promise<never>((_, reject) => (met.rv as ElasticRendezvous).onBroken?.((e) => reject((cut = e))));
  broken.catch(() => {});
  // (the survivors end the join: its fd passing ends with it rather than at its timeouts)
  const segments = rejoined ? rejoinSegments(met.rv as ElasticRendezvous, rejoined, exported, waitMs, broken) : undefined;
  segments?.then((s) => cut && loadAddon().closeFds(s.received), () => {});  // fds that came after the rejoin ended
  const joined = segments
    ? { ...(await Promise.race([segments, broken])), rv: met.rv }
    : await exchangeSegments(met, g.world, exported, waitMs, g.signal);
  if (g.destroying()) {  // torn down (aborted) while the world formed
    loadAddon().closeFds(joined.received);
    throw new RankflowError('STATE', 'the group was destroyed while its world formed');
  }
  try {
    if (g.backend === 'cuda' && scaleOut) {
      // One communicator per rail: its rank on node 0 makes the id, the rendezvous carries it.
      const ids = await railIds({
        rv: joined.rv, rankOffset: g.rankOffset, localRanks: g.size, ranksPerNode,
        make: (r) => g.workers.call(r, (api) => api.ncclUniqueId()),
      });
      await g.workers.all((api, r) => api.ncclInit(ids[r]!));
    } else if (g.backend === 'cuda') {
      // NCCL's unique id travels from global rank 0's process through the rendezvous.
      const mine = g.rankOffset === 0 ? await g.workers.call(0, (api) => api.ncclUniqueId()) : null;
      const ids = await joined.rv.exchange(mine ? Array.from(mine) : null);
      const root = ids[0] as number[] | null;
      if (root) await g.workers.all((api) => api.ncclInit(Uint8Array.from(root)));
    }
    if (scaleOut && g.backend === 'host') {
      await connectScaleOut({
        rv: joined.rv, localRanks: g.size, ...(g.world.token !== undefined ? { token: g.world.token } : {}),
        listen: (r, host) => g.workers.call(r, (api) => api.scaleoutListen(host)),
        connect: (r, ends, key) => g.workers.call(r, (api) => cutShort(api.scaleoutConnect(ends, key, waitMs), [g.workers.members[r]!.untilFailed])),
      });
    }
    await g.workers.all((api) => api.register(joined.peers));
    if (cut) throw cut;
    if (rejoined) (met.rv as ElasticRendezvous).served?.();
    return sizes;
  } finally {
    loadAddon().closeFds(joined.received);  // mapped by every local rank now (or never will be)
  }
}

/** The membership a rejoining process's ranks start in (its table's). */
function membershipOf(at: RejoinedAt, worldSize: number): Membership {
  const mask = BigInt(`0x${at.mask}`);
  const live = Array.from({ length: worldSize }, (_, g) => g).filter((g) => ((mask >> BigInt(g)) & 1n) === 1n);
  return { mask, epoch: at.epoch, live, sessions: at.sessions };
}
