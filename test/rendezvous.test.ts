// rendezvous(): processes of one world meet over TCP, agree on the table of processes, exchange
// values, and hear about peers that die; strangers on the port (no token, a wrong token, garbage,
// floods, impostors) are dropped while the world forms. Every world is made of real processes
// (test/fixtures); the strangers are raw sockets of this process (test/helpers/stranger.ts).
import net from 'node:net';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';

import { rendezvous, type RendezvousPeer } from '../actors/world/rendezvous.js';
import { RankflowError } from '../actors/core/errors.js';
import { tokenProblem } from '../actors/world/auth.js';
import { ensureCompiled, forkFixture, freePort, killAll, worldSources, type Child, type Message } from './helpers/children.js';
import { authenticate, connectStranger, joinLine, waitFor, type Stranger } from './helpers/stranger.js';

const children: Child[] = [];
afterEach(() => killAll(children));
beforeAll(() => ensureCompiled('dist/actors/world/rendezvous.js', worldSources), 120_000);

interface Proc {
  rankOffset: number;
  localRanks: number;
  worldSize: number;
  token?: string;
  nodeId?: string;
}

const TOKEN = 'the-test-world-token-0123456789abcdef';

async function start(procs: Proc[], timeoutMs = 10_000, delays: number[] = [], url?: string): Promise<Child[]> {
  url ??= `tcp://127.0.0.1:${await freePort()}`;
  const started: Child[] = [];
  for (const [i, p] of procs.entries()) {
    if (delays[i]) await new Promise((r) => setTimeout(r, delays[i]));
    const c = forkFixture('rendezvous-peer', { url, timeoutMs, payload: { tag: `p${p.rankOffset}` }, ...p });
    children.push(c);
    started.push(c);
  }
  return started;
}

async function closeAll(cs: Child[]): Promise<void> {
  for (const c of cs) c.send({ cmd: 'close' });
  expect(await Promise.all(cs.map((c) => c.exited))).toEqual(cs.map(() => 0));
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

  it('a process whose world size disagrees is refused with EINVAL naming both; the others time out naming it', async () => {
    // The leader cannot tell a misconfigured process from a stranger that claims a range: the join
    // is refused (that process fails at once), the world goes on waiting for the rest.
    const cs = await start([
      { rankOffset: 0, localRanks: 1, worldSize: 3 },
      { rankOffset: 1, localRanks: 1, worldSize: 3 },
      { rankOffset: 2, localRanks: 1, worldSize: 4 },
    ], 1500);
    const [leader, follower, odd] = await Promise.all(cs.map((c) => c.next('error')));
    const disagree = /world sizes disagree: rank 0 \(pid \d+ on .*\) says worldSize 3, rank 2 \(pid \d+ on .*\) says 4/;
    expect(odd).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/the leader refused this process's join: world sizes disagree/) });
    expect(odd!.message).toMatch(disagree);
    // The leader's verdict, or the follower's own timeout a moment before it: both say why.
    for (const e of [leader!, follower!]) {
      expect(e.code).toBe('TIMEOUT_CPU');
      expect(e.message).toMatch(/rank 2 (never|had not) arrived.*refused: 127\.0\.0\.1:\d+: world sizes disagree/);
      expect(e.message).toMatch(disagree);
    }
  });

  it('overlapping rank ranges: the second process is refused with EINVAL naming both', async () => {
    const cs = await start([
      { rankOffset: 0, localRanks: 2, worldSize: 3 },
      { rankOffset: 1, localRanks: 2, worldSize: 3 },
    ], 1500);
    const [leader, second] = await Promise.all(cs.map((c) => c.next('error')));
    expect(second).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/refused this process's join: rank ranges overlap: ranks \[0, 2\) .* and ranks \[1, 3\)/) });
    expect(leader).toMatchObject({ code: 'TIMEOUT_CPU', message: expect.stringMatching(/rank 2 never arrived .*refused: .*rank ranges overlap: ranks \[0, 2\) .* and ranks \[1, 3\)/) });
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
      [{ url: 'tcp://10.1.2.3:29500', rankOffset: 1 }, /token is required: 10\.1\.2\.3 is not a loopback address/],
      [{ url: 'tcp://0.0.0.0:29500' }, /token is required/],
      [{ token: 'short' } as never, /token must be a string of 16 to 1024 characters/],
      // UTF-8 turns a lone surrogate into U+FFFD: '...\uD800' and '...\uDBFF' would be the same key
      [{ token: 'a-token-of-enough-length\uD800' } as never, /token must be well-formed text: it holds a lone surrogate/],
      [{ token: '\uDC00a-token-of-enough-length' } as never, /token must be well-formed text/],
      [{ nodeId: '' } as never, /nodeId must be a non-empty string of at most 256 characters/],
      [{ payload: null } as never, /payload must be a JSON object/],
    ];
    for (const [patch, message] of cases) {
      const p = rendezvous({ ...base, ...patch });
      await expect(p).rejects.toBeInstanceOf(RankflowError);
      await expect(p).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(message) });
    }
  });
});

