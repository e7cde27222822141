// rendezvous(): processes of one world meet over TCP, agree on the table of processes, exchange
// values, and hear about peers that die. Every test forks real processes (test/fixtures).
import { afterEach, beforeAll, describe, expect, it } from 'vitest';

import { rendezvous, type RendezvousPeer } from '../actors/world/rendezvous.js';
import { RankflowError } from '../actors/core/errors.js';
import { ensureCompiled, forkFixture, freePort, killAll, worldSources, type Child, type Message } from './helpers/children.js';

const children: Child[] = [];
afterEach(() => killAll(children));
beforeAll(() => ensureCompiled('dist/actors/world/rendezvous.js', worldSources), 120_000);

interface Proc {
  rankOffset: number;
  localRanks: number;
  worldSize: number;
}

async function start(procs: Proc[], timeoutMs = 10_000, delays: number[] = []): Promise<Child[]> {
  const url = `tcp://127.0.0.1:${await freePort()}`;
  const started: Child[] = [];
  for (const [i, p] of procs.entries()) {
    if (delays[i]) await new Promise((r) => setTimeout(r, delays[i]));
    const c = forkFixture('rendezvous-peer', { url, timeoutMs, payload: { tag: `p${p.rankOffset}` }, ...p });
    children.push(c);
    started.push(c);
  }
  return started;
}

function expectTable(peers: RendezvousPeer[], procs: Proc[]): void {
  const sorted = [...procs].sort((a, b) => a.rankOffset - b.rankOffset);
  expect(peers.map((p) => [p.rankOffset, p.localRanks])).toEqual(sorted.map((p) => [p.rankOffset, p.localRanks]));
  expect(peers.map((p) => p.payload)).toEqual(sorted.map((p) => ({ tag: `p${p.rankOffset}` })));
  // All on this machine: one host id, the one that says "fds can be passed".
  expect(new Set(peers.map((p) => p.hostId)).size).toBe(1);
}

