// Child processes for multi-process tests: building what they run (forked children run plain JS,
// not the TypeScript vitest runs), forking fixtures, and waiting for their IPC messages.
import { execFileSync, fork, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository root, found from this file whether it runs as test/ source or from dist/test/. */
export const repoRoot: string = (() => {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  while (!existsSync(path.join(dir, 'package.json')) || !existsSync(path.join(dir, 'tsconfig.json'))) {
    const up = path.dirname(dir);
    if (up === dir) throw new Error('test helpers: repository root not found');
    dir = up;
  }
  return dir;
})();

const newest = (files: string[]): number => Math.max(...files.map((f) => statSync(path.join(repoRoot, f)).mtimeMs));
const isFresh = (output: string, sources: string[]): boolean =>
  existsSync(path.join(repoRoot, output)) && statSync(path.join(repoRoot, output)).mtimeMs >= newest(sources);

/** Compiles the TypeScript (tsc, as `npm test` does) when dist/ is older than `sources`. */
export function ensureCompiled(output: string, sources: string[]): void {
  if (isFresh(output, sources)) return;
  try {
    execFileSync(process.execPath, [path.join(repoRoot, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.json'], {
      cwd: repoRoot,
      stdio: 'pipe',
    });
  } catch (e) {
    // Type errors elsewhere in the tree still emit JS; only a missing output is fatal.
    if (!existsSync(path.join(repoRoot, output))) throw e;
  }
}

/** The sources of the world (actors/world/*.ts and what they import), for ensureCompiled. */
export const worldSources: string[] = [
  ...readdirSync(path.join(repoRoot, 'actors/world')).filter((f) => f.endsWith('.ts')).map((f) => `actors/world/${f}`),
  'actors/core/errors.ts',
  'actors/core/config.ts',
];

/** Builds the scratch fd-passing addon (native/test-fdpass) when it is older than its sources. */
export function ensureFdpassAddon(): string {
  const out = 'build/test-fdpass/Release/rankflow_fdpass_test.node';
  const sources = ['native/src/binding/fdpass.cc', 'native/src/binding/fdpass.hpp', 'native/src/runtime/fdpass.hpp', 'native/src/runtime/fdpass_socket.hpp',
    'native/src/runtime/fdpass_serve.cc', 'native/src/runtime/fdpass_fetch.cc', 'native/test-fdpass/addon_fdpass_test.cc', 'native/test-fdpass/CMakeLists.txt'];
  if (!isFresh(out, sources)) {
    execFileSync(
      process.execPath,
      [path.join(repoRoot, 'node_modules/cmake-js/bin/cmake-js'), 'compile', '--directory', 'native/test-fdpass', '--out', 'build/test-fdpass'],
      { cwd: repoRoot, stdio: 'pipe' },
    );
  }
  return path.join(repoRoot, out);
}

/** A TCP port that was free a moment ago. */
export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

export type Message = { kind: string; [key: string]: unknown };

export interface Child {
  proc: ChildProcess;
  /** The next message of this kind (messages are kept until taken). */
  next(kind: string, timeoutMs?: number): Promise<Message>;
  /** Takes every message of this kind received so far. */
  taken(kind: string): Message[];
  send(m: unknown): void;
  /** Exit code, or the signal's name. */
  exited: Promise<number | string>;
}

/**
 * Forks test/fixtures/<name>.mjs with one JSON argument and IPC; `env` is added to this process's.
 * With `onStderr`, its stderr comes to it line by line (say, NODE_DEBUG=rankflow's log) instead of this process's.
 */
export function forkFixture(name: string, arg: unknown, env?: Record<string, string>, onStderr?: (line: string) => void): Child {
  const proc = fork(path.join(repoRoot, 'test/fixtures', `${name}.mjs`), [JSON.stringify(arg)], {
    stdio: ['ignore', 'inherit', onStderr ? 'pipe' : 'inherit', 'ipc'],
    ...(env !== undefined ? { env: { ...process.env, ...env } } : {}),
  });
  if (onStderr) {
    let rest = '';
    proc.stderr!.on('data', (d: Buffer) => {
      const lines = (rest + d.toString()).split('\n');
      rest = lines.pop()!;
      for (const l of lines) onStderr(l);
    });
  }
  const inbox: Message[] = [];
  const waiters: Array<{ kind: string; resolve: (m: Message) => void }> = [];
  proc.on('message', (m: Message) => {
    const i = waiters.findIndex((w) => w.kind === m.kind);
    if (i >= 0) waiters.splice(i, 1)[0]!.resolve(m);
    else inbox.push(m);
  });
  const exited = new Promise<number | string>((resolve) => proc.on('exit', (code, signal) => resolve(code ?? signal ?? -1)));
  return {
    proc,
    exited,
    send: (m) => proc.send(m as never),
    taken(kind) {
      const out = inbox.filter((m) => m.kind === kind);
      inbox.splice(0, inbox.length, ...inbox.filter((m) => m.kind !== kind));
      return out;
    },
    next(kind, timeoutMs = 10_000) {
      const i = inbox.findIndex((m) => m.kind === kind);
      if (i >= 0) return Promise.resolve(inbox.splice(i, 1)[0]!);
      return new Promise<Message>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`${name} (pid ${proc.pid}): no '${kind}' message after ${timeoutMs} ms; got ${JSON.stringify(inbox)}`)), timeoutMs);
        const w = { kind, resolve: (m: Message) => (clearTimeout(timer), resolve(m)) };
        waiters.push(w);
        void exited.then((code) => {
          const j = waiters.indexOf(w);
          if (j < 0) return;
          waiters.splice(j, 1);
          clearTimeout(timer);
          reject(new Error(`${name} (pid ${proc.pid}) exited (${code}) before sending '${kind}'; got ${JSON.stringify(inbox)}`));
        });
      });
    },
  };
}

/** Kills whatever is still running, for afterEach. */
export function killAll(children: Child[]): void {
  for (const c of children.splice(0)) if (c.proc.exitCode === null && c.proc.signalCode === null) c.proc.kill('SIGKILL');
}

/** What a case child (test/fixtures/*-child.mjs) wrote: one JSON line per repetition, then `{ end: true }`. */
export interface CaseRun<R> { exit: number | null; signal: string | null; reps: R[]; stderr: string; ended: boolean }

/** Runs `reps` repetitions of case `name` at world size W in the child `fixture`; its exit and what it wrote. */
export function runCaseChild<R>(fixture: string, name: string, W: number, reps: number): Promise<CaseRun<R>> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [path.join(repoRoot, 'test/fixtures', fixture), JSON.stringify({ name, W, reps })], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '', stderr = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('exit', (exit, signal) => {
      const lines = out.split('\n').filter(Boolean).map((l) => JSON.parse(l) as R & { end?: boolean });
      resolve({ exit, signal, reps: lines.filter((l) => !l.end), stderr, ended: lines.some((l) => l.end) });
    });
  });
}

/** The p-th percentile of xs (nearest rank). */
export const percentile = (xs: number[], p: number): number => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))]!;
