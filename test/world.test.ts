// A host group spread over processes (API.md "More than one process"): processes meet at a TCP
// rendezvous, pass their ranks' memory fds over Unix sockets, and run every collective together.
import { afterEach, describe, expect, it } from 'vitest';

import { ensureCompiled, forkFixture, freePort, killAll, worldSources, type Child } from './helpers/children.js';
import { bf16ToFloat, createGroup, floatToBf16 } from '../actors/index.js';

const children: Child[] = [];
afterEach(() => killAll(children));

async function world(layout: number[], cpuBytes = 0): Promise<Child[]> {
  ensureCompiled('dist/actors/world/join.js', [...worldSources, 'actors/group.ts', 'actors/ranks.ts', 'actors/startup.ts', 'actors/options.ts']);
  const url = `tcp://127.0.0.1:${await freePort()}`;
  const worldSize = layout.reduce((a, b) => a + b, 0);
  let offset = 0;
  const procs = layout.map((ranks) => {
    const c = forkFixture('world-child', { url, worldSize, rankOffset: offset, ranks, cpuBytes });
    offset += ranks;
    return c;
  });
  children.push(...procs);
  return procs;
}

describe.each([[[2, 2]], [[1, 1, 1, 1]], [[1, 3]]])('a world of processes hosting %j ranks', (layout) => {
  it('forms one group whose collectives span every process', async () => {
    const procs = await world(layout, 2 * 1024 * 1024);
    const W = layout.reduce((a, b) => a + b, 0);
    const ready = await Promise.all(procs.map((c) => c.next('ready', 30_000)));
    ready.forEach((m, i) => {
      expect(m.size).toBe(layout[i]);
      expect(m.worldSize).toBe(W);
      expect(m.states).toEqual(Array(layout[i]).fill('ready'));
    });
    expect(ready.flatMap((m) => m.globals as number[])).toEqual(Array.from({ length: W }, (_, g) => g));

    const gathered = await Promise.all(procs.map((c) => c.next('allGather', 30_000)));
    const expected = Array.from({ length: W }, (_, g) => [g, g * 10]).flat();
    for (const m of gathered) for (const d of m.data as number[][]) expect(d).toEqual(expected);

    // Receive order: by source rank, then source token; rank r owns experts [r*8/W, (r+1)*8/W).
    const dispatched = (await Promise.all(procs.map((c) => c.next('dispatch', 30_000)))).flatMap((m) => m.recv as Array<{ srcRank: number[]; srcToken: number[] }>);
    const T = 5, epr = 8 / W;
    dispatched.forEach((recv, r) => {
      const want: Array<[number, number]> = [];
      for (let g = 0; g < W; g++) for (let t = 0; t < T; t++) {
        const experts = [(g + t) % 8, (g + t + 3) % 8];
        if (experts.some((e) => Math.floor(e / epr) === r)) want.push([g, t]);
      }
      expect(recv.srcRank).toEqual(want.map(([g]) => g));
      expect(recv.srcToken).toEqual(want.map(([, t]) => t));
    });

    // combine returns the sum over the ranks that received the token of its own row: x * (#dest ranks).
    const combined = (await Promise.all(procs.map((c) => c.next('combine', 30_000)))).flatMap((m) => m.x as number[][]);
    combined.forEach((firstColumn, g) => {
      firstColumn.forEach((bits, t) => {
        const dests = new Set([(g + t) % 8, (g + t + 3) % 8].map((e) => Math.floor(e / epr))).size;
        const row = bf16ToFloat(floatToBf16(g * 100 + t));  // x went out as bf16
        expect(bits).toBe(floatToBf16(Math.fround(row * dests)));
      });
    });

    const engram = (await Promise.all(procs.map((c) => c.next('engram', 30_000)))).flatMap((m) => m.rows as number[][]);
    for (const rows of engram) {
      const want = Array.from({ length: W * 4 }, (_, i) => W * 4 - 1 - i).flatMap((id) => [Math.floor(id / 4) * 1000 + (id % 4) * 2, Math.floor(id / 4) * 1000 + (id % 4) * 2 + 1]);
      expect(rows).toEqual(want);
    }
    const done = await Promise.all(procs.map((c) => c.next('done', 30_000)));
    done.forEach((m, i) => expect(m.states).toEqual(Array(layout[i]).fill('destroyed')));
    expect(await Promise.all(procs.map((c) => c.exited))).toEqual(procs.map(() => 0));
  });
});

