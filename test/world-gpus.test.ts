// Which processes of a cuda world may share a GPU (actors/world/join.ts, meetWorld), read off the
// rendezvous table by every process alike: not two processes of one node (their kernels would
// time-slice while one waits for the other's stores), nor two ranks of one process in a world of one
// node (its one NCCL communicator refuses two ranks on a GPU); across nodes both are fine (simulated
// nodes on one GPU: the rail communicators hold one rank per node). Two "processes" here are two
// meetWorld calls of this process on a loopback rendezvous; the GPUs are the UUIDs each says it uses.
import { describe, expect, it } from 'vitest';

import { freePort } from './helpers/children.js';
import { meetWorld } from '../actors/world/join.js';

const GPU0 = 'GPU-00000000-0000-0000-0000-000000000000';
const GPU1 = 'GPU-11111111-1111-1111-1111-111111111111';

/** Two processes of ranks[0] and ranks[1] ranks on nodes nodeIds, naming these GPUs (one per rank). */
async function meet(nodeIds: [string, string], gpus: [string[], string[]]) {
  const url = `tcp://127.0.0.1:${await freePort()}`;
  const ranks = [gpus[0].length, gpus[1].length];
  const settled = await Promise.allSettled([0, 1].map((i) =>
    meetWorld({ size: ranks[0]! + ranks[1]!, rankOffset: i === 0 ? 0 : ranks[0]!, rendezvous: url, nodeId: nodeIds[i]! },
      { config: '{}', withHost: false, timeoutMs: 20_000, gpus: gpus[i]!, localRanks: ranks[i]! })));
  const nodes: number[] = [];
  for (const s of settled) if (s.status === 'fulfilled') nodes.push(s.value.nodes.count), await s.value.rv.close();
  return { errors: settled.flatMap((s) => (s.status === 'rejected' ? [s.reason as { code: string; message: string }] : [])), nodes };
}

describe('GPUs shared in a cuda world', () => {
  it('refuses two processes of one node on one GPU, with EINVAL naming devices', async () => {
    const { errors } = await meet(['n', 'n'], [[GPU0], [GPU0]]);
    expect(errors).toHaveLength(2);
    for (const e of errors)
      expect(e).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^devices: GPU GPU-0{8}-.* is used by this process and by ranks \[\d, \d\) of another of its node: a node's processes must not share a GPU/) });
  });

  it('lets two processes of different nodes (simulated nodes) share one', async () => {
    expect(await meet(['sim-node-0', 'sim-node-1'], [[GPU0], [GPU0]])).toEqual({ errors: [], nodes: [2, 2] });
  });

  it('refuses a process naming a GPU twice in a world of one node, in every process alike', async () => {
    const { errors } = await meet(['n', 'n'], [[GPU0, GPU0], [GPU1]]);
    expect(errors).toHaveLength(2);
    for (const e of errors)
      expect(e).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^devices: ranks \[0, 2\) \(pid \d+ on .*\)(, this process,)? name a GPU twice in a world of one node: .*NCCL communicator/) });
  });

  it('lets the ranks of a node share a GPU in a world that spans nodes, and the nodes share it too', async () => {
    expect(await meet(['sim-node-0', 'sim-node-1'], [[GPU0, GPU0], [GPU0, GPU0]])).toEqual({ errors: [], nodes: [2, 2] });
  });
});
