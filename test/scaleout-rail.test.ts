// The host backend's scale-out leg on the wire (native/src/backends/host/rail.hpp), against an
// independent implementation of its handshake and frames written here with node:crypto: a rank
// admits only a peer that proves it knows the world's rail key, proves it back, drops strangers
// without harm, and checks every frame header against the op it is in.
import { createHmac, randomBytes } from 'node:crypto';
import net from 'node:net';

import { afterEach, describe, expect, it } from 'vitest';

import { ensureCompiled, forkFixture, killAll, type Child } from './helpers/children.js';
import { loadAddon } from '../actors/core/addon.js';

const children: Child[] = [];
afterEach(() => killAll(children));

const KEY = randomBytes(32);
const u32 = (v: number): Buffer => { const b = Buffer.alloc(4); b.writeUInt32LE(v); return b; };
const MAGIC = { challenge: 'RFRC', auth: 'RFRA', proof: 'RFRP', frame: 'RFS1' };
const mac = (key: Buffer, role: string, nl: Buffer, nc: Buffer, from: number, to: number): Buffer =>
  createHmac('sha256', key).update(`rankflow-rail/1 ${role}\n`).update(nl).update(nc).update(u32(from)).update(u32(to)).digest();

/** A frame header: magic, phase, seq, tag, aux, bytes (little endian). */
function header(phase: number, seq: number, bytes = 0): Buffer {
  const b = Buffer.alloc(40);
  b.write(MAGIC.frame, 0, 'latin1');
  b.writeUInt32LE(phase, 4);
  b.writeBigUInt64LE(BigInt(seq), 8);
  b.writeBigUInt64LE(BigInt(bytes), 32);
  return b;
}
const PHASE_BARRIER = 1;

/** Reads exactly n bytes from a socket (rejects if it closes first). */
function read(s: net.Socket, n: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    let got = Buffer.alloc(0);
    const onData = (d: Buffer): void => {
      got = Buffer.concat([got, d]);
      if (got.length >= n) {
        s.off('data', onData).off('close', onClose);
        s.pause();
        if (got.length > n) s.unshift(got.subarray(n));
        resolve(got.subarray(0, n));
      }
    };
    const onClose = (): void => reject(new Error(`closed after ${got.length} of ${n} bytes`));
    s.on('data', onData).once('close', onClose);
    s.resume();
  });
}
const closed = (s: net.Socket): Promise<void> => new Promise((resolve) => (s.destroyed ? resolve() : s.once('close', () => resolve())));
const dial = (port: number): Promise<net.Socket> => new Promise((resolve, reject) => {
  const s = net.connect({ host: '127.0.0.1', port }, () => resolve(s));
  s.once('error', reject);
});

function peer(rank: number, extra: Record<string, unknown> = {}): Child {
  ensureCompiled('dist/actors/core/addon.js', ['actors/core/addon.ts']);
  const c = forkFixture('rail-peer', { rank, key: KEY.toString('hex'), timeoutMs: 20_000, ...extra });
  children.push(c);
  return c;
}

