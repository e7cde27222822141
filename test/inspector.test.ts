/**
 * The inspector server on an ephemeral loopback port, fed by a fake group: the event stream
 * (history to late joiners, then live), the JSON endpoints, the page's headers, and the refusal of
 * anything that is not loopback.
 */
import { request as httpRequest } from 'node:http';
import { createHash } from 'node:crypto';
import { afterEach, describe, expect, test } from 'vitest';
import {
    attachInspector,
    inspectorAddress,
    isLoopbackHost,
    startInspectorServer,
    type InspectorServer
} from '../actors/observe/inspector.js';
import { PAGE_SCRIPT, PAGE_STYLE } from '../actors/observe/inspector-page.js';
import type { MachineDescription } from '../actors/observe/machine-graph.js';
import type { TimelineRecording } from '../actors/observe/timeline.js';
import { FakeGroup } from './fixtures/fake-group.js';
import { SseClient } from './fixtures/sse-client.js';
import { parseSvg, withAttr } from './fixtures/svg-tree.js';

const machine: MachineDescription = {
    states: ['init', 'registerWindow', 'ready', 'destroying', 'destroyed', 'failed'],
    transitions: [
        { from: 'init', to: 'registerWindow', event: 'xstate.done.actor.init' },
        { from: 'registerWindow', to: 'ready', event: 'xstate.done.actor.registerWindow' }
    ]
};

interface Reply {
    status: number;
    headers: Record<string, string | string[] | undefined>;
    body: string;
}

function call(url: string, options: { method?: string; headers?: Record<string, string> } = {}): Promise<Reply> {
    return new Promise((resolve, reject) => {
        const req = httpRequest(url, { method: options.method ?? 'GET', headers: options.headers }, (res) => {
            let body = '';
            res.setEncoding('utf8');
            res.on('data', (chunk: string) => (body += chunk));
            res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body }));
        });
        req.on('error', reject);
        req.end();
    });
}

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
    while (cleanups.length) await cleanups.pop()!();
});

async function serve(group?: FakeGroup): Promise<InspectorServer> {
    const server = await startInspectorServer({ port: 0, machine });
    cleanups.push(() => server.close());
    if (group) server.attach(group);
    return server;
}

async function stream(url: string): Promise<SseClient> {
    const client = await SseClient.open(new URL('events', url).href);
    cleanups.push(() => client.close());
    return client;
}

describe('attachInspector', () => {
    test('listens on 127.0.0.1 at an ephemeral port and says where', async () => {
        const inspector = await attachInspector(new FakeGroup(2), { port: 0 });
        cleanups.push(() => inspector.close());
        expect(inspector.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/$/);
        expect((await call(inspector.url)).status).toBe(200);
    });

    test('close() lets the group go and stops listening', async () => {
        const group = new FakeGroup(2);
        const inspector = await attachInspector(group, { port: 0 });
        await inspector.close();
        expect(group.listenerCount('transition')).toBe(0);
        await expect(call(inspector.url)).rejects.toThrow(/ECONNREFUSED/);
    });
});

