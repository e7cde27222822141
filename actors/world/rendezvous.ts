// Rendezvous of the processes of one world over TCP, and the connections they keep afterwards.
//
// The process with rankOffset 0 is the leader: it listens on the url's host:port; every other
// process connects to it (a star). Messages are newline-delimited JSON. The leader checks that all
// processes name the same world size and that their rank ranges partition [0, worldSize), then
// sends everyone the table of processes. The connections stay open: they carry `exchange` (an
// all-gather of small JSON values, e.g. NCCL's unique id or fd socket names), tell everyone
// when a process goes away without saying goodbye (`onPeerLost`), and relay the failures of ranks
// whose process lives on (`announceFailure` / `onRankFailed`: a timeout, a terminated worker).
import net from 'node:net';

import { RankflowError, type RankflowErrorCode } from '../core/errors.js';
import { hostId as localHostId } from './host-id.js';

export interface RendezvousOptions {
  /** `tcp://host:port`; the process with rankOffset 0 listens there, the others connect. */
  url: string;
  worldSize: number;
  /** Global id of this process's first rank. */
  rankOffset: number;
  /** Ranks hosted by this process: global ids [rankOffset, rankOffset + localRanks). */
  localRanks: number;
  /** Any JSON value; every process sees every process's payload in the table. */
  payload?: unknown;
  /** Bound on the whole rendezvous, and the default bound of each `exchange`. */
  timeoutMs: number;
}

export interface RendezvousPeer {
  rankOffset: number;
  localRanks: number;
  payload: unknown;
  /** Equal for processes that can pass fds to each other (see hostId.ts). */
  hostId: string;
  pid: number;
}

export interface PeerLost {
  rankOffset: number;
  localRanks: number;
  hostId: string;
  /** What was seen: the socket error or "connection closed", and by whom. */
  reason: string;
}

/** A rank that failed (the origin of a failure), as its process tells the others. */
export interface RankFailure {
  /** global rank id */
  rank: number;
  message: string;
  phase?: string;
}

export interface Rendezvous {
  /** One entry per process, sorted by rankOffset; this process included. */
  readonly peers: readonly RendezvousPeer[];
  /** Index of this process in `peers`. */
  readonly self: number;
  /**
   * All-gather: every process calls it with its value, in the same order; resolves with the
   * values of all processes in `peers` order. Values cross as JSON (undefined becomes null).
   */
  exchange<T>(value: T, opts?: { timeoutMs?: number }): Promise<T[]>;
  /**
   * Called once per process that disappears without `close()` (crash, kill, network). Losses
   * that happened before registration are replayed. Returns an unsubscribe function.
   */
  onPeerLost(cb: (lost: PeerLost) => void): () => void;
  /** Tells every other process that a rank of this one failed (best effort: fire and forget). */
  announceFailure(f: RankFailure): void;
  /**
   * Called once per failure another process announces. Failures announced before registration are
   * replayed. Returns an unsubscribe function.
   */
  onRankFailed(cb: (f: RankFailure) => void): () => void;
  /** Says goodbye and closes the connections; pending exchanges reject with STATE. */
  close(): Promise<void>;
}

const PROTOCOL = 'rankflow-rendezvous/1';
// A line longer than this is not ours (or a bug): drop the connection rather than buffer it.
const MAX_LINE_BYTES = 64 << 20;
// Connect retry backoff: a leader usually starts within a second of its peers.
const FIRST_BACKOFF_MS = 50;
const MAX_BACKOFF_MS = 1000;
// How long close() waits for the peer to see our goodbye before destroying the socket.
const CLOSE_GRACE_MS = 1000;
// How long a failed leader keeps telling latecomers why (see lead()).
const VERDICT_LINGER_MS = 5000;
// TCP keepalive notices a peer host that vanished without closing (no FIN, no RST).
const KEEPALIVE_MS = 1000;

type Range = [start: number, end: number];

interface Hello {
  t: 'hello';
  proto: string;
  worldSize: number;
  rankOffset: number;
  localRanks: number;
  payload: unknown;
  hostId: string;
  pid: number;
}

type Message =
  | Hello
  | { t: 'status'; missing: Range[] }
  | { t: 'table'; peers: RendezvousPeer[] }
  | { t: 'error'; code: RankflowErrorCode; message: string; rank?: number }
  | { t: 'x'; seq: number; value: unknown }
  | { t: 'xall'; seq: number; values: unknown[] }
  | { t: 'xerr'; seq: number; code: RankflowErrorCode; message: string; rank?: number }
  | { t: 'lost'; index: number; reason: string }
  | { t: 'failed'; from: number; failure: RankFailure }
  | { t: 'bye' };

