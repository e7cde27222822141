/**
 * `rankflow inspect` and `rankflow demo --timeline`, driven with a stand-in demo that makes a
 * fake group, lets the observers attach before its ranks move, and runs it to `destroyed`.
 */
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import { runDemoWithTimeline, runInspect, type DemoRunOptions } from '../actors/cli/inspect.js';
import { FakeGroup } from './fixtures/fake-group.js';
import { parseSvg, withAttr } from './fixtures/svg-tree.js';

const dirs: string[] = [];
afterEach(async () => {
    while (dirs.length) await rm(dirs.pop()!, { recursive: true, force: true });
});

async function tempDir(): Promise<string> {
    const dir = await mkdtemp(join(tmpdir(), 'rankflow-cli-'));
    dirs.push(dir);
    return dir;
}

function demo(options: { fail?: boolean; seen?: DemoRunOptions[] } = {}) {
    return async (run: DemoRunOptions) => {
        options.seen?.push(run);
        const group = new FakeGroup(2);
        const detach = run.observers.map((observer) => observer.attach(group));
        try {
            group.moveAll('registerWindow', 'xstate.done.actor.init');
            group.moveAll('ready', 'xstate.done.actor.registerWindow');
            if (options.fail) {
                group.move(1, 'failed', 'TIMEOUT_CPU', { phase: 'barrier.wait' });
                group.fail(1, { code: 'TIMEOUT_CPU', message: 'barrier waited too long', rank: 1 });
                throw new Error('rank 1: TIMEOUT_CPU in barrier.wait');
            }
            group.moveAll('destroying', 'DESTROY');
            group.moveAll('destroyed', 'xstate.done.actor.destroy');
        } finally {
            for (const stop of detach) stop();
        }
    };
}

function capture() {
    const lines: string[] = [];
    return { lines, out: (line: string) => lines.push(line), err: (line: string) => lines.push(line) };
}

describe('runInspect', () => {
    test('serves the run, prints the URL, hands the demo its remaining arguments', async () => {
        const io = capture();
        const seen: DemoRunOptions[] = [];
        let snapshot: unknown;
        const code = await runInspect(['--port', '0', '--exit', '--ranks', '2'], {
            ...io,
            runDemo: async (run) => {
                const url = io.lines.find((l) => l.startsWith('rankflow inspector: '))!.slice('rankflow inspector: '.length);
                await demo({ seen })(run);
                snapshot = await (await fetch(new URL('snapshot', url))).json();
            }
        });
        expect(code).toBe(0);
        expect(io.lines[0]).toMatch(/^rankflow inspector: http:\/\/127\.0\.0\.1:\d+\/$/);
        expect(seen[0]!.argv).toEqual(['--ranks', '2']);
        expect(seen[0]!.observers).toHaveLength(1);
        expect(snapshot).toMatchObject({ attached: false, ranks: [{ state: 'destroyed' }, { state: 'destroyed' }] });
    });

    test('keeps serving after the demo until stopped', async () => {
        const io = capture();
        const stop = new AbortController();
        const running = runInspect(['--port=0'], { ...io, runDemo: demo(), signal: stop.signal });
        await expect.poll(() => io.lines.some((l) => l.startsWith('inspector still serving'))).toBe(true);
        const url = io.lines[0]!.slice('rankflow inspector: '.length);
        expect((await fetch(url)).status).toBe(200);
        stop.abort();
        expect(await running).toBe(0);
        await expect(fetch(url)).rejects.toThrow();
    });

    test('a failing demo exits 1 and still writes the timeline, failure marked', async () => {
        const io = capture();
        const file = join(await tempDir(), 'nested', 'run.svg');
        const code = await runInspect(['--port', '0', '--exit', '--timeline', file], { ...io, runDemo: demo({ fail: true }) });
        expect(code).toBe(1);
        expect(io.lines).toContain('demo failed: rank 1: TIMEOUT_CPU in barrier.wait');
        const marks = withAttr(parseSvg(await readFile(file, 'utf8')), 'data-failure');
        expect(marks.map((m) => [m.attrs['data-failed-rank'], m.attrs['data-code'], m.attrs['data-phase']])).toEqual([
            ['1', 'TIMEOUT_CPU', 'barrier.wait']
        ]);
    });

    test('usage errors exit 2 with the usage', async () => {
        const io = capture();
        expect(await runInspect(['--port', 'x', '--exit'], { ...io, runDemo: demo() })).toBe(2);
        expect(io.lines.join('\n')).toMatch(/--port must be an integer[\s\S]*usage: rankflow inspect/);
        expect(await runInspect(['--timeline'], { ...io, runDemo: demo() })).toBe(2);
        expect(await runInspect(['--host', '0.0.0.0', '--port', '0', '--exit'], { ...io, runDemo: demo() })).toBe(2);
        expect(io.lines.join('\n')).toMatch(/not a loopback address/);
    });
});

describe('runDemoWithTimeline', () => {
    test('writes the demo timeline as SVG: a lane per rank, start-up to destroyed', async () => {
        const io = capture();
        const file = join(await tempDir(), 'out.svg');
        const seen: DemoRunOptions[] = [];
        expect(await runDemoWithTimeline(['--timeline', file, '--ranks', '2'], { ...io, runDemo: demo({ seen }) })).toBe(0);
        expect(seen[0]!.argv).toEqual(['--ranks', '2']);
        expect(io.lines).toContain(`timeline written to ${file}`);
        const lanes = withAttr(parseSvg(await readFile(file, 'utf8')), 'data-lane');
        expect(lanes.map((lane) => withAttr(lane, 'data-state').map((bar) => bar.attrs['data-state']))).toEqual([
            ['init', 'registerWindow', 'ready', 'destroying', 'destroyed'],
            ['init', 'registerWindow', 'ready', 'destroying', 'destroyed']
        ]);
    });

    test('without --timeline it only runs the demo, with no observers', async () => {
        const seen: DemoRunOptions[] = [];
        expect(await runDemoWithTimeline(['--ranks', '2'], { ...capture(), runDemo: demo({ seen }) })).toBe(0);
        expect(seen[0]).toEqual({ argv: ['--ranks', '2'], observers: [] });
    });
});
