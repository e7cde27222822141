// Connecting the scale-out leg of a world that spans nodes (host backend): every rank opens a
// listener on the address this process reaches the world at, the endpoints go round through the
// rendezvous (checked: they come over a socket), and every rank then connects to its rail peers
// (the ranks of its local index on the other nodes), natively, each connection authenticated both
// ways by an HMAC-SHA256 challenge over the world's rail key (native/src/backends/host/rail.hpp).
//
// The rail key: HMAC-SHA256(token, "rankflow-scaleout/1\n" + worldId), where worldId is the SHA-256
// of a fresh random nonce of every process: it binds the connections to this world (a process of an
// earlier world with the same token cannot answer for a rank of this one), and the token itself never
// leaves this thread. Without a token (loopback only) the key proves nothing, as for the rendezvous.
import { createHash, createHmac, randomBytes } from 'node:crypto';
import net from 'node:net';

import { invalid } from '../core/errors.js';
import { isObject, quote, who } from './protocol.js';
import type { Rendezvous } from './rendezvous.js';

export interface RailEndpoint { host: string; port: number }

interface Offer { host: string; ports: number[]; nonce: string }

const NONCE = /^[A-Za-z0-9_-]{43}$/;

/** "::ffff:127.0.0.1" -> "127.0.0.1": the native side binds and dials plain addresses. */
function plain(address: string): string {
  const m = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  return m ? m[1]! : address;
}
const isWildcard = (a: string): boolean => a === '0.0.0.0' || a === '::';

/** Each process's offer from the exchange, checked: it came over a socket. */
function offerOf(v: unknown, p: Rendezvous['peers'][number]): Offer {
  const o = isObject(v) ? v : {};
  const { host, ports, nonce } = o as Partial<Offer>;
  const ok = typeof host === 'string' && (host === '' || net.isIP(host) !== 0) && typeof nonce === 'string' && NONCE.test(nonce) &&
    Array.isArray(ports) && ports.length === p.localRanks && ports.every((x) => Number.isInteger(x) && x > 0 && x < 65536);
  if (!ok) throw invalid('world', `${who(p)} sent a scale-out offer that is not a rankflow group's: ${quote(v)}`);
  return { host: host!, ports: ports!, nonce: nonce! };
}

/**
 * Opens and connects the scale-out leg of this process's ranks. listen(r, host) and connect(r, ends,
 * key) run in local rank r's worker; every process of the world calls this at the same point.
 */
export async function connectScaleOut(o: {
  rv: Rendezvous;
  token?: string;
  localRanks: number;
  listen(local: number, host: string): Promise<number>;
  connect(local: number, ends: RailEndpoint[], key: Uint8Array): Promise<void>;
}): Promise<void> {
  const { rv } = o;
  const local = plain(rv.localAddress);
  const ports = await Promise.all(Array.from({ length: o.localRanks }, (_, r) => o.listen(r, local)));
  // A leader listening on every interface says '': each follower dials the address it reached the leader at.
  const mine: Offer = { host: isWildcard(local) ? '' : local, ports, nonce: randomBytes(32).toString('base64url') };
  const offers = (await rv.exchange(mine)).map((v, i) => offerOf(v, rv.peers[i]!));
  const ends: RailEndpoint[] = [];
  offers.forEach((offer, i) => {
    const host = offer.host !== '' ? offer.host : plain(rv.leaderAddress);
    for (const port of offer.ports) ends.push({ host, port });
    if (offer.host === '' && i !== 0) throw invalid('world', `${who(rv.peers[i]!)} offered no scale-out address`);
  });
  const worldId = createHash('sha256').update(offers.map((x) => x.nonce).join('\n')).digest('hex');
  const key = createHmac('sha256', o.token ?? '').update(`rankflow-scaleout/1\n${worldId}`).digest();
  await Promise.all(Array.from({ length: o.localRanks }, (_, r) => o.connect(r, ends, new Uint8Array(key))));
}