/** Meets the other processes of the world; see the file header. */
export async function rendezvous(opts: RendezvousOptions): Promise<Rendezvous> {
  const { host, port } = checkOptions(opts);
  const hello: Hello = {
    t: 'hello',
    proto: PROTOCOL,
    worldSize: opts.worldSize,
    rankOffset: opts.rankOffset,
    localRanks: opts.localRanks,
    payload: toWire(opts.payload, 'payload'),
    hostId: localHostId(),
    pid: process.pid,
  };
  const deadline = Date.now() + opts.timeoutMs;
  const where = `rendezvous at ${opts.url}`;
  return opts.rankOffset === 0
    ? lead(hello, host, port, deadline, opts.timeoutMs, where)
    : follow(hello, host, port, deadline, opts.timeoutMs, where);
}

function checkOptions(opts: RendezvousOptions): { host: string; port: number } {
  const bad = (what: string): never => {
    throw new RankflowError('EINVAL', `rendezvous: ${what}`);
  };
  if (!Number.isInteger(opts.worldSize) || opts.worldSize < 1) bad(`worldSize must be an integer >= 1, got ${opts.worldSize}`);
  if (!Number.isInteger(opts.rankOffset) || opts.rankOffset < 0) bad(`rankOffset must be an integer >= 0, got ${opts.rankOffset}`);
  if (!Number.isInteger(opts.localRanks) || opts.localRanks < 1) bad(`localRanks must be an integer >= 1, got ${opts.localRanks}`);
  if (opts.rankOffset + opts.localRanks > opts.worldSize)
    bad(`ranks ${fmt([opts.rankOffset, opts.rankOffset + opts.localRanks])} do not fit in worldSize ${opts.worldSize}`);
  if (!(opts.timeoutMs > 0) || !Number.isFinite(opts.timeoutMs)) bad(`timeoutMs must be a finite number > 0, got ${opts.timeoutMs}`);
  let url: URL | undefined;
  try {
    url = new URL(opts.url);
  } catch {
    url = undefined;
  }
  if (url === undefined || url.protocol !== 'tcp:' || url.hostname === '' || url.port === '' || url.port === '0')
    return bad(`url must look like tcp://host:port (port > 0), got ${JSON.stringify(opts.url)}`);
  return { host: url.hostname.replace(/^\[(.*)\]$/, '$1'), port: Number(url.port) };
}

// ---------------------------------------------------------------------------------------------
// Leader

