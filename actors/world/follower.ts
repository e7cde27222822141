// A follower of a forming world (every process but the one with rankOffset 0): connects to the
// leader, retrying until it listens, sends its hello and waits for the table.
import net from 'node:net';

import { RankflowError } from '../core/errors.js';
import { Channel } from './channel.js';
import { describeMissing, sleep, type Hello, type Range } from './protocol.js';
import type { Rendezvous, RendezvousPeer } from './rendezvous.js';
import { FollowerSession } from './session.js';

// Connect retry backoff: a leader usually starts within a second of its peers.
const FIRST_BACKOFF_MS = 50;
const MAX_BACKOFF_MS = 1000;

export async function follow(
  self: Hello,
  host: string,
  port: number,
  deadline: number,
  timeoutMs: number,
  where: string,
): Promise<Rendezvous> {
  let attempts = 0;
  let lastError = '';
  let lastMissing: Range[] | undefined;
  let backoff = FIRST_BACKOFF_MS;
  for (;;) {
    const left = deadline - Date.now();
    if (left <= 0) break;
    attempts++;
    const outcome = await tryOnce(self, host, port, deadline, where, (m) => (lastMissing = m));
    if (outcome.kind === 'table') return new FollowerSession(outcome.peers, outcome.channel, self, timeoutMs, where);
    if (outcome.kind === 'error') throw outcome.error;
    lastError = outcome.reason;
    // Retry: the leader may not be listening yet (or a previous one is on its way out).
    const jitter = 0.8 + 0.4 * Math.random();
    await sleep(Math.min(backoff * jitter, Math.max(0, deadline - Date.now())));
    backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
  }
  const detail =
    lastMissing !== undefined
      ? lastMissing.length > 0
        ? `the leader reached, but ${describeMissing(lastMissing)} had not arrived`
        : 'the leader reached; every process had arrived, but some left before the table'
      : `could not reach the leader (rank 0) after ${attempts} attempts, last: ${lastError || 'none'}`;
  throw new RankflowError('TIMEOUT_CPU', `${where}: no table after ${timeoutMs} ms: ${detail}`, {
    rank: lastMissing?.[0]?.[0] ?? 0,
  });
}

type Attempt =
  | { kind: 'table'; peers: RendezvousPeer[]; channel: Channel }
  | { kind: 'error'; error: RankflowError }
  | { kind: 'retry'; reason: string };

function tryOnce(
  self: Hello,
  host: string,
  port: number,
  deadline: number,
  where: string,
  onStatus: (missing: Range[]) => void,
): Promise<Attempt> {
  return new Promise<Attempt>((resolve) => {
    const socket = net.connect({ host, port });
    const ch = new Channel(socket);
    let settled = false;
    const settle = (a: Attempt): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (a.kind !== 'table') ch.destroy();
      resolve(a);
    };
    // Bounds the connect itself (an unreachable host can take minutes) and the wait for the table.
    // Saying bye lets the leader tell "gave up" from "crashed" in its own report.
    const timer = setTimeout(() => {
      ch.send({ t: 'bye' });
      settle({ kind: 'retry', reason: 'deadline reached' });
    }, Math.max(0, deadline - Date.now()));
    let connected = false;
    socket.once('connect', () => {
      connected = true;
      ch.send(self);
    });
    ch.listen(
      (m) => {
        if (m.t === 'status') onStatus(m.missing);
        else if (m.t === 'error')
          settle({
            kind: 'error',
            error: new RankflowError(m.code, m.message, m.rank === undefined ? undefined : { rank: m.rank }),
          });
        else if (m.t === 'table') {
          // Whatever follows the table in the same chunk (a loss, say) is the session's to handle.
          ch.hold();
          settle({ kind: 'table', peers: m.peers, channel: ch });
        }
      },
      (reason) =>
        settle({ kind: 'retry', reason: !connected ? reason : `leader closed the connection before the table (${reason})` }),
    );
  });
}