describe('/events', () => {
    test('a late joiner gets hello, then the history in order, then live events', async () => {
        const group = new FakeGroup(2);
        const server = await serve(group);
        group.move(0, 'registerWindow', 'xstate.done.actor.init');
        group.move(1, 'registerWindow', 'xstate.done.actor.init');
        group.fail(1, { code: 'TIMEOUT_CPU', message: 'registerWindow took too long', rank: 1, state: 'registerWindow' });

        const client = await stream(server.url);
        await client.waitFor(4);
        expect(client.events.map((e) => e.event)).toEqual(['hello', 'transition', 'transition', 'failure']);
        expect(client.events[0]!.data).toMatchObject({
            size: 2,
            backend: 'host',
            attached: true,
            machine,
            initial: [{ rank: 0, state: 'init' }, { rank: 1, state: 'init' }]
        });
        expect(client.events[1]!.data).toMatchObject({ rank: 0, from: 'init', to: 'registerWindow' });
        expect(client.events[3]!.data).toMatchObject({ rank: 1, code: 'TIMEOUT_CPU', state: 'registerWindow' });

        group.move(0, 'ready', 'xstate.done.actor.registerWindow', { op: 'barrier', seq: 1 });
        const transitions = await client.waitFor(3, 'transition');
        expect(transitions[2]!.data).toMatchObject({ rank: 0, from: 'registerWindow', to: 'ready', op: 'barrier', seq: 1 });
    });

    test('every open stream gets every live event', async () => {
        const group = new FakeGroup(1);
        const server = await serve(group);
        const [a, b] = await Promise.all([stream(server.url), stream(server.url)]);
        await Promise.all([a.waitFor(1, 'hello'), b.waitFor(1, 'hello')]);
        group.move(0, 'registerWindow', 'E');
        group.move(0, 'ready', 'E');
        for (const client of [a, b]) {
            const got = await client.waitFor(2, 'transition');
            expect(got.map((e) => (e.data as { to: string }).to)).toEqual(['registerWindow', 'ready']);
        }
    });

    test('a stream opened before any group waits, then starts with the group that attaches', async () => {
        const server = await serve();
        const client = await stream(server.url);
        await new Promise((resolve) => setTimeout(resolve, 50));
        expect(client.events).toEqual([]);

        const group = new FakeGroup(3, 'init');
        server.attach(group);
        group.move(2, 'registerWindow', 'E');
        await client.waitFor(1, 'transition');
        expect(client.events.map((e) => e.event)).toEqual(['hello', 'transition']);
        expect(client.events[0]!.data).toMatchObject({ size: 3 });
    });

    test('detaching the group tells open streams, and later ones still get the run', async () => {
        const group = new FakeGroup(1, 'ready');
        const server = await serve();
        const detach = server.attach(group);
        const early = await stream(server.url);
        group.move(0, 'destroying', 'DESTROY');
        detach();
        await early.waitFor(1, 'detached');

        group.move(0, 'destroyed', 'E'); // after detach: not shown
        const late = await stream(server.url);
        await late.waitFor(1, 'detached');
        expect(late.events.map((e) => e.event)).toEqual(['hello', 'transition', 'detached']);
        expect(late.events[0]!.data).toMatchObject({ attached: false });
    });

    test('close() ends open streams', async () => {
        const server = await startInspectorServer({ port: 0 });
        server.attach(new FakeGroup(1));
        const client = await SseClient.open(new URL('events', server.url).href);
        await client.waitFor(1, 'hello');
        await server.close();
        await client.waitForEnd();
    });

    test('one inspector shows one group', async () => {
        const server = await serve(new FakeGroup(1));
        expect(() => server.attach(new FakeGroup(1))).toThrow(/already attached/);
    });
});

describe('JSON and SVG endpoints', () => {
    test('/snapshot is the group snapshot', async () => {
        const group = new FakeGroup(2);
        const server = await serve(group);
        group.move(1, 'registerWindow', 'E');
        const reply = await call(new URL('snapshot', server.url).href);
        expect(reply.status).toBe(200);
        expect(reply.headers['content-type']).toMatch(/^application\/json/);
        expect(JSON.parse(reply.body)).toEqual({
            size: 2,
            backend: 'host',
            attached: true,
            ranks: [
                { rank: 0, state: 'init', seq: 0 },
                { rank: 1, state: 'registerWindow', seq: 0 }
            ]
        });
    });

    test('/snapshot after detach gives the last recorded states', async () => {
        const group = new FakeGroup(2, 'ready');
        const server = await serve();
        const detach = server.attach(group);
        group.moveAll('destroyed', 'E');
        detach();
        const body = JSON.parse((await call(new URL('snapshot', server.url).href)).body);
        expect(body).toMatchObject({ attached: false, ranks: [{ rank: 0, state: 'destroyed' }, { rank: 1, state: 'destroyed' }] });
    });

    test('/machine is the description it was given', async () => {
        const server = await serve(new FakeGroup(1));
        expect(JSON.parse((await call(new URL('machine', server.url).href)).body)).toEqual(machine);
    });

    test('/recording and /timeline.svg show the run so far', async () => {
        const group = new FakeGroup(2);
        const server = await serve(group);
        group.moveAll('registerWindow', 'E');
        group.moveAll('ready', 'E');

        const recording = JSON.parse((await call(new URL('recording', server.url).href)).body) as TimelineRecording;
        expect(recording.transitions).toHaveLength(4);

        const svg = await call(new URL('timeline.svg?width=1200', server.url).href);
        expect(svg.headers['content-type']).toMatch(/^image\/svg\+xml/);
        const tree = parseSvg(svg.body);
        expect(tree.children[0]!.attrs.width).toBe('1200');
        expect(withAttr(tree, 'data-state').map((bar) => bar.attrs['data-state'])).toEqual([
            'init', 'registerWindow', 'ready', 'init', 'registerWindow', 'ready'
        ]);
    });
});

