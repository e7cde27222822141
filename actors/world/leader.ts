// The leader of a forming world (the process with rankOffset 0): listens on the rendezvous
// address, admits connections under the limits for strangers, authenticates each one (auth.ts)
// before it reads a join, checks the joins (same world size, rank ranges that partition
// [0, worldSize)) and sends everyone the table.
//
// No single connection can end a forming world: only the table (every rank present) or the
// timeout does. A stranger is dropped: too many waiting connections (one more evicts the oldest),
// more than a few KiB before authenticating, no join before the deadline, a wrong token. A join
// that does not fit (malformed, another world size, a range already taken, ...) is refused, and
// only that process is told why (it fails with EINVAL); the timeout's message names the refused
// joins and counts the failed authentications, so a misconfigured world is still explained.
// Every drop is logged (NODE_DEBUG=rankflow) and reported to `onDropped`. An elastic world's leader
// keeps listening after the table: an authenticated join then is a rejoin, the session's (rejoin.ts).
import net from 'node:net';
import { debuglog } from 'node:util';

import { RankflowError, type RankflowErrorCode } from '../core/errors.js';
import { abortError } from '../core/abort.js';
import { LeaderAuth, isLoopbackHost } from './auth.js';
import { AUTHENTICATED, Channel, UNAUTHENTICATED } from './channel.js';
import {
  LIMITS, describeMissing, entryProblem, gaps, isInt, overlaps, quote, rangeOf, toPeer, who,
  type Incoming, type Join, type Message, type Range,
} from './protocol.js';
import type { Forming, Rendezvous } from './rendezvous.js';
import { LeaderSession } from './session.js';

const debug = debuglog('rankflow');

// How long a failed leader keeps telling latecomers why (see fail()).
const VERDICT_LINGER_MS = 5000;
// Refused joins the timeout's message (and the status) names: the latest ones.
const REFUSALS_NAMED = 4;

interface Waiting {
  auth: LeaderAuth;
  authenticated: boolean;
  timer: NodeJS.Timeout;
}