it('a token with a surrogate pair (an emoji) is fine; only a lone surrogate is refused', () => {
  expect(tokenProblem('a-token-with-an-emoji-\u{1F600}-in-it')).toBeUndefined();
  expect(tokenProblem('a-token-of-enough-length\uD800')).toMatch(/lone surrogate/);
  expect(tokenProblem('a-token-of-enough-length\uDBFF')).toMatch(/lone surrogate/);
});

describe('the table', () => {
  it("carries each process's nodeId: the one it names, or its host id by default", async () => {
    const cs = await start([
      { rankOffset: 0, localRanks: 1, worldSize: 2 },
      { rankOffset: 1, localRanks: 1, worldSize: 2, nodeId: 'node-b' },
    ]);
    for (const m of await Promise.all(cs.map((c) => c.next('ready')))) {
      const [a, b] = m.peers as RendezvousPeer[];
      expect(a!.nodeId).toBe(a!.hostId);
      expect(b!.nodeId).toBe('node-b');
    }
    await closeAll(cs);
  });
});

// A world of 3 whose rank 2 arrives last: strangers come while ranks 0 and 1 wait for it.
async function formingWorld(token: string | undefined, timeoutMs = 20_000): Promise<{ port: number; url: string; waiting: Child[]; finish: () => Promise<Message[]> }> {
  const port = await freePort();
  const url = `tcp://127.0.0.1:${port}`;
  const t = token === undefined ? {} : { token };
  const waiting = await start([{ rankOffset: 0, localRanks: 1, worldSize: 3, ...t }, { rankOffset: 1, localRanks: 1, worldSize: 3, ...t }], timeoutMs, [], url);
  return {
    port,
    url,
    waiting,
    finish: async () => {
      const [last] = await start([{ rankOffset: 2, localRanks: 1, worldSize: 3, ...t }], timeoutMs, [], url);
      const all = [...waiting, last!];
      const ready = await Promise.all(all.map((c) => c.next('ready')));
      // Only the three processes are in the world.
      for (const m of ready) expect((m.peers as RendezvousPeer[]).map((p) => p.pid)).toEqual(all.map((c) => c.proc.pid));
      await closeAll(all);
      return waiting[0]!.taken('dropped');  // the leader's drops, all reported before its 'ready'
    },
  };
}

const reasons = (drops: Message[]): string[] => drops.map((d) => d.reason as string);