describe('rendezvous', () => {
  it('two processes agree on the table and exchange values in rank order', async () => {
    const procs = [
      { rankOffset: 0, localRanks: 1, worldSize: 2 },
      { rankOffset: 1, localRanks: 1, worldSize: 2 },
    ];
    const cs = await start(procs);
    const ready = await Promise.all(cs.map((c) => c.next('ready')));
    for (const [i, m] of ready.entries()) {
      expectTable(m.peers as RendezvousPeer[], procs);
      expect(m.self).toBe(i);
      expect(m.values).toEqual(cs.map((c, j) => ({ rankOffset: j, pid: c.proc.pid })));
    }
    for (const c of cs) c.send({ cmd: 'close' });
    expect(await Promise.all(cs.map((c) => c.exited))).toEqual([0, 0]);
  });

  it('four processes with uneven rank ranges meet even when the leader starts last', async () => {
    // Started out of order: followers retry until the leader (rankOffset 0) listens.
    const procs = [
      { rankOffset: 3, localRanks: 2, worldSize: 6 },
      { rankOffset: 2, localRanks: 1, worldSize: 6 },
      { rankOffset: 5, localRanks: 1, worldSize: 6 },
      { rankOffset: 0, localRanks: 2, worldSize: 6 },
    ];
    const cs = await start(procs, 10_000, [0, 0, 0, 500]);
    const ready = await Promise.all(cs.map((c) => c.next('ready')));
    const order = [3, 1, 0, 2]; // index of each started process in rankOffset order
    for (const [i, m] of ready.entries()) {
      expectTable(m.peers as RendezvousPeer[], procs);
      expect(m.self).toBe([2, 1, 3, 0][i]);
      expect((m.values as Array<{ rankOffset: number }>).map((v) => v.rankOffset)).toEqual([0, 2, 3, 5]);
    }
    // Later exchanges reuse the connections, in call order.
    for (const [i, c] of cs.entries()) c.send({ cmd: 'exchange', value: `second from ${procs[i]!.rankOffset}` });
    const second = await Promise.all(cs.map((c) => c.next('exchanged')));
    for (const m of second) expect(m.values).toEqual(order.map((j) => `second from ${procs[j]!.rankOffset}`));
    for (const c of cs) c.send({ cmd: 'close' });
    expect(await Promise.all(cs.map((c) => c.exited))).toEqual([0, 0, 0, 0]);
  });

  it('mismatched world sizes fail with EINVAL in every process, naming both', async () => {
    const cs = await start([
      { rankOffset: 0, localRanks: 1, worldSize: 3 },
      { rankOffset: 1, localRanks: 1, worldSize: 3 },
      { rankOffset: 2, localRanks: 1, worldSize: 4 },
    ]);
    const errors = await Promise.all(cs.map((c) => c.next('error')));
    for (const e of errors) {
      expect(e.code).toBe('EINVAL');
      expect(e.message).toMatch(/world sizes disagree: rank 0 \(pid \d+ on .*\) says worldSize 3, rank 2 \(pid \d+ on .*\) says 4/);
    }
  });

  it('overlapping rank ranges fail with EINVAL naming both processes', async () => {
    const cs = await start([
      { rankOffset: 0, localRanks: 2, worldSize: 3 },
      { rankOffset: 1, localRanks: 2, worldSize: 3 },
    ]);
    for (const e of await Promise.all(cs.map((c) => c.next('error')))) {
      expect(e.code).toBe('EINVAL');
      expect(e.message).toMatch(/rank ranges overlap: ranks \[0, 2\) .* and ranks \[1, 3\)/);
    }
  });

  it('a missing process fails everyone with TIMEOUT_CPU naming its ranks, within the timeout', async () => {
    const timeoutMs = 1500;
    const cs = await start(
      [
        { rankOffset: 0, localRanks: 1, worldSize: 5 },
        { rankOffset: 1, localRanks: 1, worldSize: 5 },
        { rankOffset: 4, localRanks: 1, worldSize: 5 },
      ],
      timeoutMs,
    );
    const errors = await Promise.all(cs.map((c) => c.next('error')));
    for (const e of errors) {
      expect(e.code).toBe('TIMEOUT_CPU');
      expect(e.message).toContain('ranks [2, 4)');
      expect(e.rank).toBe(2);
      expect(e.elapsedMs).toBeLessThan(timeoutMs + 500);
    }
    // The leader waits its full timeout; a follower may hear the leader's verdict a bit before its own.
    expect(errors[0]!.elapsedMs).toBeGreaterThanOrEqual(timeoutMs - 20);
    expect(errors[0]!.message).toMatch(/after 1500 ms ranks \[2, 4\) never arrived/);
    // Failed processes exit by themselves: no socket or timer of the rendezvous is left behind.
    expect(await Promise.all(cs.map((c) => c.exited))).toEqual([0, 0, 0]);
  });

  it('a follower that cannot reach the leader says so after its timeout', async () => {
    const [c] = await start([{ rankOffset: 1, localRanks: 1, worldSize: 2 }], 800);
    const e = await c!.next('error');
    expect(e.code).toBe('TIMEOUT_CPU');
    expect(e.message).toMatch(/could not reach the leader \(rank 0\) after \d+ attempts, last: ECONNREFUSED/);
    expect(e.elapsedMs).toBeLessThan(800 + 500);
  });

  it('a crashed follower is reported to every survivor, and their pending exchange fails with RANK_FAILED', async () => {
    const cs = await start([
      { rankOffset: 0, localRanks: 1, worldSize: 3 },
      { rankOffset: 1, localRanks: 1, worldSize: 3 },
      { rankOffset: 2, localRanks: 1, worldSize: 3 },
    ]);
    await Promise.all(cs.map((c) => c.next('ready')));
    const [leader, victim, other] = cs as [Child, Child, Child];
    leader.send({ cmd: 'exchange', value: 0 });
    other.send({ cmd: 'exchange', value: 2 });
    victim.send({ cmd: 'crash' });
    expect(await victim.exited).toBe('SIGKILL');
    for (const c of [leader, other]) {
      const lost = (await c.next('lost')).lost as Message;
      expect(lost).toMatchObject({ rankOffset: 1, localRanks: 1 });
      const e = await c.next('exchange-error');
      expect(e.code).toBe('RANK_FAILED');
      expect(e.rank).toBe(1);
      expect(e.message).toMatch(/rank 1 \(pid \d+ on .*\) was lost/);
    }
  });

  it('a crashed leader is reported to every follower', async () => {
    const cs = await start([
      { rankOffset: 0, localRanks: 2, worldSize: 4 },
      { rankOffset: 2, localRanks: 1, worldSize: 4 },
      { rankOffset: 3, localRanks: 1, worldSize: 4 },
    ]);
    await Promise.all(cs.map((c) => c.next('ready')));
    cs[0]!.send({ cmd: 'crash' });
    for (const c of cs.slice(1)) expect((await c.next('lost')).lost).toMatchObject({ rankOffset: 0, localRanks: 2 });
  });

  it('a world of one process completes at once, and exchange returns its own value', async () => {
    const r = await rendezvous({ url: `tcp://127.0.0.1:${await freePort()}`, worldSize: 2, rankOffset: 0, localRanks: 2, timeoutMs: 1000 });
    expect(r.peers).toHaveLength(1);
    expect(await r.exchange({ a: 1 })).toEqual([{ a: 1 }]);
    await r.close();
    await expect(r.exchange(1)).rejects.toMatchObject({ code: 'STATE' });
  });

  it('bad options reject with EINVAL naming the option', async () => {
    const base = { url: 'tcp://127.0.0.1:1', worldSize: 2, rankOffset: 0, localRanks: 1, timeoutMs: 100 };
    const cases: Array<[Partial<typeof base>, RegExp]> = [
      [{ url: 'http://x:1' }, /url must look like tcp:\/\/host:port/],
      [{ url: 'tcp://x' }, /url must look like/],
      [{ worldSize: 0 }, /worldSize must be an integer >= 1/],
      [{ rankOffset: 1, localRanks: 2 }, /ranks \[1, 3\) do not fit in worldSize 2/],
      [{ localRanks: 1.5 }, /localRanks must be an integer/],
      [{ timeoutMs: 0 }, /timeoutMs must be/],
    ];
    for (const [patch, message] of cases) {
      const p = rendezvous({ ...base, ...patch });
      await expect(p).rejects.toBeInstanceOf(RankflowError);
      await expect(p).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(message) });
    }
  });
});
