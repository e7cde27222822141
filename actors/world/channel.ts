// One rendezvous connection: newline-delimited JSON over a TCP socket.
import type net from 'node:net';

import type { Message } from './protocol.js';

// A line longer than this is not ours (or a bug): drop the connection rather than buffer it.
const MAX_LINE_BYTES = 64 << 20;
// How long close() waits for the peer to see our goodbye before destroying the socket.
const CLOSE_GRACE_MS = 1000;
// TCP keepalive notices a peer host that vanished without closing (no FIN, no RST).
const KEEPALIVE_MS = 1000;

export class Channel {
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
