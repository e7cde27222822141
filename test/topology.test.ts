// The nodes of a world, as every process reads them off the rendezvous table (actors/world/topology.ts).
import { describe, expect, it } from 'vitest';

import { worldNodes } from '../actors/world/topology.js';
import type { RendezvousPeer } from '../actors/world/rendezvous.js';

const table = (...procs: Array<[nodeId: string, ranks: number, hostId?: string]>): RendezvousPeer[] => {
  let at = 0;
  return procs.map(([nodeId, localRanks, hostId], i) => {
    const p = { rankOffset: at, localRanks, nodeId, hostId: hostId ?? 'host-1', pid: 100 + i, payload: {} };
    at += localRanks;
    return p;
  });
};

describe('worldNodes', () => {
  it('finds one node when every process names the same, whatever ranksPerNode names (logical domains)', () => {
    expect(worldNodes(table(['n', 2], ['n', 2]), 4)).toEqual({ count: 1, ranksPerNode: 4, ofProcess: [0, 0] });
    expect(worldNodes(table(['n', 2], ['n', 2]), 4, 2)).toEqual({ count: 1, ranksPerNode: 2, ofProcess: [0, 0] });
  });

  it('numbers nodes by their first rank, and counts ranks over a node\'s processes', () => {
    expect(worldNodes(table(['z', 1], ['z', 2], ['a', 3]), 6)).toEqual({ count: 2, ranksPerNode: 3, ofProcess: [0, 0, 1] });
    expect(worldNodes(table(['a', 1], ['b', 1], ['c', 1], ['d', 1]), 4, 1)).toEqual({ count: 4, ranksPerNode: 1, ofProcess: [0, 1, 2, 3] });
  });

  it.each([
    ['a node split by another', table(['a', 1], ['b', 1], ['a', 1], ['b', 1]), undefined, /^world\.nodeId: node "a" holds rank 0 and rank 2 with ranks of another node/],
    ['nodes of different sizes', table(['a', 2], ['b', 2], ['c', 1], ['c', 1], ['c', 1]), undefined, /^world\.nodeId: node "a" holds 2 ranks and node "c" 3/],
    ['a node on two hosts', table(['a', 1, 'h1'], ['a', 1, 'h2'], ['b', 2]), undefined, /^world\.nodeId: rank 0 \(pid 100 on h1\) and rank 1 \(pid 101 on h2\) both name node "a" but run on different hosts/],
    ['a ranksPerNode that disagrees', table(['a', 2], ['b', 2]), 4, /^ranksPerNode: \(4\) disagrees with the world's nodes: 2 nodes \(by world\.nodeId\) of 2 ranks each/],
  ])('refuses %s with EINVAL', (_, peers, asked, message) => {
    const W = peers.reduce((n, p) => n + p.localRanks, 0);
    expect(() => worldNodes(peers, W, asked)).toThrow(expect.objectContaining({ code: 'EINVAL', message: expect.stringMatching(message) }));
  });
});