async function lead(
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

// ---------------------------------------------------------------------------------------------
// Followers

async function follow(
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

// ---------------------------------------------------------------------------------------------
// After the table: exchange, loss detection, close

interface PendingExchange {
  values: unknown[];
  have: boolean[];
  settle?: { resolve: (v: unknown[]) => void; reject: (e: RankflowError) => void; timer: NodeJS.Timeout };
}

abstract class Session implements Rendezvous {
  protected seq = 0;
  protected closed = false;
  protected readonly lost = new Map<number, PeerLost>();
  private readonly listeners = new Set<(lost: PeerLost) => void>();
  private readonly failures: RankFailure[] = [];
  private readonly failureListeners = new Set<(f: RankFailure) => void>();

  constructor(
    readonly peers: readonly RendezvousPeer[],
    readonly self: number,
    protected readonly timeoutMs: number,
    protected readonly where: string,
  ) {}

  abstract exchange<T>(value: T, opts?: { timeoutMs?: number }): Promise<T[]>;
  abstract close(): Promise<void>;
  abstract announceFailure(f: RankFailure): void;
  protected abstract failPending(error: RankflowError): void;

  onRankFailed(cb: (f: RankFailure) => void): () => void {
    this.failureListeners.add(cb);
    for (const f of this.failures) queueMicrotask(() => this.failureListeners.has(cb) && cb(f));
    return () => this.failureListeners.delete(cb);
  }

  /** A failure another process announced: for this process's listeners. */
  protected rankFailed(f: RankFailure): void {
    if (this.closed || typeof f?.rank !== 'number' || typeof f.message !== 'string') return;
    this.failures.push(f);
    for (const cb of this.failureListeners) cb(f);
  }

  onPeerLost(cb: (lost: PeerLost) => void): () => void {
    this.listeners.add(cb);
    for (const l of this.lost.values()) queueMicrotask(() => this.listeners.has(cb) && cb(l));
    return () => this.listeners.delete(cb);
  }

  protected markLost(index: number, reason: string): void {
    if (this.closed || this.lost.has(index) || index === this.self) return;
    const p = this.peers[index];
    if (p === undefined) return;
    const l: PeerLost = { rankOffset: p.rankOffset, localRanks: p.localRanks, hostId: p.hostId, reason };
    this.lost.set(index, l);
    this.failPending(this.lostError(index));
    for (const cb of this.listeners) cb(l);
  }

  protected lostError(index: number): RankflowError {
    const p = this.peers[index]!;
    const l = this.lost.get(index);
    return new RankflowError('RANK_FAILED', `${this.where}: ${who(p)} was lost (${l?.reason ?? 'unknown'})`, {
      rank: p.rankOffset,
    });
  }

  /** The first error a new exchange must fail with, if any. */
  protected refuse(): RankflowError | undefined {
    if (this.closed) return new RankflowError('STATE', `${this.where}: exchange after close()`, { state: 'closed' });
    const first = this.lost.keys().next();
    return first.done ? undefined : this.lostError(first.value);
  }
}

class LeaderSession extends Session {
  private readonly pending = new Map<number, PendingExchange>();
  private readonly goodbyes = new Set<number>();

  constructor(
    peers: RendezvousPeer[],
    private readonly channels: (Channel | undefined)[],
    timeoutMs: number,
    where: string,
  ) {
    super(peers, channels.indexOf(undefined), timeoutMs, where);
    channels.forEach((ch, index) => {
      if (ch === undefined) return;
      ch.keepAlive();
      ch.listen(
        (m) => {
          if (m.t === 'x') this.contribute(m.seq, index, m.value);
          else if (m.t === 'failed') {
            // A star: the leader passes a follower's failure on to the other followers.
            for (const other of this.channels) if (other !== undefined && other !== ch) other.send({ t: 'failed', from: index, failure: m.failure });
            this.rankFailed(m.failure);
          } else if (m.t === 'bye') {
            this.goodbyes.add(index);
            ch.end();
          }
        },
        (reason) => {
          if (this.goodbyes.has(index) || this.closed) return;
          const why = `${reason}, seen by the leader`;
          for (const other of this.channels) if (other !== undefined && other !== ch) other.send({ t: 'lost', index, reason: why });
          this.markLost(index, why);
        },
      );
    });
  }

  exchange<T>(value: T, opts?: { timeoutMs?: number }): Promise<T[]> {
    const seq = ++this.seq;
    const refused = this.refuse();
    if (refused) return Promise.reject(refused);
    let wire: unknown;
    try {
      wire = toWire(value, `exchange #${seq} value`);
    } catch (e) {
      return Promise.reject(e);
    }
    const timeoutMs = opts?.timeoutMs ?? this.timeoutMs;
    return new Promise<T[]>((resolve, reject) => {
      const p = this.entry(seq);
      const timer = setTimeout(() => {
        this.pending.delete(seq);
        const late = this.peers.filter((_, i) => !p.have[i]);
        const message = `${this.where}: exchange #${seq}: no value from ${late.map(who).join(', ')} after ${timeoutMs} ms`;
        const rank = late[0]?.rankOffset;
        this.broadcast({ t: 'xerr', seq, code: 'TIMEOUT_CPU', message, rank });
        reject(new RankflowError('TIMEOUT_CPU', message, rank === undefined ? undefined : { rank }));
      }, timeoutMs);
      p.settle = { resolve: resolve as (v: unknown[]) => void, reject, timer };
      this.contribute(seq, this.self, wire);
    });
  }

  announceFailure(failure: RankFailure): void {
    if (this.closed) return;
    this.broadcast({ t: 'failed', from: this.self, failure: toWire(failure, 'failure') as RankFailure });
  }

  private entry(seq: number): PendingExchange {
    let p = this.pending.get(seq);
    if (p === undefined) {
      p = { values: new Array<unknown>(this.peers.length).fill(null), have: new Array<boolean>(this.peers.length).fill(false) };
      this.pending.set(seq, p);
    }
    return p;
  }

  private contribute(seq: number, index: number, value: unknown): void {
    // Values for an exchange we already gave up on (timed out) are late: drop them.
    if (seq <= this.seq && !this.pending.has(seq) && index !== this.self) return;
    const p = this.entry(seq);
    p.values[index] = value ?? null;
    p.have[index] = true;
    if (!p.have.every(Boolean) || p.settle === undefined) return;
    this.pending.delete(seq);
    clearTimeout(p.settle.timer);
    this.broadcast({ t: 'xall', seq, values: p.values });
    p.settle.resolve(p.values);
  }

  private broadcast(m: Message): void {
    for (const ch of this.channels) ch?.send(m);
  }

  protected failPending(error: RankflowError): void {
    for (const [seq, p] of this.pending) {
      if (p.settle === undefined) continue;
      clearTimeout(p.settle.timer);
      this.pending.delete(seq);
      p.settle.reject(error);
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.failPending(new RankflowError('STATE', `${this.where}: closed while an exchange was pending`, { state: 'closed' }));
    this.closed = true;
    await Promise.all(this.channels.map((ch) => ch?.endAndWait({ t: 'bye' })));
  }
}

class FollowerSession extends Session {
  private readonly pending = new Map<number, NonNullable<PendingExchange['settle']>>();
  private leaderLeft = false;

  constructor(
    peers: RendezvousPeer[],
    private readonly channel: Channel,
    self: Hello,
    timeoutMs: number,
    where: string,
  ) {
    super(
      peers,
      peers.findIndex((p) => p.rankOffset === self.rankOffset),
      timeoutMs,
      where,
    );
    channel.keepAlive();
    const leader = 0;
    channel.listen(
      (m) => {
        if (m.t === 'xall') this.settle(m.seq, (s) => s.resolve(m.values));
        else if (m.t === 'xerr')
          this.settle(m.seq, (s) => s.reject(new RankflowError(m.code, m.message, m.rank === undefined ? undefined : { rank: m.rank })));
        else if (m.t === 'lost') this.markLost(m.index, m.reason);
        else if (m.t === 'failed') this.rankFailed(m.failure);
        else if (m.t === 'bye') this.leaderLeft = true;
      },
      (reason) => {
        if (this.closed) return;
        if (this.leaderLeft) {
          this.failPending(new RankflowError('STATE', `${where}: the leader closed the rendezvous`, { state: 'closed' }));
          return;
        }
        this.markLost(leader, `${reason}, seen by ${who(self)}`);
      },
    );
  }

  private settle(seq: number, f: (s: NonNullable<PendingExchange['settle']>) => void): void {
    const s = this.pending.get(seq);
    if (s === undefined) return;
    this.pending.delete(seq);
    clearTimeout(s.timer);
    f(s);
  }

  exchange<T>(value: T, opts?: { timeoutMs?: number }): Promise<T[]> {
    const seq = ++this.seq;
    const refused =
      this.refuse() ??
      (this.leaderLeft ? new RankflowError('STATE', `${this.where}: the leader closed the rendezvous`, { state: 'closed' }) : undefined);
    if (refused) return Promise.reject(refused);
    let wire: unknown;
    try {
      wire = toWire(value, `exchange #${seq} value`);
    } catch (e) {
      return Promise.reject(e);
    }
    const timeoutMs = opts?.timeoutMs ?? this.timeoutMs;
    return new Promise<T[]>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(seq);
        reject(new RankflowError('TIMEOUT_CPU', `${this.where}: exchange #${seq}: no answer from the leader after ${timeoutMs} ms`, { rank: 0 }));
      }, timeoutMs);
      this.pending.set(seq, { resolve: resolve as (v: unknown[]) => void, reject, timer });
      this.channel.send({ t: 'x', seq, value: wire });
    });
  }

  announceFailure(failure: RankFailure): void {
    if (this.closed || this.leaderLeft) return;
    this.channel.send({ t: 'failed', from: this.self, failure: toWire(failure, 'failure') as RankFailure });
  }

  protected failPending(error: RankflowError): void {
    for (const [seq, s] of this.pending) {
      clearTimeout(s.timer);
      this.pending.delete(seq);
      s.reject(error);
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.failPending(new RankflowError('STATE', `${this.where}: closed while an exchange was pending`, { state: 'closed' }));
    this.closed = true;
    await this.channel.endAndWait({ t: 'bye' });
  }
}

