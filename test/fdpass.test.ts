// fdServe/fdFetch: SCM_RIGHTS fd passing between processes of one host, through the scratch addon
// (native/test-fdpass: fdpass.cc + a memfd helper). The fds passed are memfds, as the host
// backend's symmetric memory is made of.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';

import { ensureFdpassAddon, forkFixture, killAll, repoRoot, type Child } from './helpers/children.js';

interface FdPassAddon {
  fdServe(socketPath: string, fds: number[], clients: number[], timeoutMs: number): Promise<void>;
  fdFetch(socketPath: string, timeoutMs: number, serverPid?: number): Promise<number[]>;
  fdCancel(socketPath: string): number;
  memfdCreate(size: number): number;
  closeFd(fd: number): void;
}

let addon: FdPassAddon;
let addonPath: string;
const children: Child[] = [];
afterEach(() => killAll(children));
beforeAll(() => {
  addonPath = ensureFdpassAddon();
  addon = createRequire(import.meta.url)(addonPath) as FdPassAddon;
}, 180_000);

let names = 0;
const socketName = (): string => `@rankflow-test-${process.pid}-${++names}`;
// The test process itself opens and closes fds at any time (vitest's own IPC), so here we check
// our fds by number; exact counts are checked in the quiet forked processes above.
const openFds = (): Set<number> => new Set(fs.readdirSync('/proc/self/fd').map(Number));
const inode = (fd: number): number => fs.fstatSync(fd).ino;
const me = process.pid;