describe('the page', () => {
    test('is served with a CSP that allows exactly its own script and style and this server', async () => {
        const server = await serve(new FakeGroup(1));
        const reply = await call(server.url);
        expect(reply.headers['content-type']).toBe('text/html; charset=utf-8');
        const csp = String(reply.headers['content-security-policy']);
        const hash = (text: string) => `'sha256-${createHash('sha256').update(text).digest('base64')}'`;
        expect(csp).toContain("default-src 'none'");
        expect(csp).toContain(`script-src ${hash(PAGE_SCRIPT)}`);
        expect(csp).toContain(`style-src ${hash(PAGE_STYLE)}`);
        expect(csp).toContain("connect-src 'self'");
        expect(reply.body).toContain(`<script>${PAGE_SCRIPT}</script>`);
        expect(reply.body).toContain(`<style>${PAGE_STYLE}</style>`);
    });

    test('loads nothing: no src, no href, no outside URL', async () => {
        const server = await serve(new FakeGroup(1));
        const { body } = await call(server.url);
        expect(body).not.toMatch(/\ssrc=|\shref=|https?:\/\/|@import|url\(/i);
    });
});

describe('loopback only', () => {
    test('refuses to bind anything but a loopback address', async () => {
        await expect(startInspectorServer({ host: '0.0.0.0' })).rejects.toThrow(/not a loopback address/);
        await expect(startInspectorServer({ host: '192.168.1.10' })).rejects.toThrow(/not a loopback address/);
        await expect(startInspectorServer({ host: 'example.com' })).rejects.toThrow(/not a loopback address/);
    });

    test('refuses requests that name it by a non-loopback Host (DNS rebinding)', async () => {
        const server = await serve(new FakeGroup(1));
        const evil = await call(new URL('snapshot', server.url).href, { headers: { Host: 'evil.example:80' } });
        expect(evil.status).toBe(403);
        const port = new URL(server.url).port;
        for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, `LOCALHOST:${port}`]) {
            expect((await call(new URL('snapshot', server.url).href, { headers: { Host: host } })).status).toBe(200);
        }
    });

    test('answers GET and HEAD only, and 404 for other paths', async () => {
        const server = await serve(new FakeGroup(1));
        const post = await call(new URL('snapshot', server.url).href, { method: 'POST' });
        expect(post.status).toBe(405);
        expect(post.headers.allow).toBe('GET, HEAD');
        const head = await call(new URL('snapshot', server.url).href, { method: 'HEAD' });
        expect([head.status, head.body]).toEqual([200, '']);
        expect((await call(new URL('nope', server.url).href)).status).toBe(404);
    });

    test('inspectorAddress accepts loopback http URLs only', () => {
        expect(inspectorAddress('http://127.0.0.1:9230')).toEqual({ host: '127.0.0.1', port: 9230 });
        expect(inspectorAddress('http://localhost')).toEqual({ host: 'localhost', port: 0 });
        expect(inspectorAddress('http://[::1]:0/')).toEqual({ host: '::1', port: 0 });
        expect(() => inspectorAddress('http://10.0.0.2:9230')).toThrow(/not loopback/);
        expect(() => inspectorAddress('https://127.0.0.1:9230')).toThrow(/http:\/\//);
        expect(() => inspectorAddress('127.0.0.1:9230')).toThrow();
    });

    test('isLoopbackHost knows 127/8, ::1 and localhost', () => {
        expect(['127.0.0.1', '127.1.2.3', '::1', '[::1]', 'localhost'].every(isLoopbackHost)).toBe(true);
        expect(['0.0.0.0', '::', '128.0.0.1', 'localhost.example', '10.0.0.1'].some(isLoopbackHost)).toBe(false);
    });

    test('a taken port is reported as such', async () => {
        const first = await serve(new FakeGroup(1));
        const port = Number(new URL(first.url).port);
        await expect(startInspectorServer({ port })).rejects.toThrow(/already in use/);
    });
});