// ---------------------------------------------------------------------------------------------
// Newline-delimited JSON over one socket

class Channel {
  private handler: { message: (m: Message) => void; close: (reason: string) => void } | undefined;
  // Events that arrive while no handler listens (between the table and the session taking over).
  private held: Array<{ message: Message } | { close: string }> = [];
  private buffer = '';
  private lastError: string | undefined;
  private readonly closedPromise: Promise<void>;

  constructor(readonly socket: net.Socket) {
    socket.setEncoding('utf8');
    socket.setNoDelay(true);
    socket.on('data', (chunk: string) => this.receive(chunk));
    socket.on('error', (err: NodeJS.ErrnoException) => (this.lastError = err.code ?? err.message));
    this.closedPromise = new Promise((resolve) =>
      socket.on('close', () => {
        resolve();
        this.dispatch({ close: this.lastError ?? 'connection closed' });
      }),
    );
  }

  /** Routes messages and the close to these handlers, first any held ones. */
  listen(message: (m: Message) => void, close: (reason: string) => void): void {
    this.handler = { message, close };
    while (this.handler !== undefined && this.held.length > 0) this.deliver(this.held.shift()!);
  }

  /** Holds messages and the close until the next listen(). */
  hold(): void {
    this.handler = undefined;
  }

  private dispatch(e: { message: Message } | { close: string }): void {
    if (this.handler === undefined) this.held.push(e);
    else this.deliver(e);
  }

