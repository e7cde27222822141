// The run ends' exchange of an elastic world (actors/world/run-exchange.ts) on its own: a leader and
// two followers wired through in-memory queues, each message delivered when the test says. The
// leader's word decides: a run completes with every process's end or is cut for all; a follower that
// hears of a leaving while it waits makes the leader cut; a cut that comes before a follower's own
// exchange ends that exchange at once; an end that came before the leaving still completes.
// At a leader's loss a follower's waits, those open and those opened before a leader is reached again,
// are decided by the takeover, not by their own clocks (a FollowerSession over a socket its leader closes).
import { describe, expect, it } from 'vitest';

import net from 'node:net';

import { AUTHENTICATED, Channel } from '../actors/world/channel.js';
import { FollowerSession } from '../actors/world/follower-session.js';
import { FollowerLive } from '../actors/world/live-exchange.js';
import { FollowerRuns, LeaderRuns } from '../actors/world/run-exchange.js';
import { RankflowError } from '../actors/core/errors.js';
import type { Incoming, Join, Message } from '../actors/world/protocol.js';
import type { RendezvousPeer } from '../actors/world/rendezvous.js';

const peer = (rankOffset: number): RendezvousPeer => ({ rankOffset, localRanks: 1, payload: {}, hostId: 'h', nodeId: 'h', pid: 100 + rankOffset });

/** A leader (index 0) and followers 1 and 2; `deliver()` hands every queued message on, in order. */
function world() {
  const lost = new Set<number>();
  const toLeader: Array<[number, Message]> = [], toFollowers: Message[] = [];
  const leader = new LeaderRuns([0, 1, 2].map(peer), 0, (i) => lost.has(i), { broadcast: (m) => void toFollowers.push(m), sendTo: () => {} }, 'test', 1 << 16, 5000);
  const followers = [1, 2].map((i) => new FollowerRuns(3, (m) => toLeader.push([i, m]), 'test', 1 << 16, 5000));
  const deliver = (): void => {
    while (toLeader.length > 0 || toFollowers.length > 0) {
      for (const [i, m] of toLeader.splice(0)) expect(leader.onMessage(i, m as Incoming)).toBeUndefined();
      for (const m of toFollowers.splice(0)) for (const f of followers) if (!lost.has(followers.indexOf(f) + 1)) expect(f.onMessage(m as Incoming)).toBeUndefined();
    }
  };
  return { leader, followers, lost, deliver, toFollowers };
}

describe('the run ends\' exchange', () => {
  it('completes with every process\'s end, in process order', async () => {
    const w = world();
    const all = [w.leader.exchange(1, 'a'), w.followers[0]!.exchange(1, 'b'), w.followers[1]!.exchange(1, 'c')];
    w.deliver();
    expect(await Promise.all(all)).toEqual([['a', 'b', 'c'], ['a', 'b', 'c'], ['a', 'b', 'c']]);
  });

  it('a follower that hears of a leaving while it waits: cut for every process, also one that gives its end later', async () => {
    const w = world();
    const waiting = [w.leader.exchange(7, 'a'), w.followers[0]!.exchange(7, 'b')];
    w.deliver();
    w.followers[0]!.hit();
    w.deliver();
    expect(await Promise.all(waiting)).toEqual([undefined, undefined]);
    expect(await w.followers[1]!.exchange(7, 'c')).toBeUndefined();  // it got the cut before it got there
  });

  it("the leader's hearing cuts what is open; what completed before stays complete", async () => {
    const w = world();
    const first = [w.leader.exchange(3, 1), w.followers[0]!.exchange(3, 2), w.followers[1]!.exchange(3, 3)];
    w.deliver();
    const second = [w.followers[0]!.exchange(4, 2), w.followers[1]!.exchange(4, 3)];
    w.deliver();
    w.leader.hit();  // heard of a leaving: run 3 is decided, run 4 open (the leader's own end not in)
    w.followers[0]!.hit();  // its word for run 4, crossing the cut, changes nothing
    w.deliver();
    expect(await Promise.all(first)).toEqual([[1, 2, 3], [1, 2, 3], [1, 2, 3]]);
    expect(await Promise.all(second)).toEqual([undefined, undefined]);
    expect(await w.leader.exchange(4, 1)).toBeUndefined();
  });

  it('a process lost before it gave its end: the others complete without it (null)', async () => {
    const w = world();
    const two = [w.leader.exchange(2, 'a'), w.followers[0]!.exchange(2, 'b')];
    w.deliver();
    w.lost.add(2);
    w.leader.recheck();
    w.deliver();
    expect(await Promise.all(two)).toEqual([['a', 'b', null], ['a', 'b', null]]);
  });

  it('refuses a follower\'s word for a run that is not a number, and an end over the limit', () => {
    const w = world();
    expect(w.leader.onMessage(1, { t: 'rx', seq: 'x', value: 1 })).toMatch(/run "x"/);
    expect(w.leader.onMessage(1, { t: 'rx', seq: 1, value: 'v'.repeat(1 << 17) })).toMatch(/byte run end/);
    expect(w.followers[0]!.onMessage({ t: 'rxall', seq: 1, values: [1] })).toMatch(/invalid result/);
  });
});

