// The nodes of a world, read off the rendezvous table (every process reads the same table, so every
// process finds the same nodes). Processes that name the same world.nodeId are one node: they share
// memory, so they must run on one host. Processes of different nodes share none: their ranks talk over
// the scale-out leg (runtime/scaleout.hpp), rank (node, local) with the ranks of its local index on the
// other nodes. So a node's ranks are consecutive, every node holds as many, and nodes are numbered by
// their first rank: rank g is on node g / ranksPerNode.
import { invalid } from '../core/errors.js';
import { fmt, rangeOf, who } from './protocol.js';
import type { RendezvousPeer } from './rendezvous.js';

export interface WorldNodes {
  /** nodes in the world */
  count: number;
  /** ranks on each node */
  ranksPerNode: number;
  /** the node of each process of the table (in the table's order) */
  ofProcess: number[];
}

/**
 * The world's nodes; `asked` is createGroup's ranksPerNode where the caller gave it: with more than
 * one node it must agree with them (with one node it only names the logical domains, as before).
 */
export function worldNodes(peers: readonly RendezvousPeer[], worldSize: number, asked?: number): WorldNodes {
  const nodes: Array<{ id: string; hostId: string; first: RendezvousPeer; ranks: number }> = [];
  const ofProcess: number[] = [];
  for (const p of peers) {
    const last = nodes[nodes.length - 1];
    if (last !== undefined && last.id === p.nodeId) {
      if (last.hostId !== p.hostId)
        throw invalid('world.nodeId', `${who(last.first)} and ${who(p)} both name node ${JSON.stringify(p.nodeId)} but run on different hosts: ` +
          "a node's processes share memory, so they must be on one host; give each host its own world.nodeId");
      last.ranks += p.localRanks;
    } else {
      const earlier = nodes.find((n) => n.id === p.nodeId);
      if (earlier !== undefined)
        throw invalid('world.nodeId', `node ${JSON.stringify(p.nodeId)} holds ${fmt(rangeOf(earlier.first))} and ${fmt(rangeOf(p))} with ranks of ` +
          'another node between them: the ranks of a node must be consecutive (rankOffset = node * ranksPerNode + local index)');
      nodes.push({ id: p.nodeId, hostId: p.hostId, first: p, ranks: p.localRanks });
    }
    ofProcess.push(nodes.length - 1);
  }
  if (nodes.length === 1) return { count: 1, ranksPerNode: asked ?? worldSize, ofProcess };
  const R = nodes[0]!.ranks;
  const odd = nodes.find((n) => n.ranks !== R);
  if (odd !== undefined)
    throw invalid('world.nodeId', `node ${JSON.stringify(nodes[0]!.id)} holds ${R} ranks and node ${JSON.stringify(odd.id)} ${odd.ranks}: ` +
      'every node of a world that spans nodes must hold the same number of ranks');
  if (asked !== undefined && asked !== R)
    throw invalid('ranksPerNode', `(${asked}) disagrees with the world's nodes: ${nodes.length} nodes (by world.nodeId) of ${R} ranks each`);
  return { count: nodes.length, ranksPerNode: R, ofProcess };
}