  private deliver(e: { message: Message } | { close: string }): void {
    if ('message' in e) this.handler!.message(e.message);
    else this.handler!.close(e.close);
  }

  private receive(chunk: string): void {
    this.buffer += chunk;
    let nl: number;
    while ((nl = this.buffer.indexOf('\n')) >= 0) {
      const line = this.buffer.slice(0, nl);
      this.buffer = this.buffer.slice(nl + 1);
      let m: Message;
      try {
        m = JSON.parse(line) as Message;
      } catch {
        this.lastError = 'malformed message';
        this.destroy();
        return;
      }
      if (typeof m !== 'object' || m === null || typeof m.t !== 'string') continue;
      this.dispatch({ message: m });
      if (this.socket.destroyed) return;
    }
    if (this.buffer.length > MAX_LINE_BYTES) {
      this.lastError = `message longer than ${MAX_LINE_BYTES} bytes`;
      this.destroy();
    }
  }

  send(m: Message): void {
    if (this.socket.writable) this.socket.write(`${JSON.stringify(m)}\n`);
  }

  /** Sends a last message, half-closes, and lets the peer's close finish it. */
  end(m?: Message): void {
    if (m !== undefined) this.send(m);
    this.socket.end();
  }

  /** end(), then waits (bounded) until the socket is closed. */
  async endAndWait(m?: Message): Promise<void> {
    this.end(m);
    const timer = setTimeout(() => this.destroy(), CLOSE_GRACE_MS);
    await this.closedPromise;
    clearTimeout(timer);
  }

  destroy(): void {
    this.socket.destroy();
  }

  /** For the long-lived phase: detect dead peers, and do not keep the process alive by ourselves. */
  keepAlive(): void {
    this.socket.setKeepAlive(true, KEEPALIVE_MS);
    this.socket.unref();
  }
}

// ---------------------------------------------------------------------------------------------
// Small helpers

function toWire(value: unknown, what: string): unknown {
  if (value === undefined) return null;
  try {
    return JSON.parse(JSON.stringify(value)) as unknown;
  } catch (e) {
    throw new RankflowError('EINVAL', `rendezvous: ${what} is not JSON-serializable: ${(e as Error).message}`, { cause: e });
  }
}

function toPeer(h: Hello): RendezvousPeer {
  return { rankOffset: h.rankOffset, localRanks: h.localRanks, payload: h.payload, hostId: h.hostId, pid: h.pid };
}

function rangeOf(p: { rankOffset: number; localRanks: number }): Range {
  return [p.rankOffset, p.rankOffset + p.localRanks];
}

function overlaps(a: Range, b: Range): boolean {
  return a[0] < b[1] && b[0] < a[1];
}

/** The parts of [0, worldSize) that no process covers. */
function gaps(processes: Iterable<{ rankOffset: number; localRanks: number }>, worldSize: number): Range[] {
  const ranges = [...processes].map(rangeOf).sort((a, b) => a[0] - b[0]);
  const out: Range[] = [];
  let at = 0;
  for (const [s, e] of ranges) {
    if (s > at) out.push([at, s]);
    at = Math.max(at, e);
  }
  if (at < worldSize) out.push([at, worldSize]);
  return out;
}

function fmt([s, e]: Range): string {
  return e - s === 1 ? `rank ${s}` : `ranks [${s}, ${e})`;
}

function describeMissing(missing: Range[]): string {
  return missing.length === 0 ? 'no ranks' : missing.map(fmt).join(', ');
}

/** "ranks [2, 4) (pid 123 on host)": how messages name a process. */
function who(p: { rankOffset: number; localRanks: number; pid: number; hostId: string }): string {
  return `${fmt(rangeOf(p))} (pid ${p.pid} on ${p.hostId.split('/')[0]})`;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