describe('strangers while a world forms', () => {
  it('no token, a wrong token, garbage and impostors claiming the missing range are dropped; the world forms', async () => {
    const w = await formingWorld(TOKEN);

    const http = await connectStranger(w.port);
    expect((await http.next())?.t).toBe('challenge');
    http.write('GET / HTTP/1.1\r\nHost: rankflow\r\n\r\n');
    const binary = await connectStranger(w.port);
    binary.write(Buffer.concat([Buffer.from(Array.from({ length: 4000 }, (_, i) => 128 + (i % 128))), Buffer.from('\n')]));

    // Impostors: they answer the challenge with no token or a wrong one, and send a join for the
    // missing rank 2 right behind (with this world's size, a plausible payload).
    const impostors: Stranger[] = [];
    for (const token of ['', 'a-wrong-token-of-enough-length']) {
      const s = await connectStranger(w.port);
      impostors.push(s);
      expect(await authenticate(s, token, joinLine({ rankOffset: 2 }))).toBe('denied');
    }
    await Promise.all([http, binary, ...impostors].map((s) => s.closed));
    for (const s of impostors) expect(s.received.map((m) => m.t)).toEqual(['challenge', 'denied']);
    expect(http.received.map((m) => m.t)).toEqual(['challenge']);

    const dropped = reasons(await w.finish());
    expect(dropped.filter((r) => r === 'sent a line that is not JSON')).toHaveLength(2);
    expect(dropped.filter((r) => r === 'failed authentication (wrong or missing world.token)')).toHaveLength(2);
    expect(dropped.filter((r) => /join/.test(r) && !/formed/.test(r))).toEqual([]);  // no join was ever read from them
  });

  it('idle connections past the cap evict the oldest waiting ones; the world forms', async () => {
    const w = await formingWorld(TOKEN);
    const idle = await Promise.all(Array.from({ length: 48 }, () => connectStranger(w.port)));
    // At most 32 connections wait to join: the leader lets the oldest go as the others arrive.
    await waitFor('16 idle connections evicted', () => idle.filter((s) => s.gone).length >= 16);
    const dropped = reasons(await w.finish());
    expect(dropped.filter((r) => r === 'evicted: more than 32 connections were waiting to join').length).toBeGreaterThanOrEqual(16);
    await Promise.all(idle.map((s) => s.closed));  // the rest go when the world has formed
    for (const s of idle) expect(s.received.map((m) => m.t)).toEqual(['challenge']);
  });

  it('a stranger streaming megabytes without a newline is cut off after 8 KiB, a member after a 4 MiB line; the world forms', async () => {
    const w = await formingWorld(TOKEN);
    const flood = Buffer.alloc(16 << 20, 0x78);
    const stranger = await connectStranger(w.port);
    stranger.write(flood);
    const member = await connectStranger(w.port);
    expect(await authenticate(member, TOKEN)).toBe('proof');
    member.write(flood);
    await Promise.all([stranger.closed, member.closed]);

    const drops = await w.finish();
    // What the leader took in, counted by the leader: the cap plus at most one socket read (64 KiB).
    const before = drops.filter((d) => d.reason === 'sent more than 8192 bytes before authenticating');
    expect(before).toHaveLength(1);
    expect(before[0]!.bytes).toBeGreaterThan(8192);
    expect(before[0]!.bytes).toBeLessThanOrEqual(8192 + 65536);
    const after = drops.filter((d) => d.reason === 'sent a line longer than 4194304 bytes');
    expect(after).toHaveLength(1);
    expect(after[0]!.bytes).toBeGreaterThan(4 << 20);
    expect(after[0]!.bytes).toBeLessThanOrEqual((4 << 20) + 65536 + 1024);
  });

  it('a connection that does not join within the deadline is dropped', async () => {
    const w = await formingWorld(TOKEN);
    const silent = await connectStranger(w.port);
    const authenticated = await connectStranger(w.port);
    expect(await authenticate(authenticated, TOKEN)).toBe('proof');
    await Promise.all([silent.closed, authenticated.closed]);
    const dropped = reasons(await w.finish());
    expect(dropped.filter((r) => r === 'no join within 5000 ms')).toHaveLength(2);
  });
});

