// One rendezvous connection: newline-delimited JSON over a TCP socket, with the limits that keep
// a peer (a stranger, or a member with a bug) from making this process buffer without bound.
// A peer that passes a limit, or sends a line that is not a JSON object with a string `t`, is
// destroyed at once, and its close carries the reason.
import type net from 'node:net';

import { LIMITS, isObject, type Incoming, type Message } from './protocol.js';

export interface ChannelLimits {
  /** The longest line (the bytes before its newline). */
  lineBytes: number;
  /** Bytes over the connection's life; what a stranger may send before it has authenticated. */
  totalBytes: number;
}

/** Before the peer has authenticated: a few KiB in all. */
export const UNAUTHENTICATED: ChannelLimits = { lineBytes: LIMITS.unauthenticatedBytes, totalBytes: LIMITS.unauthenticatedBytes };
/** After: any number of lines, each bounded. */
export const AUTHENTICATED: ChannelLimits = { lineBytes: LIMITS.lineBytes, totalBytes: Infinity };

// How long close() waits for the peer to see our goodbye before destroying the socket.
const CLOSE_GRACE_MS = 1000;
// TCP keepalive notices a peer host that vanished without closing (no FIN, no RST).
const KEEPALIVE_MS = 1000;

type Event = { message: Incoming } | { close: string };

export class Channel {
  private handler: { message: (m: Incoming) => void; close: (reason: string) => void } | undefined;
  // Events that arrive while no handler listens (between the table and the session taking over).
  private held: Event[] = [];
  // The start of the current line: chunks received since the last newline.
  private parts: Buffer[] = [];
  private partBytes = 0;
  private received = 0;
  private lastError: string | undefined;
  private readonly closedPromise: Promise<void>;

  constructor(
    readonly socket: net.Socket,
    private limits: ChannelLimits,
  ) {
    socket.setNoDelay(true);
    socket.on('data', (chunk: Buffer) => this.receive(chunk));
    socket.on('error', (err: NodeJS.ErrnoException) => (this.lastError ??= err.code ?? err.message));
    this.closedPromise = new Promise((resolve) =>
      socket.on('close', () => {
        resolve();
        this.dispatch({ close: this.lastError ?? 'connection closed' });
      }),
    );
  }

  /** "127.0.0.1:51234": the peer, for logs. */
  get remote(): string {
    return `${this.socket.remoteAddress ?? '?'}:${this.socket.remotePort ?? '?'}`;
  }

  /** Bytes received so far (what the limits counted). */
  get bytesReceived(): number {
    return this.received;
  }

  /** New limits from now on (after authentication). */
  setLimits(limits: ChannelLimits): void {
    this.limits = limits;
  }

  /** Routes messages and the close to these handlers, first any held ones. */
  listen(message: (m: Incoming) => void, close: (reason: string) => void): void {
    this.handler = { message, close };
    while (this.handler !== undefined && this.held.length > 0) this.deliver(this.held.shift()!);
  }

  /** Holds messages and the close until the next listen(). */
  hold(): void {
    this.handler = undefined;
  }

  private dispatch(e: Event): void {
    if (this.handler === undefined) this.held.push(e);
    else this.deliver(e);
  }

  private deliver(e: Event): void {
    if ('message' in e) this.handler!.message(e.message);
    else this.handler!.close(e.close);
  }

  private receive(chunk: Buffer): void {
    if (this.socket.destroyed) return;
    this.received += chunk.length;
    if (this.received > this.limits.totalBytes) return this.drop(`sent more than ${this.limits.totalBytes} bytes before authenticating`);
    let start = 0;
    for (let nl = chunk.indexOf(0x0a, start); nl >= 0; nl = chunk.indexOf(0x0a, start)) {
      if (this.partBytes + nl - start > this.limits.lineBytes) return this.drop(`sent a line longer than ${this.limits.lineBytes} bytes`);
      const tail = chunk.subarray(start, nl);
      const line = this.partBytes === 0 ? tail : Buffer.concat([...this.parts, tail]);
      this.parts = [];
      this.partBytes = 0;
      start = nl + 1;
      let m: unknown;
      try {
        m = JSON.parse(line.toString('utf8'));
      } catch {
        return this.drop('sent a line that is not JSON');
      }
      if (!isObject(m) || typeof m.t !== 'string') return this.drop('sent a line that is not a message');
      this.dispatch({ message: m as Incoming });
      if (this.socket.destroyed) return;
    }
    // Never more than one line's worth is kept, whatever the peer streams without a newline.
    const rest = chunk.length - start;
    if (rest === 0) return;
    if (this.partBytes + rest > this.limits.lineBytes) return this.drop(`sent a line longer than ${this.limits.lineBytes} bytes`);
    this.parts.push(chunk.subarray(start));
    this.partBytes += rest;
  }

  /** Destroys the connection for this reason, which its close handler receives. */
  drop(reason: string): void {
    this.lastError ??= reason;
    this.parts = [];
    this.partBytes = 0;
    this.socket.destroy();
  }

  send(m: Message): void {
    if (this.socket.writable) this.socket.write(`${JSON.stringify(m)}\n`);
  }

  /** Sends a last message, half-closes, and lets the peer's close finish it. */
  end(m?: Message): void {
    if (m !== undefined) this.send(m);
    this.socket.end();
  }

  /**
   * Sends a last message and lets go without reading any more of what the peer sends (for a
   * connection that is refused: it must not go on costing us); destroyed after a grace period.
   */
  dismiss(m: Message): void {
    this.socket.pause();
    this.parts = [];
    this.partBytes = 0;
    this.end(m);
    setTimeout(() => this.destroy(), CLOSE_GRACE_MS).unref();
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
