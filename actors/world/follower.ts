// A follower of a forming world (every process but the one with rankOffset 0, and every rejoiner): connects to the
// leader, retrying until it listens; answers its challenge and checks its proof (auth.ts), so the
// table comes from a process that knows the token; sends its join and waits for the table.
//
// Whatever answers at the address and fails the handshake (not a rankflow leader, another world's
// leader lingering on the port, a wrong token on either side) is left and retried until the
// deadline; the timeout then says which it was. Messages from the leader are checked like any
// other socket's (protocol.ts): a malformed one ends the attempt.
import net from 'node:net';
import { debuglog } from 'node:util';

import { RankflowError } from '../core/errors.js';
import { abortError, sleepUnless } from '../core/abort.js';
import { FollowerAuth, isLoopbackHost } from './auth.js';
import { AUTHENTICATED, Channel, UNAUTHENTICATED } from './channel.js';
import { LIMITS, describeMissing, errorProblem, isText, rangesProblem, refusedProblem, tableProblem, type Incoming, type Join, type Range } from './protocol.js';
import type { Forming, RejoinedAt, Rendezvous, RendezvousPeer } from './rendezvous.js';
import { rejoinedProblem, toRejoined } from './rejoin.js';
import { FollowerSession } from './follower-session.js';

const debug = debuglog('rankflow');

// Connect retry backoff: a leader usually starts within a second of its peers.
const FIRST_BACKOFF_MS = 50;
const MAX_BACKOFF_MS = 1000;

export async function follow(self: Join, f: Forming): Promise<Rendezvous> {
  const { deadline, timeoutMs, where } = f;
  let attempts = 0;
  let lastError = '';
  let lastMissing: Range[] | undefined;
  let lastRefused: string[] = [];
  let refusedAuth = 0;
  let lastHandshake = '';
  let backoff = FIRST_BACKOFF_MS;
  for (;;) {
    if (f.signal?.aborted) throw abortError(where, f.signal);
    const left = deadline - Date.now();
    if (left <= 0) break;
    attempts++;
    const outcome = await tryOnce(self, f, (missing, refused) => ((lastMissing = missing), (lastRefused = refused)));
    if (outcome.kind === 'table') return new FollowerSession(outcome.peers, outcome.channel, self, timeoutMs, where, outcome.rejoined);
    if (outcome.kind === 'error') throw outcome.error;
    lastError = outcome.reason;
    if (outcome.auth) {
      refusedAuth++;
      lastHandshake = outcome.reason;
      debug('%s: %s; retrying', where, outcome.reason);
    }
    // Retry: the leader may not be listening yet (or a previous one is on its way out).
    const jitter = 0.8 + 0.4 * Math.random();
    await sleepUnless(Math.min(backoff * jitter, Math.max(0, deadline - Date.now())), f.signal);
    backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
  }
  const detail =
    lastMissing !== undefined
      ? lastMissing.length > 0
        ? `the leader reached, but ${describeMissing(lastMissing)} had not arrived${lastRefused.length > 0 ? ` (the leader refused: ${lastRefused.join('; ')})` : ''}`
        : 'the leader reached; every process had arrived, but some left before the table'
      : refusedAuth > 0
        ? `no authenticated leader after ${attempts} attempts (${refusedAuth} failed the handshake, last: ${lastHandshake}); ` +
          'every process of the world needs the same world.token (or RANKFLOW_WORLD_TOKEN)'
        : `could not reach the leader (rank 0) after ${attempts} attempts, last: ${lastError || 'none'}`;
  throw new RankflowError('TIMEOUT_CPU', `${where}: no table after ${timeoutMs} ms: ${detail}`, {
    rank: lastMissing?.[0]?.[0] ?? 0,
  });
}

type Attempt =
  | { kind: 'table'; peers: RendezvousPeer[]; channel: Channel; rejoined?: RejoinedAt }
  | { kind: 'error'; error: RankflowError }
  | { kind: 'retry'; reason: string; auth?: true };

