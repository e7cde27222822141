// NCCL in a cuda world (actors/world/nccl.ts), without GPUs: the NCCL_HOSTID each process gets (one
// per rankflow node, so simulated nodes are different hosts to NCCL), and the exchange of the rail
// communicators' unique ids through the rendezvous (here a stand-in that returns the offers given).
import { describe, expect, it } from 'vitest';

import { ncclHostIdFor, railIds, worldIdOf } from '../actors/world/nccl.js';
import type { Rendezvous, RendezvousPeer } from '../actors/world/rendezvous.js';

const table = (...procs: Array<[nodeId: string, ranks: number, pid?: number]>): RendezvousPeer[] => {
  let at = 0;
  return procs.map(([nodeId, localRanks, pid], i) => {
    const p = { rankOffset: at, localRanks, nodeId, hostId: 'host-1', pid: pid ?? 100 + i, payload: {} };
    at += localRanks;
    return p;
  });
};

describe('NCCL_HOSTID of a cuda process of a world', () => {
  const world = table(['sim-node-0', 2], ['sim-node-1', 2]);

  it('is rankflow:<worldId>:<nodeId>: the same for the processes of a node, different across nodes', () => {
    const id = worldIdOf(world);
    expect(id).toMatch(/^[0-9a-f]{16}$/);
    expect(ncclHostIdFor(world, 'sim-node-0')).toBe(`rankflow:${id}:sim-node-0`);
    expect(ncclHostIdFor(world, 'sim-node-1')).toBe(`rankflow:${id}:sim-node-1`);
    const split = table(['n', 1], ['n', 1], ['m', 2]);
    expect(ncclHostIdFor(split, 'n')).toBe(ncclHostIdFor(split, 'n'));
  });

  it('keeps the value the application set', () => {
    expect(ncclHostIdFor(world, 'sim-node-1', 'my-host')).toBe('my-host');
    expect(ncclHostIdFor(world, 'sim-node-1', '')).toMatch(/^rankflow:[0-9a-f]{16}:sim-node-1$/);
  });

  it('differs between worlds of the same nodes (other processes), and is read off the table alone', () => {
    const again = table(['sim-node-0', 2, 900], ['sim-node-1', 2, 901]);
    expect(worldIdOf(again)).not.toBe(worldIdOf(world));
    expect(worldIdOf(table(['sim-node-0', 2], ['sim-node-1', 2]))).toBe(worldIdOf(world));
  });

  it('names a nodeId that is not plain text by its hash (no NUL or space reaches the environment)', () => {
    expect(ncclHostIdFor(world, 'node with spaces\u0000')).toMatch(/^rankflow:[0-9a-f]{16}:sha256-[0-9a-f]{16}$/);
  });
});

/** A rendezvous whose exchange answers with the offers of every process (this one's replaced by what it sends). */
function rendezvous(peers: RendezvousPeer[], self: number, others: unknown[]): Rendezvous & { sent: unknown[] } {
  const sent: unknown[] = [];
  return {
    peers, self, localAddress: '127.0.0.1', leaderAddress: '127.0.0.1', sent,
    async exchange<T>(value: T): Promise<T[]> {
      sent.push(value);
      return others.map((o, i) => (i === self ? value : o)) as T[];
    },
    exchangeAmongLive: () => Promise.reject(new Error('not an elastic world')),
    onPeerLost: () => () => {},
    announceFailure: () => {},
    onRankFailed: () => () => {},
    announceRelease: () => {},
    onRelease: () => () => {},
    close: async () => {},
  };
}

const id = (b: number) => new Uint8Array(128).fill(b);
const b64 = (b: number) => Buffer.from(id(b)).toString('base64');

describe('the rail communicators\' unique ids', () => {
  // 2 nodes x 2 ranks, a process per node: node 0's process makes rails 0 and 1.
  const peers = table(['a', 2], ['b', 2]);

  it('come from the rail ranks on node 0; each local rank gets its rail\'s', async () => {
    const made: number[] = [];
    const leader = rendezvous(peers, 0, [null, { rails: [] }]);
    const ids = await railIds({ rv: leader, rankOffset: 0, localRanks: 2, ranksPerNode: 2, make: async (r) => (made.push(r), id(r + 1)) });
    expect(made).toEqual([0, 1]);
    expect(leader.sent).toEqual([{ rails: [[0, b64(1)], [1, b64(2)]] }]);
    expect(ids).toEqual([id(1), id(2)]);

    const follower = rendezvous(peers, 1, [{ rails: [[0, b64(1)], [1, b64(2)]] }, null]);
    const theirs = await railIds({ rv: follower, rankOffset: 2, localRanks: 2, ranksPerNode: 2, make: async () => { throw new Error('node 1 makes no id'); } });
    expect(follower.sent).toEqual([{ rails: [] }]);
    expect(theirs).toEqual([id(1), id(2)]);
  });

  it('fail every process with BACKEND_UNAVAILABLE saying why when a rank on node 0 could not make one (no NCCL)', async () => {
    const why = Object.assign(new Error("backend 'cuda' carries the bytes between nodes over NCCL, and rank 0 has none: not found"), { code: 'BACKEND_UNAVAILABLE' });
    const leader = rendezvous(peers, 0, [null, { rails: [] }]);
    await expect(railIds({ rv: leader, rankOffset: 0, localRanks: 2, ranksPerNode: 2, make: async () => { throw why; } })).rejects.toMatchObject({
      code: 'BACKEND_UNAVAILABLE',
      message: expect.stringMatching(/^the world spans nodes, and backend 'cuda' needs an NCCL communicator per rail; ranks \[0, 2\) \(pid 100 on host-1\) could not make its rail's id: .*rank 0 has none/),
    });
    const follower = rendezvous(peers, 1, [{ rails: [], unavailable: why.message }, null]);
    await expect(railIds({ rv: follower, rankOffset: 2, localRanks: 2, ranksPerNode: 2, make: async () => null })).rejects.toMatchObject({ code: 'BACKEND_UNAVAILABLE' });
  });

  it.each([
    ['an id that is not 128 bytes of base64', { rails: [[0, 'AAAA'], [1, b64(2)]] }, /sent NCCL rail ids that are not a rankflow group's/],
    ['an id for a rail it does not hold', { rails: [[0, b64(1)], [3, b64(2)]] }, /sent NCCL rail ids that are not a rankflow group's/],
    ['a missing rail', { rails: [[0, b64(1)]] }, /no process sent the NCCL id of rail 1/],
  ])('refuse %s with EINVAL', async (_, offer, message) => {
    const follower = rendezvous(peers, 1, [offer, null]);
    await expect(railIds({ rv: follower, rankOffset: 2, localRanks: 2, ranksPerNode: 2, make: async () => null })).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(message) });
  });
});
