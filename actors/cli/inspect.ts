/**
 * The command-line glue for watching a run: `rankflow inspect` (the demo with the inspector
 * attached, its URL printed) and `rankflow demo --timeline out.svg` (the demo, then its timeline
 * written as SVG). The demo itself is passed in (`runDemo`), so this file knows nothing of what
 * the demo does, only that it creates one group and lets the given observers attach to it.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { startInspectorServer, type InspectorServer } from '../observe/inspector.js';
import type { MachineDescription } from '../observe/machine-graph.js';
import { TimelineRecorder, type GroupObserver } from '../observe/timeline.js';

/**
 * What the demo is handed. It must call `observer.attach(group)` for each observer as soon as its
 * group exists and before the ranks start (createGroup does this for the observers it is given),
 * or the page and the timeline miss the start-up.
 */
export interface DemoRunOptions {
    /** The command line left after the flags handled here, for the demo's own options. */
    argv: string[];
    observers: GroupObserver[];
}

export type RunDemo = (options: DemoRunOptions) => Promise<unknown>;

export interface CliContext {
    runDemo: RunDemo;
    /** The machine to draw on the page; main passes `describeMachine(rankMachine)`. */
    machine?: MachineDescription;
    /** Where to print; default process.stdout / process.stderr. */
    out?: (line: string) => void;
    err?: (line: string) => void;
    /**
     * Ends the wait after the demo (as Ctrl-C does). Without it the page stays up until SIGINT or
     * SIGTERM, so it can still be looked at after the run.
     */
    signal?: AbortSignal;
}

/** The port `rankflow inspect` tries first; taken, it falls back to any free port and says so. */
export const DEFAULT_INSPECT_PORT = 9230;

const INSPECT_USAGE = `usage: rankflow inspect [--port N] [--host 127.0.0.1] [--timeline out.svg] [--exit] [demo options]
  Runs the demo with the live inspector attached and prints its URL.
  --port N            port to serve on (default ${DEFAULT_INSPECT_PORT}; 0 = any free port)
  --host H            loopback address to bind (default 127.0.0.1)
  --timeline FILE     also write the run's timeline as SVG when the demo ends
  --exit              stop when the demo ends instead of serving until Ctrl-C`;

/**
 * `rankflow inspect`. Resolves to the process exit code: 0 when the demo succeeded, 1 when it
 * failed (the page then shows where), 2 for a usage error.
 */
export async function runInspect(argv: string[], context: CliContext): Promise<number> {
    const out = context.out ?? ((line: string) => process.stdout.write(`${line}\n`));
    const err = context.err ?? ((line: string) => process.stderr.write(`${line}\n`));

    let flags: ReturnType<typeof parseFlags>;
    try {
        flags = parseFlags(argv, { port: 'value', host: 'value', timeline: 'value', exit: 'switch', help: 'switch' });
    } catch (error) {
        err(`${(error as Error).message}\n${INSPECT_USAGE}`);
        return 2;
    }
    if (flags.values.help) {
        out(INSPECT_USAGE);
        return 0;
    }
    const portText = flags.values.port;
    const port = portText === undefined ? DEFAULT_INSPECT_PORT : Number(portText);
    if (!Number.isInteger(port) || port < 0 || port > 65535) {
        err(`rankflow inspect: --port must be an integer in [0, 65535], got '${portText}'\n${INSPECT_USAGE}`);
        return 2;
    }
    const host = (flags.values.host as string | undefined) ?? '127.0.0.1';
    const base = { host, title: 'rankflow demo', ...(context.machine ? { machine: context.machine } : {}) };

    let server: InspectorServer;
    try {
        server = await startInspectorServer({ ...base, port });
    } catch (error) {
        if (portText !== undefined || !/already in use/.test((error as Error).message)) {
            err(`rankflow inspect: ${(error as Error).message}`);
            return 2;
        }
        err(`rankflow inspect: port ${port} is taken, falling back to any free port`);
        server = await startInspectorServer({ ...base, port: 0 });
    }
    out(`rankflow inspector: ${server.url}`);

    let code = 0;
    try {
        await context.runDemo({ argv: flags.rest, observers: [server] });
        out('demo finished');
    } catch (error) {
        code = 1;
        err(`demo failed: ${(error as Error)?.message ?? String(error)}`);
    }

    if (typeof flags.values.timeline === 'string') {
        const path = await writeTimeline(flags.values.timeline, server.recorder);
        out(`timeline written to ${path}`);
    }

    if (!flags.values.exit) {
        out(`inspector still serving at ${server.url} (Ctrl-C to stop)`);
        await untilStopped(context.signal);
    }
    await server.close();
    return code;
}

/**
 * `rankflow demo --timeline out.svg`: runs the demo with a recorder attached and writes the
 * timeline, also when the demo fails (that is when it is most wanted). Without `--timeline` it
 * just runs the demo. Resolves to the exit code, as runInspect.
 */
export async function runDemoWithTimeline(argv: string[], context: CliContext): Promise<number> {
    const out = context.out ?? ((line: string) => process.stdout.write(`${line}\n`));
    const err = context.err ?? ((line: string) => process.stderr.write(`${line}\n`));
    let flags: ReturnType<typeof parseFlags>;
    try {
        flags = parseFlags(argv, { timeline: 'value' });
    } catch (error) {
        err(`rankflow demo: ${(error as Error).message}`);
        return 2;
    }
    const target = flags.values.timeline as string | undefined;
    const recorder = new TimelineRecorder();
    let code = 0;
    try {
        await context.runDemo({ argv: flags.rest, observers: target ? [recorder] : [] });
    } catch (error) {
        code = 1;
        err(`demo failed: ${(error as Error)?.message ?? String(error)}`);
    }
    if (target) {
        const path = await writeTimeline(target, recorder, 'rankflow demo');
        out(`timeline written to ${path}`);
    }
    return code;
}

/** Writes a recorder's timeline as SVG to `path` (directories created); returns the full path. */
export async function writeTimeline(path: string, recorder: TimelineRecorder, title = 'rankflow demo'): Promise<string> {
    const full = resolve(path);
    await mkdir(dirname(full), { recursive: true });
    await writeFile(full, recorder.toSvg({ title }));
    return full;
}

/**
 * Takes this command's own flags out of argv, `--name value` or `--name=value`, and leaves the
 * rest, in order, for the demo.
 */
function parseFlags(argv: string[], spec: Record<string, 'value' | 'switch'>) {
    const values: Record<string, string | true | undefined> = {};
    const rest: string[] = [];
    for (let i = 0; i < argv.length; i++) {
        const arg = argv[i]!;
        const match = /^--([^=]+)(?:=(.*))?$/.exec(arg);
        const kind = match ? spec[match[1]!] : undefined;
        if (!match || !kind) {
            rest.push(arg);
            continue;
        }
        const name = match[1]!;
        if (kind === 'switch') {
            if (match[2] !== undefined) throw new Error(`--${name} takes no value`);
            values[name] = true;
            continue;
        }
        const value = match[2] ?? argv[++i];
        if (value === undefined || value === '') throw new Error(`--${name} needs a value`);
        values[name] = value;
    }
    return { values, rest };
}

function untilStopped(signal?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
        const done = () => {
            process.off('SIGINT', done);
            process.off('SIGTERM', done);
            signal?.removeEventListener('abort', done);
            resolve();
        };
        if (signal?.aborted) return resolve();
        process.once('SIGINT', done);
        process.once('SIGTERM', done);
        signal?.addEventListener('abort', done, { once: true });
    });
}
