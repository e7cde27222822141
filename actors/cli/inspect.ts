/**
 * `rankflow inspect`: the demo with the live inspector page attached on loopback, its URL printed.
 * Every flag, the demo's included, is checked before the server starts, so a mistyped command
 * line never leaves a server behind. After the demo the page stays up until Ctrl-C (or `--exit`).
 */
import { constants as osConstants } from 'node:os';
import { describeMachine } from '../observe/machine-graph.js';
import { startInspectorServer, type InspectorServer } from '../observe/inspector.js';
import { rankMachine } from '../../machines/index.js';
import { intFlag, pathFlag, type Command } from './command.js';
import { DEMO_DETAILS, DEMO_OPTIONS, demoSettings, runDemo, writeRunFiles } from './demo.js';

/** The port `rankflow inspect` tries first; taken, it falls back to any free port and says so. */
export const DEFAULT_INSPECT_PORT = 9230;

export const inspectCommand: Command = {
    name: 'inspect',
    summary: 'the demo with the live inspector page on loopback',
    usage:
        'usage: rankflow inspect [-p|--port N] [--host 127.0.0.1] [--timeline out.svg] [--trace out.json] [--exit] [demo options]',
    details: `  Runs the demo with the live inspector attached and prints its URL.
  -p, --port N        port to serve on (default ${DEFAULT_INSPECT_PORT}, any free one if taken; 0 = any free port)
  --host H            loopback address to bind (default 127.0.0.1)
  --timeline FILE     also write the run's timeline as SVG when the demo ends
  --trace FILE        also write the run as Chrome trace JSON
  --exit              stop when the demo ends instead of serving until Ctrl-C
  Exits 0 when the demo succeeded, 1 when it failed, 130 when stopped by Ctrl-C (SIGINT), 143 by SIGTERM.
demo options:
${DEMO_DETAILS}`,
    options: {
        ...DEMO_OPTIONS,
        port: { type: 'string', short: 'p' },
        host: { type: 'string' },
        timeline: { type: 'string' },
        trace: { type: 'string' },
        exit: { type: 'boolean' }
    },
    /** 0 when the demo succeeded, 1 when it failed (the page then shows where); 128 + the signal's number when a signal stopped it. */
    async run(values, context) {
        const settings = demoSettings(values);
        const port = intFlag(values, 'port', DEFAULT_INSPECT_PORT, 0, 65535);
        const files = { timeline: pathFlag(values, 'timeline'), trace: pathFlag(values, 'trace') };
        const host = typeof values.host === 'string' ? values.host : '127.0.0.1';
        const base = { host, title: 'rankflow demo', machine: describeMachine(rankMachine) };

        let server: InspectorServer;
        try {
            server = await startInspectorServer({ ...base, port });
        } catch (error) {
            if (values.port !== undefined || !/already in use/.test((error as Error).message)) {
                context.err(`rankflow inspect: ${(error as Error).message}`);
                return 2;
            }
            context.err(`rankflow inspect: port ${port} is taken, falling back to any free port`);
            server = await startInspectorServer({ ...base, port: 0 });
        }
        context.out(`rankflow inspector: ${server.url}`);

        let code = 0;
        try {
            await (context.runDemo ?? runDemo)({ settings, observers: [server], io: context });
            context.out('demo finished');
        } catch (error) {
            code = 1;
            context.err(`demo failed: ${(error as Error)?.message ?? String(error)}`);
        }
        try {
            await writeRunFiles(server.recorder, files, context);
            if (!values.exit) {
                const stopped = untilStopped(context.signal);  // listening before it says Ctrl-C stops it
                context.out(`inspector still serving at ${server.url} (Ctrl-C to stop)`);
                const by = await stopped;
                // Stopped by a signal, the exit code says so as a shell's does (130 for Ctrl-C).
                if (by !== undefined) code = 128 + osConstants.signals[by];
            }
        } finally {
            await server.close();
        }
        return code;
    }
};

/** Resolves with the signal that stopped the wait (SIGINT, SIGTERM), or undefined when `signal` was aborted. */
function untilStopped(signal?: AbortSignal): Promise<'SIGINT' | 'SIGTERM' | undefined> {
    return new Promise((resolve) => {
        const done = (by?: 'SIGINT' | 'SIGTERM') => {
            process.off('SIGINT', onInt);
            process.off('SIGTERM', onTerm);
            signal?.removeEventListener('abort', onAbort);
            resolve(by);
        };
        const onInt = () => done('SIGINT');
        const onTerm = () => done('SIGTERM');
        const onAbort = () => done();
        if (signal?.aborted) return resolve(undefined);
        process.once('SIGINT', onInt);
        process.once('SIGTERM', onTerm);
        signal?.addEventListener('abort', onAbort, { once: true });
    });
}