function tryOnce(self: Join, f: Forming, onStatus: (missing: Range[], refused: string[]) => void): Promise<Attempt> {
  const { where } = f;
  return new Promise<Attempt>((resolve) => {
    const socket = net.connect({ host: f.host, port: f.port });
    const ch = new Channel(socket, UNAUTHENTICATED);
    const auth = new FollowerAuth(f.key);
    let stage: 'challenge' | 'proof' | 'joined' = 'challenge';
    let settled = false;
    const settle = (a: Attempt): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      f.signal?.removeEventListener('abort', onAbort);
      if (a.kind !== 'table') ch.destroy();
      resolve(a);
    };
    const invalid = (what: string, problem: string): void =>
      settle({ kind: 'error', error: new RankflowError('EINVAL', `${where}: the leader sent an invalid ${what}: ${problem}`) });
    // Bounds the connect itself (an unreachable host can take minutes) and the wait for the table.
    // Saying bye lets the leader tell "gave up" from "crashed" in its own report.
    const timer = setTimeout(() => {
      if (stage === 'joined') ch.send({ t: 'bye' });
      settle({ kind: 'retry', reason: 'deadline reached' });
    }, Math.max(0, f.deadline - Date.now()));
    let connected = false;
    socket.once('connect', () => {
      connected = true;
      // Without a token, only a leader on this machine may be trusted with the join ('localhost'
      // is checked here, once resolved).
      if (f.key === '' && !isLoopbackHost(socket.remoteAddress ?? ''))
        settle({ kind: 'error', error: new RankflowError('EINVAL', `${where}: token is required: ${f.host} is ${socket.remoteAddress}, not a loopback address`) });
    });
    const onMessage = (m: Incoming): void => {
      if (stage === 'challenge') {
        const r = auth.respond(m);
        if ('problem' in r) return settle({ kind: 'retry', reason: `something answers at ${ch.remote} but ${r.problem}`, auth: true });
        ch.send(r.reply);
        stage = 'proof';
      } else if (stage === 'proof') {
        const problem = auth.check(m);
        if (problem) return settle({ kind: 'retry', reason: problem, auth: true });
        ch.setLimits(AUTHENTICATED);
        ch.send(self);
        stage = 'joined';
      } else if (m.t === 'wait') {
        // A leader that takes over from a lost one admits no rejoin yet: this one tries again (until the deadline).
        if (!self.rejoin || !isText(m.reason, LIMITS.textChars)) return invalid('wait', 'a wait is for a rejoining process, with a reason of bounded length');
        settle({ kind: 'retry', reason: m.reason });
      } else if (m.t === 'status') {
        const problem = rangesProblem(m.missing, self.worldSize) ?? refusedProblem(m.refused);
        if (problem) return invalid('status', problem);
        onStatus(m.missing as Range[], m.refused as string[]);
      } else if (m.t === 'error') {
        const problem = errorProblem(m);
        if (problem) return invalid('error', problem);
        settle({ kind: 'error', error: new RankflowError(m.code as never, m.message as string, m.rank === undefined ? undefined : { rank: m.rank as number }) });
      } else if (m.t === 'table') {
        const problem = tableProblem(m.peers, self) ??
          (self.rejoin ? rejoinedProblem(m.rejoined, self.worldSize) ?? leaderProblem(m.rejoined, m.peers as RendezvousPeer[], self)
            : m.rejoined !== undefined ? 'a table of a rejoin, to a process that joins' : undefined);
        if (problem) return invalid('table', problem);
        // Whatever follows the table in the same chunk (a loss, say) is the session's to handle.
        ch.hold();
        settle({ kind: 'table', peers: m.peers as RendezvousPeer[], channel: ch, ...(self.rejoin ? { rejoined: toRejoined(m.rejoined as Record<string, unknown>) } : {}) });
      } else {
        invalid('message', `${JSON.stringify(m.t).slice(0, 40)} before the table`);
      }
    };
    ch.listen(onMessage, (reason) =>
      settle({ kind: 'retry', reason: !connected ? reason : `leader closed the connection before the table (${reason})` }),
    );
    // Aborted: a process that joined says bye (the leader then counts it as gone, not crashed).
    function onAbort(): void {
      const error = abortError(where, f.signal!);
      if (stage !== 'joined') return settle({ kind: 'error', error });
      settled = true;  // not destroyed at once: the bye goes out first (dismiss destroys it after a grace period)
      clearTimeout(timer);
      ch.dismiss({ t: 'bye' });
      resolve({ kind: 'error', error });
    }
    f.signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** A rejoiner's table names the leader that admitted it: another process of the table. */
function leaderProblem(r: unknown, peers: RendezvousPeer[], self: Join): string | undefined {
  const leader = (r as Record<string, unknown>).leader;
  if (leader === undefined) return undefined;
  return (leader as number) < peers.length && peers[leader as number]!.rankOffset !== self.rankOffset ? undefined : `rejoined.leader ${String(leader)} is not another process of the table`;
}