describe('the world options', () => {
  const buffer = { maxTokensPerRank: 16, hidden: 128, topk: 2, numExperts: 8 };
  const base = { size: 2, rankOffset: 1, rendezvous: 'tcp://127.0.0.1:1' };
  it.each([
    [{ rendezvous: 'tcp://10.1.2.3:29500' }, /^world\.token: is required: the rendezvous tcp:\/\/10\.1\.2\.3:29500 is not a loopback address, .*set world\.token \(or RANKFLOW_WORLD_TOKEN\) to the same secret in every process/],
    [{ rendezvous: 'tcp://[2001:db8::1]:29500' }, /^world\.token: is required/],
    [{ token: 'short' }, /^world\.token: must be a string of 16 to 1024 characters/],
    [{ token: 42 }, /^world\.token: must be a string .*got number/],
    [{ nodeId: '' }, /^world\.nodeId: must be a non-empty string of at most 256 characters/],
    [{ nodeId: 'n'.repeat(300) }, /^world\.nodeId: must be a non-empty string/],
    [{ rendezvous: 'tcp://host:1/path' }, /^world\.rendezvous: must be 'tcp:\/\/host:port'/],
  ])('%j is rejected with EINVAL naming the option, before any rank starts', async (patch, message) => {
    await expect(createGroup({ ranks: 1, backend: 'host', buffer, world: { ...base, ...patch } as never })).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(message) });
  });
});

describe('a world with a token', () => {
  it('forms when one process names world.token and the other has it in RANKFLOW_WORLD_TOKEN', async () => {
    const token = 'world-test-token-0123456789abcdef';
    const url = `tcp://127.0.0.1:${await freePort()}`;
    const a = forkFixture('world-child', { url, worldSize: 2, rankOffset: 0, ranks: 1, token });
    const b = forkFixture('world-child', { url, worldSize: 2, rankOffset: 1, ranks: 1 }, { RANKFLOW_WORLD_TOKEN: token });
    children.push(a, b);
    await Promise.all([a.next('ready', 30_000), b.next('ready', 30_000)]);
    await Promise.all([a.next('done', 30_000), b.next('done', 30_000)]);
    expect(await Promise.all([a.exited, b.exited])).toEqual([0, 0]);
  });

  it('a process without it never joins, and says which token is missing', async () => {
    const url = `tcp://127.0.0.1:${await freePort()}`;
    const a = forkFixture('world-child', { url, worldSize: 2, rankOffset: 0, ranks: 1, token: 'world-test-token-0123456789abcdef', defaultTimeouts: true }, { RANKFLOW_RENDEZVOUS_TIMEOUT: '1.5' });
    const b = forkFixture('world-child', { url, worldSize: 2, rankOffset: 1, ranks: 1, defaultTimeouts: true }, { RANKFLOW_RENDEZVOUS_TIMEOUT: '1.5' });
    children.push(a, b);
    const [ea, eb] = await Promise.all([a.next('error', 30_000), b.next('error', 30_000)]);
    expect(ea).toMatchObject({ code: 'TIMEOUT_CPU', message: expect.stringMatching(/rank 1 never arrived .*failed authentication \(wrong or missing world\.token\?\)/) });
    expect(eb).toMatchObject({ code: 'TIMEOUT_CPU', message: expect.stringMatching(/the leader refused this process \(wrong or missing world\.token\).*needs the same world\.token \(or RANKFLOW_WORLD_TOKEN\)/) });
  });
});

describe('how long a process waits for its world', () => {
  it('is RANKFLOW_RENDEZVOUS_TIMEOUT when timeouts.cpuSeconds is not given', async () => {
    const url = `tcp://127.0.0.1:${await freePort()}`;
    const lonely = forkFixture('world-child', { url, worldSize: 2, rankOffset: 1, ranks: 1, defaultTimeouts: true }, { RANKFLOW_RENDEZVOUS_TIMEOUT: '1' });
    children.push(lonely);
    const e = await lonely.next('error', 30_000);
    expect(e).toMatchObject({ code: 'TIMEOUT_CPU', message: expect.stringMatching(/no table after 1000 ms: could not reach the leader/) });
  });

  it('is timeouts.cpuSeconds when given', async () => {
    const url = `tcp://127.0.0.1:${await freePort()}`;
    const lonely = forkFixture('world-child', { url, worldSize: 2, rankOffset: 1, ranks: 1, cpuSeconds: 1 }, { RANKFLOW_RENDEZVOUS_TIMEOUT: '600' });
    children.push(lonely);
    const e = await lonely.next('error', 30_000);
    expect(e).toMatchObject({ code: 'TIMEOUT_CPU', message: expect.stringMatching(/no table after 1000 ms/) });
  });
});