describe('the scale-out handshake', () => {
  it("uses HMAC-SHA256 as node:crypto computes it", () => {
    const addon = loadAddon();
    for (const [k, m] of [[0, 0], [4, 28], [64, 200], [65, 1], [131, 54], [32, 1000]] as const) {
      const key = randomBytes(k), msg = randomBytes(m);
      expect(Buffer.from(addon.hmacSha256(key, msg)).toString('hex')).toBe(createHmac('sha256', key).update(msg).digest('hex'));
    }
  });

  it('admits a connector that proves the key, after dropping strangers, and proves the key back', async () => {
    const rank0 = peer(0);  // listens: its rail peer (rank 1, node 1) dials it
    await rank0.next('started');
    rank0.send({ kind: 'listen' });
    const { port } = (await rank0.next('listening')) as unknown as { port: number };
    rank0.send({ kind: 'connect', ends: [{ host: '127.0.0.1', port }, { host: '127.0.0.1', port: 1 }] });

    const challengeOf = async (s: net.Socket): Promise<Buffer> => {
      const c = await read(s, 40);
      expect(c.subarray(0, 4).toString('latin1')).toBe(MAGIC.challenge);
      expect(c.readUInt32LE(4)).toBe(0);
      return c.subarray(8);
    };
    // Garbage of the right size, a wrong key, a right key naming the wrong rank: each is dropped, unanswered.
    const garbage = await dial(port);
    await challengeOf(garbage);
    garbage.write(randomBytes(76));
    await closed(garbage);
    for (const [key, from] of [[randomBytes(32), 1], [KEY, 0]] as const) {
      const s = await dial(port);
      const nl = await challengeOf(s);
      const nc = randomBytes(32);
      s.write(Buffer.concat([Buffer.from(MAGIC.auth, 'latin1'), u32(from), u32(0), nc, mac(key, 'connector', nl, nc, from, 0)]));
      await closed(s);
    }
    const silent = await dial(port);  // says nothing: the rank does not wait for it
    // The real rank 1.
    const s = await dial(port);
    const nl = await challengeOf(s);
    const nc = randomBytes(32);
    s.write(Buffer.concat([Buffer.from(MAGIC.auth, 'latin1'), u32(1), u32(0), nc, mac(KEY, 'connector', nl, nc, 1, 0)]));
    const proof = await read(s, 36);
    expect(proof.subarray(0, 4).toString('latin1')).toBe(MAGIC.proof);
    expect(proof.subarray(4).equals(mac(KEY, 'listener', nl, nc, 1, 0))).toBe(true);
    await rank0.next('connected');
    silent.destroy();

    // importPeers ends with barrier #1: one empty frame each way; then barrier #2.
    rank0.send({ kind: 'register' });
    expect((await read(s, 40)).equals(header(PHASE_BARRIER, 1))).toBe(true);
    s.write(header(PHASE_BARRIER, 1));
    await rank0.next('registered');
    rank0.send({ kind: 'barrier' });
    expect((await read(s, 40)).equals(header(PHASE_BARRIER, 2))).toBe(true);
    s.write(header(PHASE_BARRIER, 2));
    await rank0.next('barrier');

    // A frame of another op breaks the connections for good: this op and every later one fail.
    rank0.send({ kind: 'barrier' });
    await read(s, 40);
    s.write(header(PHASE_BARRIER, 7));
    expect(await rank0.next('error')).toMatchObject({
      code: 'RANK_FAILED', rank: 1, message: expect.stringMatching(/^rank 1 sent a frame of barrier #7 while rank 0 is in barrier #3: every rank must run the same collectives/),
    });
    rank0.send({ kind: 'barrier' });
    expect(await rank0.next('error')).toMatchObject({ code: 'RANK_FAILED', message: expect.stringMatching(/the scale-out connections of rank 0 are broken/) });
    s.destroy();
  });

  it('refuses a frame longer than its op can take, and reports a peer that closes as gone', async () => {
    for (const misstep of ['long', 'close'] as const) {
      const rank0 = peer(0);
      await rank0.next('started');
      rank0.send({ kind: 'listen' });
      const { port } = (await rank0.next('listening')) as unknown as { port: number };
      rank0.send({ kind: 'connect', ends: [{ host: '127.0.0.1', port }, { host: '127.0.0.1', port: 1 }] });
      const s = await dial(port);
      const c = await read(s, 40);
      const nc = randomBytes(32);
      s.write(Buffer.concat([Buffer.from(MAGIC.auth, 'latin1'), u32(1), u32(0), nc, mac(KEY, 'connector', c.subarray(8), nc, 1, 0)]));
      await read(s, 36);
      await rank0.next('connected');
      rank0.send({ kind: 'register' });
      await read(s, 40);
      if (misstep === 'long') {
        s.write(header(PHASE_BARRIER, 1, 1 << 30));  // a barrier frame has no payload
        expect(await rank0.next('error')).toMatchObject({ code: 'RANK_FAILED', rank: 1, message: expect.stringMatching(/^rank 1 announced a frame of 1073741824 bytes in barrier #1; at most 0 fit/) });
      } else {
        s.destroy();
        expect(await rank0.next('error')).toMatchObject({ code: 'RANK_FAILED', rank: 1, message: expect.stringMatching(/^rank 1 \(node 1\) is gone: its scale-out connection to rank 0 closed during barrier #1/) });
      }
    }
  });

  it('a connector leaves a listener that cannot prove the key, and times out saying so', async () => {
    const server = net.createServer();
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as net.AddressInfo).port;
    let attempts = 0;
    server.on('connection', (s) => {
      attempts++;
      s.on('error', () => {});
      s.write(Buffer.concat([Buffer.from(MAGIC.challenge, 'latin1'), u32(0), randomBytes(32)]));
      void read(s, 76).then(() => s.write(Buffer.concat([Buffer.from(MAGIC.proof, 'latin1'), randomBytes(32)])), () => {});
    });
    const rank1 = peer(1, { timeoutMs: 1500 });  // dials rank 0, played by this server
    await rank1.next('started');
    rank1.send({ kind: 'listen' });
    await rank1.next('listening');
    rank1.send({ kind: 'connect', ends: [{ host: '127.0.0.1', port }, { host: '127.0.0.1', port: 1 }] });
    expect(await rank1.next('error', 20_000)).toMatchObject({
      code: 'TIMEOUT_CPU', rank: 0,
      message: expect.stringMatching(/^scale-out connect of rank 1 timed out after 1\.5 s with no authenticated connection to rank 0 \(node 0\): rank 0's listener could not prove that it knows the world's key/),
    });
    expect(attempts).toBeGreaterThan(1);  // it retried
    server.close();
  });
});
