// Shared by the GPU tests (node:test on the compiled package: `npm run test:gpu`). They import the
// built JS in dist/, as an installed package would. Every multi-rank test runs in each layout the
// machine allows: ranks sharing GPU 0 (2, and 4 where a test asks), and, with 2+ GPUs, one rank per GPU.
import { fork } from 'node:child_process';
import { readdirSync } from 'node:fs';
import net from 'node:net';
import { after, before } from 'node:test';

export * from '../../dist/actors/index.js';
import { createGroup, probeCuda, tensor } from '../../dist/actors/index.js';

export const MiB = 1 << 20;
/** A small MoE buffer with room for a 1.8 MB allGather (the parts plus the cuda staging area). */
export const BUFFER = { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 4, bytes: 16 * MiB };

const probe = probeCuda();

/** The probe, or a failure of the whole file with its reason where no GPU is usable. */
export function requireGpu() {
  if (!probe.available) throw new Error(`the CUDA backend is unavailable: ${probe.reason}`);
  return probe;
}

/** GPUs the driver sees (0 without a usable backend). */
export const gpuCount = () => (probe.available ? probe.devices : 0);

/**
 * The layouts a multi-rank test runs in: { name, ranks, devices, distinct }. `sizes`: rank counts
 * sharing GPU 0; one rank per GPU (2 GPUs) is added where the machine has them.
 */
export function layouts(sizes = [2]) {
  const out = sizes.map((n) => ({ name: `${n} ranks sharing GPU 0`, ranks: n, devices: Array(n).fill(0), distinct: false }));
  if (gpuCount() >= 2) out.push({ name: '2 ranks on GPUs 0 and 1', ranks: 2, devices: [0, 1], distinct: true });
  return out;
}

/** Why a test that needs distinct GPUs is skipped here (node:test counts a skip as not passed), or false. */
export const needsTwoGpus = () => (gpuCount() >= 2 ? false : `needs 2 GPUs; the driver sees ${gpuCount()}`);

export const cudaGroup = (layout, opts = {}) =>
  createGroup({ backend: 'cuda', ranks: layout.ranks, devices: layout.devices, buffer: BUFFER, ...opts });
export const hostGroup = (layout, opts = {}) => createGroup({ backend: 'host', ranks: layout.ranks, buffer: BUFFER, ...opts });

/**
 * Groups made in the enclosing describe's before() and destroyed in its after(): `specs` are their
 * createGroup options ({ backend: 'cuda', ... } / { backend: 'host', ... }), `set` gets them in order.
 * A group made before a later one failed to start is destroyed too.
 */
export function groupsFor(specs, set) {
  const made = [];
  before(async () => {
    for (const o of specs) made.push(await createGroup(o));
    set(...made);
  });
  after(async () => {
    for (const g of made) await g.destroy();
  });
}

/** A cuda group of `layout`'s ranks and a host group of as many on `buffer` (the host one the oracle). */
export const cudaAndHost = (layout, buffer, set) =>
  groupsFor([{ backend: 'cuda', ranks: layout.ranks, devices: layout.devices, buffer }, { backend: 'host', ranks: layout.ranks, buffer }], set);

export const openFds = () => readdirSync('/proc/self/fd').length;
export const range = (n) => Array.from({ length: n }, (_, i) => i);

/** Deterministic data per (rank, round): a tensor of `dtype` and `shape` whose bytes all differ. */
export function pattern(dtype, shape, rank, round) {
  const t = tensor(dtype, shape);
  const bytes = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 131 + rank * 17 + round * 29 + 1) & 0xff;
  // Keep bf16/fp32 values finite and non-NaN so that nothing could canonicalise them on the way.
  if (dtype === 'bf16') for (let i = 0; i < t.data.length; i++) t.data[i] &= 0x3fff;
  if (dtype === 'fp32') for (let i = 0; i < t.data.length; i++) t.data[i] = (i % 1000) * 0.5 + rank - round;
  return t;
}

export const bytesOfTensor = (t) => new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);

/** The states each rank went through, recorded from now on. */
export function recordPaths(group) {
  const paths = group.ranks.map(() => []);
  group.on('transition', (t) => paths[t.rank - group.rankOffset].push(t.to));
  return paths;
}

export async function waitFor(cond, ms = 10_000) {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A free TCP port on loopback, for a world's rendezvous url. */
export async function freePort() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/**
 * Forks `fixture` with `arg` (JSON in argv[2]) as one process of a world; its messages wait in an
 * inbox until taken with next(kind). A 'failure' message from the child ({ error, stack }) fails that
 * wait and every later one at once. `label` names the child in logs and errors; `env` replaces the
 * environment; the child is pushed onto `children` (kill what is left in an after() hook: killAll).
 */
export function forkChild(fixture, arg, { label, env, children }) {
  const proc = fork(fixture, [JSON.stringify(arg)], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'], ...(env ? { env } : {}) });
  const inbox = [];
  const waiters = [];
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve(signal ?? code)));
  let failure = null;  // once the child reports one, every wait fails at once
  proc.on('message', (m) => {
    if (m.kind === 'failure') {
      failure = m;
      console.log(`${label} failed: ${JSON.stringify(m.error)}\n${m.stack}`);
    }
    const i = waiters.findIndex((w) => w.kind === m.kind || m.kind === 'failure');
    if (i >= 0) waiters.splice(i, 1)[0].resolve(m);
    else inbox.push(m);
  });
  const c = {
    proc,
    exited,
    send: (m) => proc.send(m),
    /** The next message of `kind`; a 'failure' report from the child fails the wait instead. */
    async next(kind, ms = 60_000) {
      if (failure && !inbox.some((m) => m.kind === kind)) throw new Error(`${label} failed before '${kind}': ${failure.error.code}: ${failure.error.message}`);
      const i = inbox.findIndex((m) => m.kind === kind || m.kind === 'failure');
      const m = i >= 0 ? inbox.splice(i, 1)[0] : await new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          failure ??= { error: { code: 'HUNG', message: `no '${kind}' message within ${ms} ms` } };  // later waits fail at once
          reject(new Error(`${label}: no '${kind}' message within ${ms} ms`));
        }, ms);
        waiters.push({ kind, resolve: (v) => { clearTimeout(timer); resolve(v); } });
      });
      if (m.kind === 'failure') throw new Error(`${label} failed before '${kind}': ${m.error.code}: ${m.error.message}`);
      return m;
    },
  };
  children.push(c);
  return c;
}

/** SIGKILLs every forked child still running (an after() hook of a file that forks). */
export function killAll(children) {
  for (const c of children) if (c.proc.exitCode === null && c.proc.signalCode === null) c.proc.kill('SIGKILL');
}