describe('processes that name different nodes', () => {
  // They form a world whose nodes share no memory (test/scaleout.test.ts runs its collectives); the
  // nodes it can have are checked here.
  it('form a two-level world: the ranks\' domains are the nodes', async () => {
    const url = `tcp://127.0.0.1:${await freePort()}`;
    const a = forkFixture('world-child', { url, worldSize: 2, rankOffset: 0, ranks: 1, nodeId: 'node-a' });
    const b = forkFixture('world-child', { url, worldSize: 2, rankOffset: 1, ranks: 1, nodeId: 'node-b' });
    children.push(a, b);
    await Promise.all([a.next('ready', 30_000), b.next('ready', 30_000)]);
    for (const c of [a, b]) expect((await c.next('done', 30_000)).states).toEqual(['destroyed']);
    expect(await Promise.all([a.exited, b.exited])).toEqual([0, 0]);
  });

  it.each([
    ['a node whose ranks are not consecutive', [['a', 1], ['b', 1], ['a', 1], ['b', 1]], /^world\.nodeId: node "a" holds rank 0 and rank 2 with ranks of another node between them: the ranks of a node must be consecutive/],
    ['nodes of different sizes', [['a', 2], ['a', 1], ['b', 1]], /^world\.nodeId: node "a" holds 3 ranks and node "b" 1: every node of a world that spans nodes must hold the same number of ranks/],
  ])('are refused with EINVAL in every process for %s', async (_, layout, message) => {
    const url = `tcp://127.0.0.1:${await freePort()}`;
    const worldSize = (layout as Array<[string, number]>).reduce((n, [, r]) => n + r, 0);
    let offset = 0;
    const procs = (layout as Array<[string, number]>).map(([node, ranks]) => {
      const c = forkFixture('world-child', { url, worldSize, rankOffset: offset, ranks, nodeId: node });
      offset += ranks;
      return c;
    });
    children.push(...procs);
    for (const e of await Promise.all(procs.map((c) => c.next('error', 30_000)))) expect(e).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(message) });
    expect(await Promise.all(procs.map((c) => c.exited))).toEqual(procs.map(() => 0));
  });
});

describe('a world that does not add up', () => {
  it('fails every process with EINVAL when their buffers differ', async () => {
    const url = `tcp://127.0.0.1:${await freePort()}`;
    const a = forkFixture('world-child', { url, worldSize: 2, rankOffset: 0, ranks: 1, cpuBytes: 0 });
    const b = forkFixture('world-child', { url, worldSize: 2, rankOffset: 1, ranks: 1, cpuBytes: 2 * 1024 * 1024 });
    children.push(a, b);
    const errors = await Promise.all([a.next('error', 30_000), b.next('error', 30_000)]);
    for (const e of errors) expect(e).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^buffer: differs between processes/) });
  });

  it('fails the survivors with RANK_FAILED naming the rank when a process dies', async () => {
    const url = `tcp://127.0.0.1:${await freePort()}`;
    const a = forkFixture('world-child', { url, worldSize: 4, rankOffset: 0, ranks: 2, cpuBytes: 0, waitMs: 300 });
    const b = forkFixture('world-child', { url, worldSize: 4, rankOffset: 2, ranks: 2, cpuBytes: 0, crash: true });
    children.push(a, b);
    await Promise.all([a.next('ready', 30_000), b.next('ready', 30_000)]);
    expect(await b.exited).toBe('SIGKILL');
    const e = await a.next('error', 30_000);
    expect(e).toMatchObject({ code: 'RANK_FAILED', message: expect.stringMatching(/rank 2/) });
    expect(await a.exited).toBe(0);
  });
});

// The origin's process is the leader (rendezvous at rankOffset 0) or a follower whose announcement
// the leader passes on to the other followers. The origin's process has cpuSeconds 1 (host waits are
// CPU waits): its rank `late` never enters the barrier, so its other rank times out there. Every
// other process waits in the same barrier with cpuSeconds 600: only the relayed failure can end
// their wait before the test's bound, and the origin's process stays alive meanwhile.
describe.each([
  { layout: [2, 2], origin: 0 },
  { layout: [1, 2, 1], origin: 1 },
])('a rank that fails while its process lives on ($layout ranks, origin in process $origin)', ({ layout, origin }) => {
  it('fails the other processes\' ranks with RANK_FAILED naming it, relayed over the rendezvous', async () => {
    const url = `tcp://127.0.0.1:${await freePort()}`;
    const worldSize = layout.reduce((x, y) => x + y, 0);
    const offsets = layout.map((_, i) => layout.slice(0, i).reduce((x, y) => x + y, 0));
    const timedOut = offsets[origin]!, late = timedOut + 1;
    const procs = layout.map((ranks, i) => forkFixture('world-child', {
      url, worldSize, rankOffset: offsets[i], ranks, cpuSeconds: i === origin ? 1 : 600, late,
    }));
    children.push(...procs);
    await Promise.all(procs.map((c) => c.next('ready', 30_000)));

    const inOrigin = await procs[origin]!.next('late', 30_000);
    expect(inOrigin.error).toMatchObject({ code: 'TIMEOUT_CPU', rank: late });
    for (const c of procs.filter((_, i) => i !== origin)) {
      const m = await c.next('late', 30_000);
      expect(m.error).toMatchObject({ code: 'RANK_FAILED', rank: timedOut, message: expect.stringMatching(new RegExp(`^rank ${timedOut} failed: .*rank ${late}`)) });
      for (const s of m.snapshot as Array<{ state: string; error?: { code: string; rank: number } }>)
        expect(s).toMatchObject({ state: 'failed', error: { code: 'RANK_FAILED', rank: timedOut } });
    }
    expect(procs[origin]!.proc.exitCode).toBe(null);  // they learned it from its process, not from its death

    for (const c of procs) c.send({ kind: 'exit' });
    expect(await Promise.all(procs.map((c) => c.exited))).toEqual(procs.map(() => 0));
  });
});