describe.each([
  { world: 'a world with a token, joins from members that know it', token: TOKEN },
  { world: 'a world without a token, joins from anyone on loopback', token: undefined },
])('joins that do not fit ($world)', ({ token }) => {
  it('are refused one by one, each told why with EINVAL; the world forms', async () => {
    const w = await formingWorld(token);
    const bad: Array<[Record<string, unknown>, RegExp]> = [
      [{ worldSize: '3' }, /^worldSize "3" is not an integer >= 1$/],
      [{ worldSize: 5 }, /^world sizes disagree: rank 0 \(pid \d+ on .*\) says worldSize 3, rank 2 \(pid 424242 on impostor\) says 5$/],
      [{ rankOffset: 2.5 }, /^rankOffset 2\.5 is not an integer in \[0, 3\)$/],
      [{ rankOffset: 0 }, /^rank ranges overlap: rank 0 \(pid \d+ on .*\) and rank 0 \(pid 424242 on impostor\)$/],
      [{ localRanks: 2 }, /^localRanks 2 is not an integer in \[1, 1\]$/],
      [{ payload: null }, /^payload null is not an object$/],
      [{ payload: [1] }, /^payload \[1\] is not an object$/],
      [{ payload: { big: 'x'.repeat(20_000) } }, /^payload is 20010 bytes of JSON, more than 16384$/],
      [{ nodeId: '' }, /^nodeId "" is not a string of 1 to 256 characters$/],
      [{ hostId: 7 }, /^hostId 7 is not a string/],
      [{ pid: -1 }, /^pid -1 is not a pid$/],
    ];
    for (const [patch, problem] of bad) {
      const s = await connectStranger(w.port);
      expect(await authenticate(s, token ?? '')).toBe('proof');
      s.write(joinLine(patch));
      const answer = await s.next();
      expect(answer).toMatchObject({ t: 'error', code: 'EINVAL' });
      const said = (answer!.message as string).replace(/^rendezvous at tcp:\/\/127\.0\.0\.1:\d+: the leader refused this process's join: /, '');
      expect(said).toMatch(problem);
      await s.closed;
    }
    const dropped = reasons(await w.finish()).filter((r) => r.startsWith('refused its join: '));
    expect(dropped).toHaveLength(bad.length);
  });
});

describe('the token', () => {
  it('a follower with a wrong token is refused; both sides name the token at their timeouts', async () => {
    const [leader, follower] = await start([
      { rankOffset: 0, localRanks: 1, worldSize: 2, token: TOKEN },
      { rankOffset: 1, localRanks: 1, worldSize: 2, token: 'not-the-world-token-at-all' },
    ], 1500);
    const f = await follower!.next('error');
    expect(f.code).toBe('TIMEOUT_CPU');
    expect(f.message).toMatch(/no authenticated leader after \d+ attempts \(\d+ failed the handshake, last: the leader refused this process \(wrong or missing world\.token\)\); every process of the world needs the same world\.token \(or RANKFLOW_WORLD_TOKEN\)/);
    const l = await leader!.next('error');
    expect(l.code).toBe('TIMEOUT_CPU');
    expect(l.message).toMatch(/rank 1 never arrived .*; \d+ connections? failed authentication \(wrong or missing world\.token\?\)\)$/);
  });

  it('a follower does not send its join to a leader that cannot prove the token', async () => {
    // A fake leader: a proper challenge, then a proof it cannot have made.
    const lines: string[] = [];
    const fake = net.createServer((socket) => {
      socket.on('error', () => {});
      socket.write(`${JSON.stringify({ t: 'challenge', proto: 'rankflow-rendezvous/2', nonce: 'n'.repeat(43) })}\n`);
      let buffer = '';
      socket.on('data', (chunk) => {
        buffer += chunk.toString();
        for (let nl = buffer.indexOf('\n'); nl >= 0; nl = buffer.indexOf('\n')) {
          lines.push(buffer.slice(0, nl));
          buffer = buffer.slice(nl + 1);
          socket.write(`${JSON.stringify({ t: 'proof', mac: 'A'.repeat(43) })}\n`);
        }
      });
    });
    await new Promise<void>((resolve) => fake.listen(0, '127.0.0.1', resolve));
    try {
      const url = `tcp://127.0.0.1:${(fake.address() as net.AddressInfo).port}`;
      const [follower] = await start([{ rankOffset: 1, localRanks: 1, worldSize: 2, token: TOKEN }], 1500, [], url);
      const e = await follower!.next('error');
      expect(e.code).toBe('TIMEOUT_CPU');
      expect(e.message).toMatch(/failed the handshake, last: it could not prove that it knows the token/);
      expect(lines.length).toBeGreaterThan(0);
      for (const line of lines) expect(JSON.parse(line)).toMatchObject({ t: 'auth' });  // never a join
    } finally {
      await new Promise((resolve) => fake.close(resolve));
    }
  });

  it('a member that breaks the protocol after the table is cut off and reported lost, with what it sent', async () => {
    const port = await freePort();
    const [leader] = await start([{ rankOffset: 0, localRanks: 1, worldSize: 2, token: TOKEN }], 10_000, [], `tcp://127.0.0.1:${port}`);
    const member = await connectStranger(port);
    const join = { t: 'join', worldSize: 2, rankOffset: 1, localRanks: 1, payload: {}, hostId: 'member/host', nodeId: 'member', pid: process.pid };
    expect(await authenticate(member, TOKEN, `${JSON.stringify(join)}\n`)).toBe('proof');
    expect((await member.next())?.t).toBe('table');
    member.write(`${JSON.stringify({ t: 'x', seq: 1e9, value: 1 })}\n`);
    await member.closed;
    expect((await leader!.next('lost')).lost).toMatchObject({ rankOffset: 1, reason: expect.stringMatching(/^it sent a value for exchange #1000000000 while the leader is at #1, seen by the leader$/) });
    expect(await leader!.next('exchange-error')).toMatchObject({ code: 'RANK_FAILED', rank: 1 });
  });
});
