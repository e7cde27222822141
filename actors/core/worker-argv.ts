// The Node flags a rank worker starts with. A worker inherits the process's execArgv, and some flags
// are about the process's entry point, not about code in general: with `node --input-type=module -e
// "..."` the worker, whose entry is a file (workers/rank.js), fails at once ("--input-type can only be
// used with string input"). Those are left out; everything else (--import, --require, --loader,
// --conditions, --enable-source-maps, ...) is kept, so a program's loaders reach its rank programs.
//
// Passing execArgv explicitly makes Node refuse the per-process and V8 flags it would otherwise
// ignore in a worker (--expose-gc, --max-old-space-size, ...: they already apply to the process);
// those are found from Node's refusal (ERR_WORKER_INVALID_EXEC_ARGV names them) and left out too.
import { Worker, type WorkerOptions } from 'node:worker_threads';

/** Flags about the process's entry point (script text, REPL, test runner, watch mode). */
const ENTRY_FLAGS = new Set([
  '--input-type', '-e', '--eval', '-p', '--print', '-pe', '-ep', '-c', '--check', '-i', '--interactive',
  '--test', '--watch', '--watch-path', '--watch-preserve-output',
]);
/** Of those, the ones whose value may be the next argument (`-e "code"`, `--input-type module`). */
const TAKES_VALUE = new Set(['--input-type', '-e', '--eval', '-p', '--print', '-pe', '-ep', '--watch-path']);

/** A flag and the arguments after it that are its value. */
interface Flag {
  name: string;
  args: string[];
}

/** execArgv as flags: an argument not starting with '-' is the previous flag's value (execArgv holds no script arguments). */
export function parseExecArgv(argv: readonly string[]): Flag[] {
  const flags: Flag[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const name = a.startsWith('-') ? a.split('=', 1)[0]! : '';
    if (name === '' && flags.length > 0) {
      flags[flags.length - 1]!.args.push(a);
      continue;
    }
    const flag: Flag = { name, args: [a] };
    // `-e -1`: the script text is the next argument whatever it starts with.
    if (TAKES_VALUE.has(name) && !a.includes('=') && i + 1 < argv.length && !(name === '--input-type' && argv[i + 1]!.startsWith('-'))) flag.args.push(argv[++i]!);
    flags.push(flag);
  }
  return flags;
}

const isEntryFlag = (name: string): boolean => ENTRY_FLAGS.has(name) || name.startsWith('--test-') || name.startsWith('--watch-');

/** The execArgv to give a worker: undefined (inherit the process's) unless some flag must be left out. */
export function workerExecArgv(argv: readonly string[] = process.execArgv): string[] | undefined {
  const flags = parseExecArgv(argv);
  if (!flags.some((f) => isEntryFlag(f.name))) return undefined;
  return flags.filter((f) => !isEntryFlag(f.name)).flatMap((f) => f.args);
}

/** The flags named by Node's ERR_WORKER_INVALID_EXEC_ARGV ("... invalid execArgv flags: --a, --b=1"). */
function refusedFlags(e: unknown): Set<string> | undefined {
  if ((e as { code?: unknown })?.code !== 'ERR_WORKER_INVALID_EXEC_ARGV') return undefined;
  const list = String((e as Error).message).split(': ').slice(1).join(': ');
  const names = new Set(list.split(', ').map((f) => f.trim().split('=', 1)[0]!).filter((f) => f.startsWith('-')));
  return names.size > 0 ? names : undefined;
}

/** A worker of `url` with the process's flags, less those a worker cannot take (see the header). */
export function startWorker(url: URL, options: Omit<WorkerOptions, 'execArgv'>): Worker {
  let execArgv = workerExecArgv();
  if (execArgv === undefined) return new Worker(url, options);
  // Each refusal names the flags it refused: at most a few rounds, each leaving more out.
  for (let round = 0; ; round++) {
    try {
      return new Worker(url, { ...options, execArgv });
    } catch (e) {
      const refused = refusedFlags(e);
      if (!refused || round >= 4) throw e;
      const before = execArgv.length;
      execArgv = parseExecArgv(execArgv).filter((f) => !refused.has(f.name)).flatMap((f) => f.args);
      if (execArgv.length === before) throw e;
    }
  }
}