// A program error in a world of processes (API.md "Faults"): the program's process releases its peers
// in every process at once (the release crosses the rendezvous), every process's run rejects with the
// same error (the thrower's, or STATE naming the program that returned early), and every process
// recovers to the same numbers: the next collective across the world is exact.
describe('a rank program that throws or returns early in a world of 2 processes x 2 ranks', () => {
  it('every process rejects with the same error naming the rank, within a second, and the world goes on', async () => {
    const url = `tcp://127.0.0.1:${await freePort()}`;
    const faults = Array.from({ length: 8 }, (_, k) => ({ who: k % 4, at: 3 + k, how: k % 2 === 0 ? 'throw' : 'return' }));
    const procs = [0, 2].map((rankOffset) => forkFixture('world-child', { url, worldSize: 4, rankOffset, ranks: 2, cpuSeconds: 600, faults }));
    children.push(...procs);
    await Promise.all(procs.map((c) => c.next('ready', 30_000)));
    for (const f of faults) {
      const seen = await Promise.all(procs.map((c) => c.next('fault', 30_000)));
      for (const m of seen) {
        const e = m.error as { code: string; rank: number; message: string; cause: string | null; at: number };
        if (f.how === 'throw') {
          expect(e).toMatchObject({ code: 'PROGRAM_ERROR', rank: f.who, message: expect.stringMatching(new RegExp(`^rank ${f.who}'s program threw: TypeError: boom at`)) });
          expect(e.at - Number(/boom at ([\d.]+)/.exec(e.cause!)![1])).toBeLessThan(1000);
        } else {
          expect(e).toMatchObject({ code: 'STATE', rank: f.who, message: expect.stringMatching(new RegExp(`rank ${f.who}'s program returned after collective`)) });
        }
        expect(m.states).toEqual(['ready', 'ready']);
        for (const d of m.gathered as number[][]) expect(d).toEqual([0, 0, 1, -1, 2, -2, 3, -3]);
      }
    }
    expect(await Promise.all(procs.map((c) => c.exited))).toEqual([0, 0]);
  }, 120_000);
});

// Across nodes (processes with their own nodeId share no memory: the host backend's scale-out leg) a
// released op may leave part of a frame in a scale-out connection, so the ranks cannot be put back
// in step: every rank of the world fails with RANK_FAILED at once (no timeout, the same on both
// nodes; in the thrower's process the program's error is the cause), and the group must be made again.
describe('a rank program that throws in a world of 2 nodes x 2 ranks (scale-out)', () => {
  it('fails every rank with RANK_FAILED within a second, on both nodes, the program\'s error the cause where it threw', async () => {
    const url = `tcp://127.0.0.1:${await freePort()}`;
    const faults = [{ who: 1, at: 3, how: 'throw' }];
    const procs = [0, 2].map((rankOffset, i) => forkFixture('world-child', { url, worldSize: 4, rankOffset, ranks: 2, cpuSeconds: 600, nodeId: `node-${i}`, faults }));
    children.push(...procs);
    await Promise.all(procs.map((c) => c.next('ready', 30_000)));
    const seen = await Promise.all(procs.map((c) => c.next('fault', 30_000)));
    for (const m of seen) {
      const e = m.error as { code: string; message: string; cause: string | null; at: number };
      expect(e).toMatchObject({ code: 'RANK_FAILED', message: expect.stringMatching(/cannot be put back in step|scale-out connections of rank \d are broken/) });
      expect(m.states).toEqual(['failed', 'failed']);
      expect(m.gathered).toMatchObject({ code: 'RANK_FAILED' });
    }
    const thrower = seen[0]!.error as { cause: string | null; at: number };
    expect(thrower.cause).toMatch(/^rank 1's program threw: TypeError: boom at ([\d.]+)$/);
    expect(thrower.at - Number(/boom at ([\d.]+)/.exec(thrower.cause!)![1])).toBeLessThan(1000);
    expect(await Promise.all(procs.map((c) => c.exited))).toEqual([0, 0]);
  }, 120_000);
});
