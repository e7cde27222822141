// The rejoins' exchanges of an elastic world (actors/world/live-exchange.ts LeaderJoins) on their own:
// a leader and two followers wired through in-memory queues, each message delivered when the test
// says. A rejoin that ended part-way leaves the survivors at different counts (one gave its join point,
// another never heard of it, its value still on the way); the next rejoin's round starts past all of
// them, so its exchanges pair its own values: never an ended rejoin's. Plain counters (LeaderLive) would
// pair follower 2's first value with follower 1's stale one (the race seen in leader-losses.test.ts).
import { describe, expect, it } from 'vitest';

import { FollowerLive, LeaderJoins, REJOIN, type LiveHandOver } from '../actors/world/live-exchange.js';
import type { Incoming, Message } from '../actors/world/protocol.js';
import type { RendezvousPeer } from '../actors/world/rendezvous.js';

const peer = (rankOffset: number): RendezvousPeer => ({ rankOffset, localRanks: 1, payload: {}, hostId: 'h', nodeId: 'h', pid: 100 + rankOffset });

/** A leader (index 0) and followers 1 and 2; `deliver()` hands every queued message on, in order. */
function world() {
  const toLeader: Array<[number, Message]> = [], toFollowers: Message[] = [];
  const leader = new LeaderJoins([0, 1, 2].map(peer), 0, () => false, { broadcast: (m) => void toFollowers.push(m), sendTo: () => {} }, 'test', 5000);
  const followers = [1, 2].map((i) => new FollowerLive(3, (m) => toLeader.push([i, m]), 'test', 5000, REJOIN));
  const deliver = (): void => {
    while (toLeader.length > 0 || toFollowers.length > 0) {
      for (const [i, m] of toLeader.splice(0)) expect(leader.onMessage(i, m as Incoming)).toBeUndefined();
      for (const m of toFollowers.splice(0)) for (const f of followers) expect(f.onMessage(m as Incoming)).toBeUndefined();
    }
  };
  /** A rejoin begins: the leader's round, each follower told its base ('rejoining'). */
  const begin = (): number => {
    const base = leader.newRound();
    for (const f of followers) (f.endRound(), f.startAt(base));
    return base;
  };
  return { leader, followers, deliver, begin };
}

describe("the rejoins' exchanges: one round per rejoin", () => {
  it('a rejoin that ended after one survivor gave its join point: the next pairs only its own values', async () => {
    const w = world();
    expect(w.begin()).toBe(0);
    const stale = w.followers[0]!.exchange({ at: 5, rejoin: 1 });  // follower 1's join point; the leader and follower 2 never give theirs
    stale.catch(() => {});
    // the rejoin ends (its process left) before that value reaches the leader; the next one begins
    expect(w.begin()).toBe(2);
    await expect(stale).rejects.toMatchObject({ code: 'RANK_FAILED' });
    w.deliver();  // the stale value arrives now: dropped (below the leader's count), not taken as the new round's
    const agree = [w.leader.exchange({ at: 7, rejoin: 2 }), w.followers[0]!.exchange({ at: 7, rejoin: 2 }), w.followers[1]!.exchange({ at: 8, rejoin: 2 })];
    w.deliver();
    const want = [{ at: 7, rejoin: 2 }, { at: 7, rejoin: 2 }, { at: 8, rejoin: 2 }];
    expect(await Promise.all(agree)).toEqual([want, want, want]);
    const numbers = [w.leader.exchange({ seq: 2 }), w.followers[0]!.exchange({ seq: 2 }), w.followers[1]!.exchange({ seq: 2 })];
    w.deliver();
    expect((await Promise.all(numbers)).flat()).toEqual(Array(9).fill({ seq: 2 }));
    expect(w.begin()).toBe(4);  // after a whole round: two past its base
  });

  it("a rejoin that ended after the leader had a follower's value: that gathering ends, the next round starts past it", async () => {
    const w = world();
    w.begin();
    const mine = w.leader.exchange('a1');
    const theirs = w.followers[1]!.exchange('c1');
    for (const p of [mine, theirs]) p.catch(() => {});
    w.deliver();  // the leader holds 'a1' and 'c1', waits for follower 1
    expect(w.begin()).toBe(2);
    await expect(mine).rejects.toMatchObject({ code: 'RANK_FAILED' });
    await expect(theirs).rejects.toMatchObject({ code: 'RANK_FAILED' });
    const agree = [w.leader.exchange('a2'), w.followers[0]!.exchange('b2'), w.followers[1]!.exchange('c2')];
    w.deliver();
    expect(await Promise.all(agree)).toEqual([['a2', 'b2', 'c2'], ['a2', 'b2', 'c2'], ['a2', 'b2', 'c2']]);
  });

  it('a new leader (takeover): its first round starts past every survivor\'s count, given in the resumes', () => {
    const toFollowers: Message[] = [];
    const leader = new LeaderJoins([0, 1, 2].map(peer), 1, () => false, { broadcast: (m) => void toFollowers.push(m), sendTo: () => {} }, 'test', 5000);
    const own: LiveHandOver = { at: 2, waiting: [], done: [] };
    leader.adopt(own);
    leader.resume(2, { at: 3, waiting: [{ seq: 3, value: 'stale' }], done: [] });  // its wait ended with the old leader; the value is not gathered
    expect(leader.newRound()).toBe(4);
    expect(toFollowers).toEqual([]);
  });
});