describe('fd passing between processes', () => {
  it('a client in another process shares the memfd with the server, and neither leaks an fd', async () => {
    const socketPath = socketName();
    // Client first: it retries until the server listens.
    const client = forkFixture('fdpass-peer', { role: 'client', addonPath, socketPath, timeoutMs: 5000 });
    children.push(client);
    await new Promise((r) => setTimeout(r, 200));
    const server = forkFixture('fdpass-peer', { role: 'server', addonPath, socketPath, timeoutMs: 5000, clients: [client.proc.pid] });
    children.push(server);

    const fetched = await client.next('fetched');
    await server.next('served');
    expect(fetched.count).toBe(1);
    expect(fetched.text).toBe('written by the server');
    expect(fetched.during).toBe((fetched.before as number) + 1);
    expect(fetched.after).toBe(fetched.before);

    // The client wrote through its fd; the server reads it through its own: one memory.
    server.send({ cmd: 'check' });
    const checked = await server.next('checked');
    expect(checked.text).toBe('written by the client');
    expect(checked.after).toBe(checked.before);
    expect(await Promise.all([client.exited, server.exited])).toEqual([0, 0]);
  });

  it('a stranger process of the same user gets no fd and does not count as a client', async () => {
    const socketPath = socketName();
    const member = forkFixture('fdpass-peer', { role: 'client', addonPath, socketPath, timeoutMs: 5000, waitForGo: true });
    children.push(member);
    const server = forkFixture('fdpass-peer', { role: 'server', addonPath, socketPath, timeoutMs: 5000, clients: [member.proc.pid] });
    children.push(server);
    // The stranger knows the name (abstract names are listed in /proc/net/unix) and runs as us.
    const stranger = forkFixture('fdpass-peer', { role: 'client', addonPath, socketPath, timeoutMs: 5000 });
    children.push(stranger);
    const refused = await stranger.next('error');
    expect(refused.code).toBe('EINVAL');
    expect(refused.message).toMatch(
      new RegExp(`^fdFetch\\(${socketPath}\\): the server \\(pid ${server.proc.pid}\\) refused this process: it serves only the processes of its world, and pid ${stranger.proc.pid} .* is not one of them`),
    );
    expect(refused.after).toBe(refused.before);  // nothing received, nothing left open

    // The server still waits for its one member, and serves it.
    member.send({ cmd: 'go' });
    const fetched = await member.next('fetched');
    expect(fetched.text).toBe('written by the server');
    await server.next('served');
    server.send({ cmd: 'check' });
    await server.next('checked');
    expect(await Promise.all([member.exited, server.exited, stranger.exited])).toEqual([0, 0, 0]);
  });

  it('a server that names no member times out saying whom it refused', async () => {
    const socketPath = socketName();
    const server = forkFixture('fdpass-peer', { role: 'server', addonPath, socketPath, timeoutMs: 1500, clients: [process.pid] });
    children.push(server);
    const stranger = forkFixture('fdpass-peer', { role: 'client', addonPath, socketPath, timeoutMs: 1500 });
    children.push(stranger);
    expect((await stranger.next('error')).message).toMatch(/refused this process/);
    const e = await server.next('error');
    expect(e.code).toBe('TIMEOUT_CPU');
    expect(e.message).toMatch(new RegExp(`with 0 of 1 clients served; refused 1 connection from processes outside the world \\(last: pid ${stranger.proc.pid}\\)$`));
  });

  it('a client that names the server it expects refuses another one', async () => {
    const socketPath = socketName();
    const server = forkFixture('fdpass-peer', { role: 'server', addonPath, socketPath, timeoutMs: 3000, clients: [process.pid] });
    children.push(server);
    await expect(addon.fdFetch(socketPath, 3000, process.pid)).rejects.toMatchObject({
      code: 'EINVAL',
      message: expect.stringMatching(new RegExp(`the server is pid ${server.proc.pid}, not pid ${process.pid} \\(the process that announced this socket\\); refusing its fds$`)),
    });
    const [fd] = await addon.fdFetch(socketPath, 3000, server.proc.pid!);
    expect(fs.readFileSync(`/proc/self/fd/${fd}`, 'utf8').startsWith('written by the server')).toBe(true);
    addon.closeFd(fd!);
    await server.next('served');
  });

  it('a client that runs out of fds mid-way closes what it received and reports it; the server says why', async () => {
    const socketPath = socketName();
    // The client's pid is the shell's, which execs node: it is known before the server starts.
    const arg = JSON.stringify({ role: 'starved-client', addonPath, socketPath, timeoutMs: 2000 });
    const starved = spawn('bash', ['-c', 'read go && ulimit -n 100 && exec "$0" "$1" "$2"', process.execPath, path.join(repoRoot, 'test/fixtures/fdpass-peer.mjs'), arg], {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    const server = forkFixture('fdpass-peer', { role: 'server', addonPath, socketPath, timeoutMs: 2000, count: 600, clients: [starved.pid] });
    children.push(server);
    // 600 fds do not fit under a limit of 100: recvmsg installs some, then truncates.
    let out = '';
    starved.stdout.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise((resolve) => starved.on('exit', resolve));
    starved.stdin.end('go\n');
    expect(await exited).toBe(0);
    const m = JSON.parse(out.trim()) as { kind: string; code: string; message: string; before: number; after: number };
    expect(m.kind).toBe('error');
    expect(m.code).toBe('EINVAL');
    expect(m.message).toMatch(/^fdFetch\(@rankflow-test-.*\): recvmsg truncated the SCM_RIGHTS data after \d+ of 600 fds/);
    expect(m.after).toBe(m.before);

    const e = await server.next('error');
    expect(e.code).toBe('TIMEOUT_CPU');
    expect(e.message).toMatch(/timed out after \d+ ms with 0 of 1 clients served; last client error: client pid \d+ closed the connection before acknowledging/);
    // (Whether it went before or during the send, it is reported the same way.)
  });
});

describe('fd passing in one process', () => {
  it('passes more fds than one message holds (600 > 253) to several clients, each the same file', async () => {
    const memfd = addon.memfdCreate(4096);
    const fds = Array.from({ length: 600 }, () => memfd);
    const socketPath = socketName();
    const served = addon.fdServe(socketPath, fds, [me, me], 5000);
    const [a, b] = await Promise.all([addon.fdFetch(socketPath, 5000), addon.fdFetch(socketPath, 5000)]);
    await served;
    for (const got of [a!, b!]) {
      expect(got).toHaveLength(600);
      expect(new Set(got).size).toBe(600); // new, distinct fd numbers
      for (const fd of got) expect(inode(fd)).toBe(inode(memfd));
      // O_CLOEXEC, so a child process does not inherit a rank's memory.
      expect(fs.readFileSync(`/proc/self/fdinfo/${got[0]}`, 'utf8')).toMatch(/flags:\s+0?2\d{4}\d*/);
    }
    const received = [...a!, ...b!];
    const during = openFds();
    expect(received.filter((fd) => !during.has(fd))).toEqual([]);
    for (const fd of received) addon.closeFd(fd);
    // Numbers are reused at once by whatever opens next, so ask what they point to now.
    const stillMemfd = (fd: number): boolean => {
      try {
        return inode(fd) === inode(memfd);
      } catch {
        return false;
      }
    };
    expect(received.filter(stillMemfd)).toEqual([]);
    addon.closeFd(memfd);
  });

  it('fdCancel ends a server whose client never comes and a fetch whose server never listens, at once, with STATE; the name is free again', async () => {
    const memfd = addon.memfdCreate(4096);
    const socketPath = socketName(), nobody = socketName();
    const t0 = Date.now();
    const served = addon.fdServe(socketPath, [memfd], [me], 20_000);
    const fetching = addon.fdFetch(nobody, 20_000);
    // Both end on the cancels, in either order: each has its handler now (awaited below, one after the other).
    for (const p of [served, fetching]) p.catch(() => {});
    await new Promise((r) => setTimeout(r, 300));
    expect(addon.fdCancel(socketPath)).toBe(1);
    expect(addon.fdCancel(nobody)).toBe(1);
    await expect(served).rejects.toMatchObject({ code: 'STATE', message: expect.stringMatching(/cancelled after \d+ ms with 0 of 1 clients served/) });
    await expect(fetching).rejects.toMatchObject({ code: 'STATE', message: expect.stringMatching(/cancelled while it waited for the server/) });
    expect(Date.now() - t0).toBeLessThan(5000);
    expect(addon.fdCancel(socketPath)).toBe(0);  // none runs now
    expect(() => addon.fdCancel(7 as unknown as string)).toThrow(expect.objectContaining({ code: 'EINVAL' }));
    const again = addon.fdServe(socketPath, [memfd], [me], 5000);  // the name was released
    const [fd] = await addon.fdFetch(socketPath, 5000);
    await again;
    expect(inode(fd!)).toBe(inode(memfd));
    addon.closeFd(fd!);
    addon.closeFd(memfd);
  });

  it('fdCancel ends a call made before it that has not started yet (queued behind a busy thread pool); a call made after it is not affected', async () => {
    const pool = Number(process.env.UV_THREADPOOL_SIZE ?? 4);
    const blockers = Array.from({ length: pool }, () => socketName());
    const busy = blockers.map((n) => addon.fdFetch(n, 20_000));  // every pool thread waits for a server
    const queued = socketName();
    const t0 = Date.now();
    const late = addon.fdFetch(queued, 20_000);
    for (const p of [...busy, late]) p.catch(() => {});  // each is awaited below, one after the other
    await new Promise((r) => setTimeout(r, 200));
    expect(addon.fdCancel(queued)).toBe(0);  // not running: still queued
    for (const n of blockers) expect(addon.fdCancel(n)).toBe(1);
    for (const b of busy) await expect(b).rejects.toMatchObject({ code: 'STATE' });
    await expect(late).rejects.toMatchObject({ code: 'STATE', message: expect.stringMatching(/cancelled before it started/) });
    expect(Date.now() - t0).toBeLessThan(5000);
    const memfd = addon.memfdCreate(4096);
    const served = addon.fdServe(queued, [memfd], [me], 5000);  // made after the cancel: it serves
    const [fd] = await addon.fdFetch(queued, 5000);
    await served;
    expect(inode(fd!)).toBe(inode(memfd));
    addon.closeFd(fd!);
    addon.closeFd(memfd);
  });

  it('passes an empty list', async () => {
    const socketPath = socketName();
    const served = addon.fdServe(socketPath, [], [me], 2000);
    expect(await addon.fdFetch(socketPath, 2000)).toEqual([]);
    await served;
  });

  it('fdFetch waits for a server that starts later', async () => {
    const memfd = addon.memfdCreate(4096);
    const socketPath = socketName();
    const fetched = addon.fdFetch(socketPath, 5000);
    await new Promise((r) => setTimeout(r, 300));
    await addon.fdServe(socketPath, [memfd], [me], 5000);
    const [fd] = await fetched;
    expect(inode(fd!)).toBe(inode(memfd));
    addon.closeFd(fd!);
    addon.closeFd(memfd);
  });

  it('a filesystem socket path works and is removed afterwards', async () => {
    const memfd = addon.memfdCreate(4096);
    const socketPath = path.join(os.tmpdir(), `rankflow-test-${process.pid}-${++names}.sock`);
    const served = addon.fdServe(socketPath, [memfd], [me], 5000);
    const [fd] = await addon.fdFetch(socketPath, 5000);
    await served;
    expect(fs.existsSync(socketPath)).toBe(false);
    addon.closeFd(fd!);
    await expect(addon.fdServe(socketPath, [memfd], [me], 100)).rejects.toMatchObject({ code: 'TIMEOUT_CPU' });
    expect(fs.existsSync(socketPath)).toBe(false);
    addon.closeFd(memfd);
  });

  it('fdFetch with no server times out with TIMEOUT_CPU naming the socket, within the timeout', async () => {
    const before = openFds();
    const t0 = Date.now();
    const socketPath = socketName();
    const e = await addon.fdFetch(socketPath, 300).then(() => null, (err: { code: string; message: string }) => err);
    expect(e).toMatchObject({
      code: 'TIMEOUT_CPU',
      message: expect.stringMatching(new RegExp(`^fdFetch\\(${socketPath}\\): no server after \\d+ ms \\(\\d+ attempts, last connect: Connection refused\\)`)),
    });
    // The native clock says when it gave up; the wall clock here also holds this process's event-loop
    // delays, which a loaded CI machine stretches, so it only bounds a hang.
    const gaveUp = Number(/after (\d+) ms/.exec(e!.message)![1]);
    expect(gaveUp).toBeGreaterThanOrEqual(300);
    expect(gaveUp).toBeLessThan(300 + 200);
    expect(Date.now() - t0).toBeLessThan(300 + 2000);
    expect([...openFds()].filter((fd) => !before.has(fd))).toEqual([]);
  });

  it('fdServe times out with TIMEOUT_CPU saying how many clients it served', async () => {
    const memfd = addon.memfdCreate(4096);
    const socketPath = socketName();
    const served = addon.fdServe(socketPath, [memfd], [me, me], 500);
    const [fd] = await addon.fdFetch(socketPath, 500);
    await expect(served).rejects.toMatchObject({
      code: 'TIMEOUT_CPU',
      message: expect.stringMatching(new RegExp(`^fdServe\\(${socketPath}\\): timed out after 50\\d ms with 1 of 2 clients served$`)),
    });
    addon.closeFd(fd!);
    addon.closeFd(memfd);
  });

  it('a second server on the same name fails with EADDRINUSE', async () => {
    const memfd = addon.memfdCreate(4096);
    const socketPath = socketName();
    const first = addon.fdServe(socketPath, [memfd], [me], 2000);
    await new Promise((r) => setTimeout(r, 100));
    await expect(addon.fdServe(socketPath, [memfd], [me], 2000)).rejects.toMatchObject({
      code: 'EINVAL',
      message: expect.stringMatching(/bind failed: Address already in use \(another server holds this name/),
    });
    addon.closeFd((await addon.fdFetch(socketPath, 2000))[0]!);
    await first;
    addon.closeFd(memfd);
  });

  it('bad arguments reject with EINVAL naming the argument', async () => {
    const memfd = addon.memfdCreate(4096);
    addon.closeFd(memfd); // now a closed fd number
    const cases: Array<[() => Promise<unknown>, RegExp]> = [
      [() => addon.fdServe('@x', [memfd], [me], 100), /fdServe\(@x\): fds\[0\] = \d+: fcntl\(F_GETFD\) failed: Bad file descriptor/],
      [() => addon.fdServe('@x', [1.5], [me], 100), /fds\[0\] is not a non-negative integer/],
      [() => addon.fdServe('@x', [], [me, 0], 100), /clients\[1\] is not a pid \(an integer >= 1\)/],
      [() => (addon.fdServe as (...a: unknown[]) => Promise<unknown>)('@x', [], 1, 100), /bad arguments/],
      [() => addon.fdServe('@x', [], [me], 0), /timeoutMs must be a number > 0/],
      [() => addon.fdFetch('@x', 100, 1.5), /serverPid is not a pid/],
      [() => addon.fdFetch('', 100), /socketPath is empty/],
      [() => addon.fdFetch(`@${'x'.repeat(200)}`, 100), /socketPath is 200 bytes, a Unix socket name holds at most 107/],
      [() => (addon.fdFetch as (...a: unknown[]) => Promise<unknown>)(42), /bad arguments/],
    ];
    for (const [call, message] of cases) await expect(call()).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(message) });
  });
});
