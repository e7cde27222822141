/**
 * The inspector server: a small node:http server on a loopback address that shows a group's
 * ranks live. It serves
 *
 *   GET /              the page (actors/observe/inspector-page.ts)
 *   GET /events        Server-Sent Events: `hello` (the run: size, machine, initial states), the
 *                      history so far, then each `transition` and `failure` live; `detached`
 *                      when the group is let go. Every new connection gets the full replay.
 *   GET /snapshot      JSON: { size, backend, attached, state?, liveRanks?, ranks: group.snapshot() }
 *                      (state: the group's, 'degraded' while ranks of an elastic group are out)
 *   GET /machine       JSON: the machine description the page draws
 *   GET /timeline.svg  the timeline so far (actors/observe/timeline.ts), `?width=` in px
 *   GET /recording     JSON: the TimelineRecording, to draw again later
 *
 * It listens on loopback only and refuses requests that come from elsewhere or that name it by a
 * non-loopback Host (a DNS-rebinding page in the user's browser would do that).
 */
import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { PAGE_SCRIPT, PAGE_STYLE, renderInspectorPage } from './inspector-page.js';
import { assertMachineDescription, type MachineDescription } from './machine-graph.js';
import { hostnameOf, isLoopbackAddress, isLoopbackHost } from './loopback.js';
import { epochNow, type GroupObserver, type ObservableGroup } from './observer.js';
import { TimelineRecorder, type TimelineEntry } from './timeline-recorder.js';
import { debug } from './debug.js';

/** Where `createGroup({ inspect: url })` turns its URL into host and port; re-exported for it and the tests. */
export { inspectorAddress, isLoopbackHost } from './loopback.js';

export interface InspectorOptions {
    /** TCP port; default 0, any free port (the URL says which). */
    port?: number;
    /** A loopback address or 'localhost'; default '127.0.0.1'. Anything else is refused. */
    host?: string;
    /** The rank machine to draw; main passes `describeMachine(rankMachine)`. Default: drawn from the states seen. */
    machine?: MachineDescription;
    /** Heading of the page and the timeline. */
    title?: string;
    /**
     * Let the process exit while the server is still open; default false. A group that opened
     * its own inspector sets it, so inspecting never keeps a finished program alive.
     */
    unref?: boolean;
}

/** A running inspector. Attach one group to it (before its ranks start) to show that group. */
export interface InspectorServer extends GroupObserver {
    /** 'http://127.0.0.1:PORT/' */
    readonly url: string;
    /** Everything shown so far, as a timeline. */
    readonly recorder: TimelineRecorder;
    /** Ends every open event stream and stops listening. Safe to call twice. */
    close(): Promise<void>;
}

/** What attachInspector hands back. */
export interface InspectorHandle {
    readonly url: string;
    /** Lets the group go and stops the server. */
    close(): Promise<void>;
}

/** Heartbeat comment sent on idle event streams, so a dead page is noticed and reaped. */
const HEARTBEAT_MS = 15_000;

const EMPTY_MACHINE: MachineDescription = { states: [], transitions: [] };

/** Three lanes of bars, in the timeline's colours. */
const FAVICON =
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">' +
    '<rect x="1" y="2" width="6" height="3" fill="#a78bfa"/><rect x="7" y="2" width="8" height="3" fill="#4ade80"/>' +
    '<rect x="1" y="7" width="9" height="3" fill="#fb923c"/><rect x="10" y="7" width="5" height="3" fill="#4ade80"/>' +
    '<rect x="1" y="12" width="4" height="3" fill="#60a5fa"/><rect x="5" y="12" width="10" height="3" fill="#818cf8"/></svg>';

/**
 * Starts an inspector server and attaches `group` to it: `createGroup({ inspect: url })` and
 * `rankflow inspect` both come down to this.
 *
 * ```ts
 * const inspector = await attachInspector(group, { port: 9230 });
 * console.log(`inspect at ${inspector.url}`);
 * ...
 * await inspector.close();
 * ```
 */
export async function attachInspector(group: ObservableGroup, options: InspectorOptions = {}): Promise<InspectorHandle> {
    const server = await startInspectorServer(options);
    const detach = server.attach(group);
    return {
        url: server.url,
        async close() {
            detach();
            await server.close();
        }
    };
}

