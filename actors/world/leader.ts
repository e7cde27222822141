// The leader of a forming world (the process with rankOffset 0): listens on the rendezvous
// address, checks that the processes name the same world size and that their rank ranges
// partition [0, worldSize), and sends everyone the table.
import net from 'node:net';

import { RankflowError, type RankflowErrorCode } from '../core/errors.js';
import { Channel } from './channel.js';
import { describeMissing, gaps, overlaps, PROTOCOL, rangeOf, toPeer, who, type Hello, type Message, type Range } from './protocol.js';
import type { Rendezvous } from './rendezvous.js';
import { LeaderSession } from './session.js';

// How long a failed leader keeps telling latecomers why (see lead()).
const VERDICT_LINGER_MS = 5000;

export async function lead(
  self: Hello,
  host: string,
  port: number,
  deadline: number,
  timeoutMs: number,
  where: string,
): Promise<Rendezvous> {
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

  return new Promise<Rendezvous>((resolve, reject) => {
    const arrived = new Map<Channel | 'self', Hello>([['self', self]]);
    // Processes that arrived and left before the table (gave up, crashed): named apart in a timeout.
    const departed = new Map<Channel, { hello: Hello; reason: string }>();
    const strangers = new Set<Channel>();
    let failure: { code: RankflowErrorCode; message: string; rank?: number } | undefined;

    const missing = (): Range[] => gaps([...arrived.values()], self.worldSize);
    // For reports: processes that came and left (gave up first, crashed) did arrive; naming them
    // missing would blame the wrong ranks when everyone's timeouts expire at nearly the same time.
    const departedOnly = (): Array<{ hello: Hello; reason: string }> =>
      [...departed.values()].filter((d) => ![...arrived.values()].some((h) => overlaps(rangeOf(h), rangeOf(d.hello))));
    const neverArrived = (): Range[] => gaps([...arrived.values(), ...departedOnly().map((d) => d.hello)], self.worldSize);
    const broadcast = (m: Message): void => {
      for (const ch of arrived.keys()) if (ch !== 'self') ch.send(m);
    };

    const fail = (code: RankflowErrorCode, message: string, rank?: number): void => {
      if (failure) return;
      failure = { code, message, rank };
      clearTimeout(timer);
      const m: Message = { t: 'error', code, message, rank };
      for (const ch of arrived.keys()) if (ch !== 'self') ch.end(m);
      // Keep answering latecomers with the verdict for a while, so processes started a little
      // later fail with the same error instead of timing out. This holds the process up to
      // VERDICT_LINGER_MS after the rejection (never past the deadline): bounded, and worth it.
      setTimeout(() => closeServer(), Math.max(0, Math.min(deadline - Date.now(), VERDICT_LINGER_MS)));
      reject(new RankflowError(code, message, rank === undefined ? undefined : { rank }));
    };
    const closeServer = (): void => {
      server.close();
      for (const ch of strangers) ch.destroy();
    };

    const timer = setTimeout(() => {
      const gone = departedOnly();
      const never = neverArrived();
      const parts = [`worldSize ${self.worldSize}`, `present: ${[...arrived.values()].map(who).join(', ')}`];
      if (gone.length > 0) parts.push(`left before the table: ${gone.map((d) => `${who(d.hello)}, ${d.reason}`).join('; ')}`);
      const first = never[0]?.[0] ?? gone[0]?.hello.rankOffset;
      fail(
        'TIMEOUT_CPU',
        `${where}: after ${timeoutMs} ms ${never.length > 0 ? `${describeMissing(never)} never arrived` : 'some processes left'} (${parts.join('; ')})`,
        first,
      );
    }, Math.max(0, deadline - Date.now()));

    const onHello = (ch: Channel, h: Hello): void => {
      if (failure) {
        ch.end({ t: 'error', ...failure });
        return;
      }
      if (h.worldSize !== self.worldSize) {
        fail('EINVAL', `${where}: world sizes disagree: ${who(self)} says worldSize ${self.worldSize}, ${who(h)} says ${h.worldSize}`);
        ch.end({ t: 'error', ...failure! });
        return;
      }
      const r = rangeOf(h);
      if (r[0] < 0 || r[1] > self.worldSize || h.localRanks < 1) {
        fail('EINVAL', `${where}: ${who(h)} does not fit in worldSize ${self.worldSize}`);
        ch.end({ t: 'error', ...failure! });
        return;
      }
      for (const other of arrived.values()) {
        if (overlaps(rangeOf(other), r)) {
          fail('EINVAL', `${where}: rank ranges overlap: ${who(other)} and ${who(h)}`);
          ch.end({ t: 'error', ...failure! });
          return;
        }
      }
      strangers.delete(ch);
      arrived.set(ch, h);
      maybeFinish();
    };

    const maybeFinish = (): void => {
      const m = missing();
      if (m.length > 0) {
        broadcast({ t: 'status', missing: neverArrived() });
        return;
      }
      // Everyone is here: send the table, stop listening, keep the connections.
      clearTimeout(timer);
      const entries = [...arrived.entries()].sort((a, b) => a[1].rankOffset - b[1].rankOffset);
      const peers = entries.map(([, p]) => toPeer(p));
      broadcast({ t: 'table', peers });
      closeServer();
      const channels = entries.map(([ch]) => (ch === 'self' ? undefined : ch));
      resolve(new LeaderSession(peers, channels, timeoutMs, where));
    };
    // A world of one process (localRanks == worldSize) is complete before anyone connects.
    maybeFinish();

    server.on('connection', (socket) => {
      const ch = new Channel(socket);
      strangers.add(ch);
      ch.listen(
        (m) => {
          if (m.t === 'bye' && arrived.has(ch)) {
            departed.set(ch, { hello: arrived.get(ch)!, reason: 'it gave up (its own timeout expired)' });
            ch.destroy();
            return;
          }
          // The first line must be a hello of our protocol; anything else is not a rankflow process.
          if (m.t !== 'hello' || m.proto !== PROTOCOL || arrived.has(ch)) {
            ch.destroy();
            return;
          }
          onHello(ch, m);
        },
        (reason) => {
          strangers.delete(ch);
          // A process that leaves before the table is missing again (and may come back, restarted).
          const h = arrived.get(ch);
          if (h === undefined || !arrived.delete(ch)) return;
          if (!departed.has(ch)) departed.set(ch, { hello: h, reason });
          if (!failure) broadcast({ t: 'status', missing: neverArrived() });
        },
      );
    });
  });
}