// A follower whose leader is lost: its exchanges waiting are decided by the takeover (the next leader's
// answer, or RANK_FAILED when none took over), not by their own timeout racing the takeover's.
describe("a follower's exchanges waiting when its leader is lost", () => {
  const sides = {
    "survivors' exchange": () => {
      const f = new FollowerLive(3, () => {}, 'test', 150);
      return { f, wait: () => f.exchange('v') };
    },
    "run end's exchange": () => {
      const f = new FollowerRuns(3, () => {}, 'test', 1 << 16, 150);
      return { f, wait: () => f.exchange(1, 'v') };
    },
  };
  for (const [name, make] of Object.entries(sides)) {
    it(`${name}: extendWaits starts its clock again, so the takeover's failure is what it hears; without it, its own TIMEOUT_CPU`, async () => {
      const plain = make();
      await expect(plain.wait()).rejects.toMatchObject({ code: 'TIMEOUT_CPU', message: expect.stringMatching(/no answer from the leader after \d+ ms/) });
      const { f, wait } = make();
      const waiting = wait();
      let settled = false;
      waiting.then(() => (settled = true), () => (settled = true));
      await new Promise((r) => setTimeout(r, 75));
      f.extendWaits(2000);  // the leader is lost here
      await new Promise((r) => setTimeout(r, 250));  // past its first timeout (150 ms)
      expect(settled).toBe(false);
      f.fail(new RankflowError('RANK_FAILED', 'no process took over', { rank: 0 }));
      await expect(waiting).rejects.toMatchObject({ code: 'RANK_FAILED', message: 'no process took over' });
    });
  }

  // The same for one opened after the loss, while no leader is reached yet (the survivors' re-forming
  // without the old leader, a run's end): a follower session whose leader's connection closes.
  const lostLeader = async (timeoutMs: number) => {
    const server = net.createServer();
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const accepted = new Promise<net.Socket>((r) => server.once('connection', r));
    const socket = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
    await new Promise((r) => socket.once('connect', r));
    const me: Join = { t: 'join', worldSize: 3, rankOffset: 1, localRanks: 1, payload: {}, hostId: 'h', nodeId: 'h', pid: 101 };
    const session = new FollowerSession([0, 1, 2].map(peer), new Channel(socket, AUTHENTICATED), me, timeoutMs, 'test');
    let lost!: () => void;
    const lostNow = new Promise<void>((r) => (lost = r));
    session.onLeaderLost = () => lost();  // the takeover starts here (takeover.ts); it decides below
    (await accepted).destroy();
    await lostNow;
    server.close();
    return session;
  };
  const opened = {
    "survivors' exchange": (s: FollowerSession) => s.exchangeAmongLive('v'),
    "run end's exchange": (s: FollowerSession) => s.exchangeRunEnd(1, 'v'),
  };
  for (const [name, open] of Object.entries(opened)) {
    it(`${name} opened after the loss, no leader reached yet: the takeover's failure is what it hears, not its own TIMEOUT_CPU`, async () => {
      const session = await lostLeader(150);
      const waiting = open(session);
      let settled = false;
      waiting.then(() => (settled = true), () => (settled = true));
      await new Promise((r) => setTimeout(r, 300));  // past its timeout (150 ms)
      expect(settled).toBe(false);
      session.failWorld(new RankflowError('RANK_FAILED', 'no process took over', { rank: 0 }));
      await expect(waiting).rejects.toMatchObject({ code: 'RANK_FAILED', message: 'no process took over' });
    });
  }
});