/** Starts the server with no group yet; `server.attach(group)` shows one. */
export async function startInspectorServer(options: InspectorOptions = {}): Promise<InspectorServer> {
    const host = options.host ?? '127.0.0.1';
    if (!isLoopbackHost(host)) {
        throw new RangeError(
            `inspector: host '${host}' is not a loopback address; the inspector only binds 127.0.0.0/8, ::1 or localhost`
        );
    }
    const port = options.port ?? 0;
    if (!Number.isInteger(port) || port < 0 || port > 65535) {
        throw new RangeError(`inspector: port must be an integer in [0, 65535], got ${options.port}`);
    }
    const machine = options.machine ?? EMPTY_MACHINE;
    assertMachineDescription(machine);
    const title = options.title ?? 'rankflow inspector';

    const recorder = new TimelineRecorder();
    const streams = new Set<ServerResponse>();
    let group: ObservableGroup | undefined;
    let stopRecording: (() => void) | undefined;
    let unsubscribe: (() => void) | undefined;

    const page = renderInspectorPage({ title });
    // The page may run exactly its own script and style and talk only to this server.
    const csp = [
        "default-src 'none'",
        `script-src '${sha256(PAGE_SCRIPT)}'`,
        `style-src '${sha256(PAGE_STYLE)}'`,
        "connect-src 'self'",
        "img-src 'self' data:",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'"
    ].join('; ');

    const hello = () => ({
        ...recorder.head(),
        backend: group?.backend,
        attached: group !== undefined,
        title,
        machine
    });

    const send = (response: ServerResponse, event: string, data: unknown) => {
        response.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
    };
    const sendEntry = (response: ServerResponse, entry: TimelineEntry) => {
        if (entry.kind === 'transition') send(response, 'transition', entry.transition);
        else send(response, 'failure', entry.failure);
    };
    const broadcast = (write: (response: ServerResponse) => void) => {
        for (const response of streams) write(response);
    };

    const openStream = (_request: IncomingMessage, response: ServerResponse) => {
        response.writeHead(200, {
            'Content-Type': 'text/event-stream; charset=utf-8',
            'Cache-Control': 'no-store, no-transform',
            Connection: 'keep-alive',
            'X-Accel-Buffering': 'no'
        });
        // Reconnect quickly: the server is local, and a replay is cheap.
        response.write('retry: 1000\n\n');
        if (group || recorder.head().size > 0) {
            send(response, 'hello', hello());
            for (const entry of recorder.entries()) sendEntry(response, entry);
            if (!group) send(response, 'detached', {});
        }
        streams.add(response);
        debug('inspector: event stream opened (%d open)', streams.size);
        const heartbeat = setInterval(() => response.write(': keep-alive\n\n'), HEARTBEAT_MS);
        heartbeat.unref();
        // The response's close, not the request's: it is what fires when the page goes away.
        response.on('close', () => {
            clearInterval(heartbeat);
            streams.delete(response);
        });
    };

    const routes: Record<string, (request: IncomingMessage, response: ServerResponse, query: URLSearchParams) => void> = {
        '/': (_request, response) => {
            reply(response, 200, 'text/html; charset=utf-8', page, { 'Content-Security-Policy': csp });
        },
        '/events': openStream,
        '/snapshot': (_request, response) => {
            const ranks = group
                ? group.snapshot()
                : lastStates(recorder).map(({ rank, state }) => ({ rank, state }));
            const whole = group?.state !== undefined ? { state: group.state, liveRanks: group.liveRanks } : {};
            replyJson(response, { size: hello().size, backend: group?.backend, attached: group !== undefined, ...whole, ranks });
        },
        '/machine': (_request, response) => replyJson(response, machine),
        // Browsers ask for it unprompted; an answer keeps their consoles free of 404s.
        '/favicon.ico': (_request, response) => reply(response, 200, 'image/svg+xml', FAVICON),
        '/recording': (_request, response) => replyJson(response, recorder.recording()),
        '/timeline.svg': (_request, response, query) => {
            const requested = Number(query.get('width'));
            const width = Number.isFinite(requested) && requested > 0 ? Math.min(Math.max(Math.round(requested), 480), 4000) : 960;
            // While a group is attached its ranks' current states are still running: draw them up to now.
            const svg = recorder.toSvg({ width, title, ...(group ? { end: epochNow() } : {}) });
            reply(response, 200, 'image/svg+xml; charset=utf-8', svg);
        }
    };

    const server = createServer((request, response) => {
        if (!isLoopbackAddress(request.socket.remoteAddress ?? '')) {
            return reply(response, 403, 'text/plain; charset=utf-8', 'rankflow inspector: loopback clients only\n');
        }
        const hostHeader = request.headers.host ?? '';
        if (!isLoopbackHost(hostnameOf(hostHeader))) {
            return reply(
                response,
                403,
                'text/plain; charset=utf-8',
                `rankflow inspector: address it as 127.0.0.1, [::1] or localhost, not '${hostHeader}'\n`
            );
        }
        if (request.method !== 'GET' && request.method !== 'HEAD') {
            return reply(response, 405, 'text/plain; charset=utf-8', 'rankflow inspector: GET only\n', { Allow: 'GET, HEAD' });
        }
        const url = new URL(request.url ?? '/', 'http://inspector.invalid');
        const route = routes[url.pathname];
        if (!route) return reply(response, 404, 'text/plain; charset=utf-8', `rankflow inspector: no ${url.pathname}\n`);
        route(request, response, url.searchParams);
    });

    await new Promise<void>((resolve, reject) => {
        const onError = (error: NodeJS.ErrnoException) => {
            reject(
                error.code === 'EADDRINUSE'
                    ? new Error(`inspector: ${host}:${port} is already in use; pass another port, or 0 for any free one`, { cause: error })
                    : error
            );
        };
        server.once('error', onError);
        server.listen(port, host, () => {
            server.off('error', onError);
            resolve();
        });
    });
    if (options.unref) server.unref();

    const address = server.address() as AddressInfo;
    const urlHost = address.family === 'IPv6' ? `[${address.address}]` : address.address;
    const url = `http://${urlHost}:${address.port}/`;
    debug('inspector: listening at %s', url);

    let closing: Promise<void> | undefined;

    return {
        url,
        recorder,
        attach(target: ObservableGroup) {
            if (group) {
                throw new Error('inspector: a group is already attached; one inspector shows one group at a time');
            }
            group = target;
            debug('inspector: showing a group of %d ranks', target.size);
            stopRecording = recorder.attach(target);
            unsubscribe = recorder.subscribe((entry) => broadcast((response) => sendEntry(response, entry)));
            // Pages already open start over with the new run.
            broadcast((response) => send(response, 'hello', hello()));

            const detach = () => {
                if (group !== target) return;
                unsubscribe?.();
                stopRecording?.();
                group = undefined;
                broadcast((response) => send(response, 'detached', {}));
            };
            return detach;
        },
        close() {
            closing ??= new Promise<void>((resolve) => {
                unsubscribe?.();
                stopRecording?.();
                group = undefined;
                for (const response of streams) response.end();
                streams.clear();
                server.close(() => resolve());
                // Keep-alive sockets would hold close() open until they time out.
                server.closeAllConnections();
            });
            return closing;
        }
    };
}

function lastStates(recorder: TimelineRecorder): Array<{ rank: number; state: string }> {
    const recording = recorder.recording();
    const states = new Map(recording.initial.map(({ rank, state }) => [rank, state]));
    for (const transition of recording.transitions) states.set(transition.rank, transition.to);
    return [...states].sort(([a], [b]) => a - b).map(([rank, state]) => ({ rank, state }));
}

function sha256(text: string): string {
    return `sha256-${createHash('sha256').update(text, 'utf8').digest('base64')}`;
}

function reply(
    response: ServerResponse,
    status: number,
    type: string,
    body: string,
    headers: Record<string, string> = {}
): void {
    response.writeHead(status, {
        'Content-Type': type,
        'Content-Length': Buffer.byteLength(body),
        'Cache-Control': 'no-store',
        'X-Content-Type-Options': 'nosniff',
        'Referrer-Policy': 'no-referrer',
        ...headers
    });
    response.end(response.req.method === 'HEAD' ? undefined : body);
}

function replyJson(response: ServerResponse, value: unknown): void {
    reply(response, 200, 'application/json; charset=utf-8', `${JSON.stringify(value)}\n`);
}
