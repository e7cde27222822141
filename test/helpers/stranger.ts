// A stranger on a rendezvous port, for the tests: a raw TCP connection that says as much of the
// protocol as the test makes it say (nothing, garbage, a wrong token, a join), and records what the
// leader answers and when it lets go.
import net from 'node:net';

import { FollowerAuth } from '../../actors/world/auth.js';

export interface Stranger {
  socket: net.Socket;
  /** Every line the leader sent, parsed. */
  received: Array<{ t: string; [k: string]: unknown }>;
  /** Resolves with the next line the leader sends, or undefined once the connection is closed. */
  next(): Promise<{ t: string; [k: string]: unknown } | undefined>;
  /** Resolves when the leader (or anyone) has closed the connection. */
  closed: Promise<void>;
  /** Whether it is closed now. */
  readonly gone: boolean;
  write(data: string | Buffer): void;
}

/** Connects to 127.0.0.1:port, retrying (bounded) until something listens there. */
export async function connectStranger(port: number, timeoutMs = 5000): Promise<Stranger> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const socket = net.connect({ host: '127.0.0.1', port });
    const ok = await new Promise<boolean>((resolve) => {
      socket.once('connect', () => resolve(true));
      socket.once('error', () => resolve(false));
    });
    if (ok) return wrap(socket);
    socket.destroy();
    if (Date.now() > until) throw new Error(`stranger: nothing listens on 127.0.0.1:${port} after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function wrap(socket: net.Socket): Stranger {
  const received: Stranger['received'] = [];
  const waiters: Array<(m: Stranger['received'][number] | undefined) => void> = [];
  let unread = 0;
  let buffer = '';
  let ended = false;
  socket.on('error', () => {});  // the leader may reset a connection it drops; 'close' follows
  socket.on('data', (chunk: Buffer) => {
    buffer += chunk.toString('utf8');
    for (let nl = buffer.indexOf('\n'); nl >= 0; nl = buffer.indexOf('\n')) {
      const m = JSON.parse(buffer.slice(0, nl)) as Stranger['received'][number];
      buffer = buffer.slice(nl + 1);
      received.push(m);
      const w = waiters.shift();
      if (w) w(m);
      else unread++;
    }
  });
  const closed = new Promise<void>((resolve) =>
    socket.on('close', () => {
      ended = true;
      for (const w of waiters.splice(0)) w(undefined);
      resolve();
    }),
  );
  return {
    socket,
    received,
    closed,
    get gone() {
      return ended;
    },
    next() {
      if (unread > 0) return Promise.resolve(received[received.length - unread--]);
      if (ended) return Promise.resolve(undefined);
      return new Promise((resolve) => waiters.push(resolve));
    },
    write(data) {
      if (!socket.destroyed) socket.write(data);
    },
  };
}

/**
 * Answers the leader's challenge with `token` ('' for none), with `then` right behind the answer
 * (not waiting for the verdict); returns the leader's verdict: 'proof', 'denied', or undefined if
 * it hung up.
 */
export async function authenticate(s: Stranger, token: string, then = ''): Promise<string | undefined> {
  const challenge = await s.next();
  if (challenge === undefined) return undefined;
  const auth = new FollowerAuth(token);
  const r = auth.respond(challenge);
  if (!('reply' in r)) throw new Error(`stranger: not a challenge: ${JSON.stringify(challenge)}`);
  s.write(`${JSON.stringify(r.reply)}\n${then}`);
  return (await s.next())?.t;
}

/** Polls `done` until it holds; throws after `timeoutMs` (a bound, not a measurement). */
export async function waitFor(what: string, done: () => boolean, timeoutMs = 10_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!done()) {
    if (Date.now() > until) throw new Error(`waited ${timeoutMs} ms for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A join as a rankflow process would send it, with `patch` over it. */
export function joinLine(fields: Record<string, unknown>, patch: Record<string, unknown> = {}): string {
  const base = { t: 'join', worldSize: 3, rankOffset: 2, localRanks: 1, payload: { tag: 'impostor' }, hostId: 'impostor/host', nodeId: 'impostor-node', pid: 424242 };
  return `${JSON.stringify({ ...base, ...fields, ...patch })}\n`;
}
