// NCCL in a cuda world that spans processes (actors/startup.ts): the host identity NCCL gives each
// process, and the unique ids of the world's communicators, carried through the rendezvous.
//
// NCCL_HOSTID: NCCL hashes it (or hostname + boot id) once per process into the process's "host", and
// refuses two ranks of one communicator on one GPU of one host ("Duplicate GPU detected"). rankflow's
// nodes are NCCL's hosts: every process of a cuda world gets `rankflow:<worldId>:<nodeId>` (unless the
// application set NCCL_HOSTID), so the processes of one node agree and simulated nodes on one machine
// (world.nodeId) are different hosts to NCCL, which then connects them over its network transport as
// it would real nodes. The world id (the same in every process, different for every world) keeps two
// worlds' processes apart when one of them made an NCCL communicator before (NCCL keeps the first value).
//
// Communicators: a world on one node makes one, of every rank, from global rank 0's id. A world that
// spans nodes makes one per rail instead (the ranks of local index j, one per node, NCCL rank = node
// index): rank (0, j) makes its rail's id, and every process hands on those of its ranks on node 0.
import { createHash } from 'node:crypto';

import { RankflowError, invalid } from '../core/errors.js';
import { isObject, quote, who } from './protocol.js';
import type { Rendezvous, RendezvousPeer } from './rendezvous.js';

/** The world's id: the same in every process of the world (they read the same table), new for every world. */
export function worldIdOf(peers: readonly RendezvousPeer[]): string {
  const table = peers.map((p) => [p.rankOffset, p.localRanks, p.pid, p.hostId, p.nodeId]);
  return createHash('sha256').update(JSON.stringify(table)).digest('hex').slice(0, 16);
}

// A nodeId goes into NCCL_HOSTID as it is when it is plain printable text, else as its hash (an
// environment variable holds no NUL, and NCCL's log prints it).
const PLAIN = /^[\x21-\x7e]{1,128}$/;

/**
 * The NCCL_HOSTID of a cuda process of this world on node `nodeId`: `given` (the application's
 * NCCL_HOSTID) where there is one, else `rankflow:<worldId>:<nodeId>`.
 */
export function ncclHostIdFor(peers: readonly RendezvousPeer[], nodeId: string, given?: string): string {
  if (given !== undefined && given !== '') return given;
  const node = PLAIN.test(nodeId) ? nodeId : `sha256-${createHash('sha256').update(nodeId).digest('hex').slice(0, 16)}`;
  return `rankflow:${worldIdOf(peers)}:${node}`;
}

const ID_BYTES = 128;
const BASE64 = /^[A-Za-z0-9+/]{171}=$/;  // 128 bytes

/** What a process says in the rail id exchange: the ids its ranks on node 0 made, or why they could not. */
interface RailOffer { rails: Array<[local: number, id: string]>; unavailable?: string }

function offerOf(v: unknown, p: RendezvousPeer, ranksPerNode: number): RailOffer {
  const o = isObject(v) ? v : {};
  const { rails, unavailable } = o as Partial<RailOffer>;
  const ok = Array.isArray(rails) && rails.length <= ranksPerNode &&
    rails.every((e) => Array.isArray(e) && e.length === 2 && Number.isInteger(e[0]) && e[0] >= 0 && e[0] < ranksPerNode &&
      typeof e[1] === 'string' && BASE64.test(e[1])) &&
    (unavailable === undefined || (typeof unavailable === 'string' && unavailable.length <= 4096));
  if (!ok) throw invalid('world', `${who(p)} sent NCCL rail ids that are not a rankflow group's: ${quote(v)}`);
  return { rails: rails!, ...(unavailable !== undefined ? { unavailable } : {}) };
}

/**
 * The unique id of each local rank's rail communicator, in local rank order. Every process of the
 * world calls this at the same point; `make(r)` runs local rank r's ncclUniqueId (called for the
 * ranks on node 0 only). A process whose ranks could not make one tells the others, and every
 * process then fails with BACKEND_UNAVAILABLE saying why.
 */
export async function railIds(o: {
  rv: Rendezvous;
  rankOffset: number;
  localRanks: number;
  ranksPerNode: number;
  make(local: number): Promise<Uint8Array | null>;
}): Promise<Uint8Array[]> {
  const { rv, rankOffset, localRanks, ranksPerNode: R } = o;
  const mine: RailOffer = { rails: [] };
  try {
    for (let r = 0; r < localRanks; r++) {
      const g = rankOffset + r;
      if (g >= R) continue;  // not on node 0
      const id = await o.make(r);
      if (id === null || id.length !== ID_BYTES) throw new RankflowError('BACKEND_UNAVAILABLE', `rank ${g} made no NCCL unique id`);
      mine.rails.push([g, Buffer.from(id).toString('base64')]);
    }
  } catch (e) {
    if (RankflowError.from(e).code !== 'BACKEND_UNAVAILABLE') throw e;  // a rank that failed: the world hears it lost
    mine.rails = [];
    mine.unavailable = (e as Error).message.slice(0, 4096);
  }
  const offers = (await rv.exchange(mine)).map((v, i) => offerOf(v, rv.peers[i]!, R));
  const refused = offers.findIndex((x) => x.unavailable !== undefined);
  if (refused >= 0)
    throw new RankflowError('BACKEND_UNAVAILABLE',
      `the world spans nodes, and backend 'cuda' needs an NCCL communicator per rail; ${who(rv.peers[refused]!)} could not make its rail's id: ${offers[refused]!.unavailable}`);
  const ids = new Map<number, string>();
  offers.forEach((x, i) => {
    for (const [local, id] of x.rails) {
      const p = rv.peers[i]!;
      if (local < p.rankOffset || local >= p.rankOffset + p.localRanks || ids.has(local))
        throw invalid('world', `${who(p)} sent an NCCL id for rail ${local}, which is not one of its ranks on node 0`);
      ids.set(local, id);
    }
  });
  return Array.from({ length: localRanks }, (_, r) => {
    const j = (rankOffset + r) % R;
    const id = ids.get(j);
    if (id === undefined) throw invalid('world', `no process sent the NCCL id of rail ${j} (rank ${j} on node 0)`);
    return Uint8Array.from(Buffer.from(id, 'base64'));
  });
}