export async function lead(self: Join, f: Forming): Promise<Rendezvous> {
  const { host, port, where, deadline, timeoutMs, signal } = f;
  if (signal?.aborted) throw abortError(where, signal);
  const server = net.createServer();
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) => {
      const hint =
        err.code === 'EADDRINUSE'
          ? ' (another leader, i.e. a second process with rankOffset 0, a previous run still alive, or another program holds this port)'
          : err.code === 'EADDRNOTAVAIL'
            ? ` (${host} is not an address of this machine, yet this process has rankOffset 0 and must listen on it)`
            : '';
      reject(new RankflowError('EINVAL', `${where}: cannot listen: ${err.message}${hint}`, { cause: err }));
    });
    server.listen({ host, port }, () => resolve());
  });
  server.on('error', () => {}); // after listening, errors concern one connection, which says so itself
  const address = (server.address() as net.AddressInfo).address;
  if (f.key === '' && !isLoopbackHost(address)) {
    server.close();
    throw new RankflowError('EINVAL', `${where}: token is required: ${host} is ${address}, not a loopback address`);
  }
  if (signal?.aborted) {
    server.close();
    throw abortError(where, signal);
  }

  return new Promise<Rendezvous>((resolve, reject) => {
    const arrived = new Map<Channel | 'self', Join>([['self', self]]);
    // Processes that arrived and left before the table (gave up, crashed): named apart in a timeout.
    const departed = new Map<Channel, { join: Join; reason: string }>();
    // Connections not joined yet, oldest first (a Map keeps insertion order).
    const waiting = new Map<Channel, Waiting>();
    const refusals: string[] = [];
    let authFailures = 0;
    let failure: { code: RankflowErrorCode; message: string; rank?: number } | undefined;
    let formed: LeaderSession | undefined;  // an elastic world's, once the table went out

    const missing = (): Range[] => gaps([...arrived.values()], self.worldSize);
    // For reports: processes that came and left (gave up first, crashed) did arrive; naming them
    // missing would blame the wrong ranks when everyone's timeouts expire at nearly the same time.
    const departedOnly = (): Array<{ join: Join; reason: string }> =>
      [...departed.values()].filter((d) => ![...arrived.values()].some((j) => overlaps(rangeOf(j), rangeOf(d.join))));
    const neverArrived = (): Range[] => gaps([...arrived.values(), ...departedOnly().map((d) => d.join)], self.worldSize);
    const broadcast = (m: Message): void => {
      for (const ch of arrived.keys()) if (ch !== 'self') ch.send(m);
    };
    const status = (): Message => ({ t: 'status', missing: neverArrived(), refused: [...refusals] });

    // Lets go of a connection that has not joined; `tell` is its last message.
    const dismiss = (ch: Channel, reason: string, tell?: Message): void => {
      const w = waiting.get(ch);
      if (w === undefined) return;
      waiting.delete(ch);
      clearTimeout(w.timer);
      debug('%s: dropped the connection from %s after %d bytes: %s', where, ch.remote, ch.bytesReceived, reason);
      f.onDropped?.({ remote: ch.remote, reason, bytes: ch.bytesReceived });
      if (tell === undefined) ch.destroy();
      else ch.dismiss(tell);
    };
    let listening = true;
    const closeServer = (reason: string): void => {
      listening = false;
      server.close();
      for (const ch of [...waiting.keys()]) dismiss(ch, reason);
    };

    const fail = (code: RankflowErrorCode, message: string, rank?: number): void => {
      if (failure) return;
      failure = { code, message, rank };
      clearTimeout(timer);
      const m: Message = { t: 'error', code, message, rank };
      for (const ch of arrived.keys()) if (ch !== 'self') ch.end(m);
      // Keep answering (authenticated) latecomers with the verdict for a while, so processes started
      // a little later fail with the same error instead of timing out. This holds the process up to
      // VERDICT_LINGER_MS after the rejection (never past the deadline): bounded, and worth it.
      setTimeout(() => closeServer('the rendezvous had ended'), Math.max(0, Math.min(deadline - Date.now(), VERDICT_LINGER_MS)));
      signal?.removeEventListener('abort', onAbort);
      reject(new RankflowError(code, message, rank === undefined ? undefined : { rank }));
    };

    // Aborted: the processes that joined are told at once (no lingering verdict), the port is let go.
    const onAbort = (): void => {
      if (failure) return;
      failure = { code: 'RANK_FAILED', message: `${where}: the leader (rank 0's process, pid ${process.pid}) gave up: its createGroup was aborted`, rank: 0 };
      clearTimeout(timer);
      for (const ch of arrived.keys()) if (ch !== 'self') ch.end({ t: 'error', ...failure });
      closeServer('the leader gave up');
      reject(abortError(where, signal!));
    };
    signal?.addEventListener('abort', onAbort, { once: true });

    const timer = setTimeout(() => {
      const gone = departedOnly();
      const never = neverArrived();
      const parts = [`worldSize ${self.worldSize}`, `present: ${[...arrived.values()].map(who).join(', ')}`];
      if (gone.length > 0) parts.push(`left before the table: ${gone.map((d) => `${who(d.join)}, ${d.reason}`).join('; ')}`);
      if (refusals.length > 0) parts.push(`refused: ${refusals.join('; ')}`);
      if (authFailures > 0) parts.push(`${authFailures} connection${authFailures === 1 ? '' : 's'} failed authentication (wrong or missing world.token?)`);
      const first = never[0]?.[0] ?? gone[0]?.join.rankOffset;
      fail(
        'TIMEOUT_CPU',
        `${where}: after ${timeoutMs} ms ${never.length > 0 ? `${describeMissing(never)} never arrived` : 'some processes left'} (${parts.join('; ')})`,
        first,
      );
    }, Math.max(0, deadline - Date.now()));

    /** Why this join cannot be accepted, or undefined. Checks every field: the sender is not trusted. */
    const joinProblem = (m: Incoming): string | undefined => {
      if (!isInt(m.worldSize, 1, 2 ** 31 - 1)) return `worldSize ${quote(m.worldSize)} is not an integer >= 1`;
      const problem = entryProblem(m, m.worldSize);
      if (problem) return problem;
      const j = m as unknown as Join;
      if (m.rejoin !== undefined) return 'it rejoins (world.rejoin), but the world has not formed yet: a rejoin takes back a range that left a formed world';
      if (j.worldSize !== self.worldSize) return `world sizes disagree: ${who(self)} says worldSize ${self.worldSize}, ${who(j)} says ${j.worldSize}`;
      for (const other of arrived.values()) if (overlaps(rangeOf(other), rangeOf(j))) return `rank ranges overlap: ${who(other)} and ${who(j)}`;
      return undefined;
    };

    const onWaitingMessage = (ch: Channel, w: Waiting, m: Incoming): void => {
      if (!waiting.has(ch)) return;  // dismissed: what it sent after that does not count
      if (!w.authenticated) {
        const answer = w.auth.answer(m);
        if ('problem' in answer) {
          authFailures++;
          dismiss(ch, answer.problem, { t: 'denied' });
          return;
        }
        w.authenticated = true;
        ch.setLimits(AUTHENTICATED);
        ch.send(answer.proof);
        return;
      }
      if (formed) {
        waiting.delete(ch);
        clearTimeout(w.timer);
        return formed.offerRejoin(ch, m);
      }
      if (m.t !== 'join') return dismiss(ch, `sent ${quote(m.t)} instead of a join`);
      if (failure) return dismiss(ch, 'joined after the rendezvous failed (told why)', { t: 'error', ...failure });
      const problem = joinProblem(m);
      if (problem) {
        refusals.push(`${ch.remote}: ${problem}`);
        if (refusals.length > REFUSALS_NAMED) refusals.shift();
        dismiss(ch, `refused its join: ${problem}`, { t: 'error', code: 'EINVAL', message: `${where}: the leader refused this process's join: ${problem}` });
        broadcast(status());  // so that the followers' own timeouts can say it too
        return;
      }
      const j = m as unknown as Join;
      const join: Join = { t: 'join', worldSize: j.worldSize, rankOffset: j.rankOffset, localRanks: j.localRanks, payload: j.payload, hostId: j.hostId, nodeId: j.nodeId, pid: j.pid };
      waiting.delete(ch);
      clearTimeout(w.timer);
      arrived.set(ch, join);
      ch.listen(
        (later) => {
          // Before the table a process may only give up.
          const reason = later.t === 'bye' ? 'it gave up (its own timeout expired)' : `it sent ${quote(later.t)} before the table`;
          departed.set(ch, { join, reason });
          ch.drop(reason);
        },
        (reason) => {
          // A process that leaves before the table is missing again (and may come back, restarted).
          if (!arrived.delete(ch)) return;
          if (!departed.has(ch)) departed.set(ch, { join, reason });
          if (!failure) broadcast(status());
        },
      );
      maybeFinish();
    };

    const maybeFinish = (): void => {
      if (missing().length > 0) {
        broadcast(status());
        return;
      }
      // Everyone is here: send the table, stop listening, keep the connections.
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      const entries = [...arrived.entries()].sort((a, b) => a[1].rankOffset - b[1].rankOffset);
      const peers = entries.map(([, j]) => toPeer(j));
      broadcast({ t: 'table', peers });
      const channels = entries.map(([ch]) => (ch === 'self' ? undefined : ch));
      const session = new LeaderSession(peers, channels, timeoutMs, where, address);
      if (f.elastic) {
        formed = session;
        session.door = { close: () => closeServer('the world closed') };
        server.unref();  // listening for rejoins does not keep the process alive
      } else {
        closeServer('the world formed without it');
      }
      resolve(session);
    };
    // A world of one process (localRanks == worldSize) is complete before anyone connects.
    maybeFinish();

    server.on('connection', (socket) => {
      if (!listening) return void socket.destroy();
      const ch = new Channel(socket, UNAUTHENTICATED);
      if (waiting.size >= LIMITS.pendingConnections) {
        const oldest = waiting.keys().next().value!;
        dismiss(oldest, `evicted: more than ${LIMITS.pendingConnections} connections were waiting to join`);
      }
      const w: Waiting = {
        auth: new LeaderAuth(f.key),
        authenticated: false,
        timer: setTimeout(() => dismiss(ch, `no join within ${LIMITS.joinDeadlineMs} ms`), LIMITS.joinDeadlineMs),
      };
      waiting.set(ch, w);
      ch.listen(
        (m) => onWaitingMessage(ch, w, m),
        (reason) => dismiss(ch, reason),
      );
      ch.send(w.auth.challenge());
    });
  });
}
