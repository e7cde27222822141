// Who may take part in a world's rendezvous: an HMAC-SHA256 challenge-response over the world's
// token that every connection passes before the leader reads a join from it, in both directions
// (the follower proves it knows the token, then the leader proves it to the follower), and the
// rule that a rendezvous reachable from other machines must have a token.
//
//   leader   -> follower  { t: 'challenge', proto, nonce: nL }          a fresh random nonce per connection
//   follower -> leader    { t: 'auth', proto, nonce: nF, mac: HMAC(token, "<proto> follower\n" nL "\n" nF) }
//   leader   -> follower  { t: 'proof', mac: HMAC(token, "<proto> leader\n" nL "\n" nF) }   or { t: 'denied' }
//
// Each side's nonce makes the other side's MAC single-use; the role in the MAC keeps a leader's
// proof from being replayed as a follower's answer. A world without a token (loopback only) runs
// the same exchange with an empty key: it proves nothing, and keeps one code path.
// What this does not do: encrypt, or protect a connection from someone on the network path after
// the handshake (the table and the exchanges travel in clear). Use a private network for that.
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import net from 'node:net';

import { PROTOCOL, isText, type Incoming, type Message } from './protocol.js';

const NONCE_BYTES = 32;
// base64url of 32 bytes (nonces) and of a SHA-256 digest (MACs): 43 characters.
const TOKEN_LIKE = /^[A-Za-z0-9_-]{43}$/;

export const TOKEN_MIN_CHARS = 16;
export const TOKEN_MAX_CHARS = 1024;

/** What is wrong with a token, or undefined. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

export function tokenProblem(token: unknown): string | undefined {
  if (typeof token !== 'string' || token.length < TOKEN_MIN_CHARS || token.length > TOKEN_MAX_CHARS)
    return `must be a string of ${TOKEN_MIN_CHARS} to ${TOKEN_MAX_CHARS} characters, the same in every process (e.g. the output of \`openssl rand -hex 32\`); got ${typeof token === 'string' ? `${token.length} characters` : typeof token}`;
  // The HMAC key is the token's UTF-8: a lone surrogate becomes U+FFFD there, so two different tokens
  // would be one key.
  if (LONE_SURROGATE.test(token)) return 'must be well-formed text: it holds a lone surrogate (UTF-8 would turn it into U+FFFD, so tokens that differ only there would match)';
  return undefined;
}

const LOOPBACK = new net.BlockList();
LOOPBACK.addSubnet('127.0.0.0', 8, 'ipv4');  // also matches ::ffff:127.x.y.z
LOOPBACK.addAddress('::1', 'ipv6');

/** A loopback address (127.0.0.0/8, ::1), or 'localhost' (whose address the caller checks once resolved). */
export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[(.*)\]$/, '$1').toLowerCase();
  if (h === 'localhost') return true;
  const family = net.isIP(h);
  return family !== 0 && LOOPBACK.check(h, family === 4 ? 'ipv4' : 'ipv6');
}

function mac(key: string, role: 'leader' | 'follower', leaderNonce: string, followerNonce: string): string {
  return createHmac('sha256', key).update(`${PROTOCOL} ${role}\n${leaderNonce}\n${followerNonce}`).digest('base64url');
}

function macMatches(claimed: unknown, expected: string): boolean {
  if (typeof claimed !== 'string' || !TOKEN_LIKE.test(claimed)) return false;
  const a = Buffer.from(claimed, 'base64url');
  const b = Buffer.from(expected, 'base64url');
  return a.length === b.length && timingSafeEqual(a, b);
}

/** The leader's side of one connection. */
export class LeaderAuth {
  private readonly nonce = randomBytes(NONCE_BYTES).toString('base64url');

  constructor(private readonly key: string) {}

  /** The first message, sent as soon as the connection is accepted. */
  challenge(): Message {
    return { t: 'challenge', proto: PROTOCOL, nonce: this.nonce };
  }

  /** The follower's answer: the proof to send back, or why the connection must be dropped. */
  answer(m: Incoming): { proof: Message } | { problem: string } {
    if (m.t !== 'auth') return { problem: `sent '${String(m.t).slice(0, 20)}' instead of authenticating` };
    if (m.proto !== PROTOCOL) return { problem: `speaks ${isText(m.proto, 40) ? m.proto : 'another protocol'}, not ${PROTOCOL}` };
    if (typeof m.nonce !== 'string' || !TOKEN_LIKE.test(m.nonce) || m.nonce === this.nonce) return { problem: 'sent a malformed nonce' };
    if (!macMatches(m.mac, mac(this.key, 'follower', this.nonce, m.nonce))) return { problem: 'failed authentication (wrong or missing world.token)' };
    return { proof: { t: 'proof', mac: mac(this.key, 'leader', this.nonce, m.nonce) } };
  }
}

/** A follower's side of one connection. */
export class FollowerAuth {
  private readonly nonce = randomBytes(NONCE_BYTES).toString('base64url');
  private leaderNonce: string | undefined;

  constructor(private readonly key: string) {}

  /** The leader's challenge: the answer to send, or why this is not a rankflow leader. */
  respond(m: Incoming): { reply: Message } | { problem: string } {
    if (m.t !== 'challenge' || m.proto !== PROTOCOL) return { problem: `it does not speak ${PROTOCOL}` };
    if (typeof m.nonce !== 'string' || !TOKEN_LIKE.test(m.nonce)) return { problem: 'it sent a malformed challenge' };
    this.leaderNonce = m.nonce;
    return { reply: { t: 'auth', proto: PROTOCOL, nonce: this.nonce, mac: mac(this.key, 'follower', m.nonce, this.nonce) } };
  }

  /** The leader's proof: undefined if it knows the token, else what went wrong. */
  check(m: Incoming): string | undefined {
    if (m.t === 'denied') return 'the leader refused this process (wrong or missing world.token)';
    if (this.leaderNonce === undefined || m.t !== 'proof' || !macMatches(m.mac, mac(this.key, 'leader', this.leaderNonce, this.nonce)))
      return 'it could not prove that it knows the token (another world, or a different world.token)';
    return undefined;
  }
}
