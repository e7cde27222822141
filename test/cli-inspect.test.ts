/**
 * `rankflow inspect` and `rankflow demo --timeline / --trace`, driven through main() (the one
 * parser) with a stand-in demo that makes a fake group, lets the observers attach before its
 * ranks move, and runs it to `destroyed`.
 */
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, test } from 'vitest';
import type { DemoRun } from '../actors/cli/command.js';
import { main } from '../actors/cli/main.js';
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

function demo(options: { fail?: boolean; seen?: DemoRun[] } = {}) {
    return async (run: DemoRun) => {
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

describe('rankflow inspect', () => {
    test('serves the run, prints the URL, hands the demo its options', async () => {
        const io = capture();
        const seen: DemoRun[] = [];
        let snapshot: unknown;
        const code = await main(['inspect', '--port', '0', '--exit', '--ranks', '2', '--quiet'], {
            ...io,
            runDemo: async (run) => {
                const url = io.lines.find((l) => l.startsWith('rankflow inspector: '))!.slice('rankflow inspector: '.length);
                await demo({ seen })(run);
                snapshot = await (await fetch(new URL('snapshot', url))).json();
            }
        });
        expect(code).toBe(0);
        expect(io.lines[0]).toMatch(/^rankflow inspector: http:\/\/127\.0\.0\.1:\d+\/$/);
        expect(seen[0]!.settings).toEqual({ ranks: 2, backend: 'auto', tokens: 256, hidden: 1024, rounds: 100, quiet: true });
        expect(seen[0]!.observers).toHaveLength(1);
        expect(snapshot).toMatchObject({ attached: false, ranks: [{ state: 'destroyed' }, { state: 'destroyed' }] });
    });

    test('keeps serving after the demo until stopped', async () => {
        const io = capture();
        const stop = new AbortController();
        const running = main(['inspect', '--port=0'], { ...io, runDemo: demo(), signal: stop.signal });
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
        const code = await main(['inspect', '--port', '0', '--exit', '--timeline', file], { ...io, runDemo: demo({ fail: true }) });
        expect(code).toBe(1);
        expect(io.lines).toContain('demo failed: rank 1: TIMEOUT_CPU in barrier.wait');
        const marks = withAttr(parseSvg(await readFile(file, 'utf8')), 'data-failure');
        expect(marks.map((m) => [m.attrs['data-failed-rank'], m.attrs['data-code'], m.attrs['data-phase']])).toEqual([
            ['1', 'TIMEOUT_CPU', 'barrier.wait']
        ]);
    });

    test('usage errors exit 2 with the usage, before the demo or the server starts', async () => {
        const io = capture();
        const seen: DemoRun[] = [];
        expect(await main(['inspect', '--port', 'x', '--exit'], { ...io, runDemo: demo({ seen }) })).toBe(2);
        expect(io.lines.join('\n')).toMatch(/--port must be an integer[\s\S]*usage: rankflow inspect/);
        expect(await main(['inspect', '--timeline'], { ...io, runDemo: demo({ seen }) })).toBe(2);
        expect(await main(['inspect', '--bogus'], { ...io, runDemo: demo({ seen }) })).toBe(2);
        expect(await main(['inspect', '--ranks', 'two'], { ...io, runDemo: demo({ seen }) })).toBe(2);
        expect(await main(['inspect', '--host', '0.0.0.0', '--port', '0', '--exit'], { ...io, runDemo: demo({ seen }) })).toBe(2);
        expect(io.lines.join('\n')).toMatch(/not a loopback address/);
        expect(seen).toEqual([]);
        expect(io.lines.some((line) => line.startsWith('rankflow inspector: '))).toBe(false);
    });
});

describe('rankflow demo --timeline / --trace', () => {
    test('writes the demo timeline as SVG: a lane per rank, start-up to destroyed', async () => {
        const io = capture();
        const file = join(await tempDir(), 'out.svg');
        const seen: DemoRun[] = [];
        expect(await main(['demo', '--timeline', file, '--ranks', '2'], { ...io, runDemo: demo({ seen }) })).toBe(0);
        expect(seen[0]!.settings.ranks).toBe(2);
        expect(io.lines).toContain(`timeline written to ${file}`);
        const lanes = withAttr(parseSvg(await readFile(file, 'utf8')), 'data-lane');
        expect(lanes.map((lane) => withAttr(lane, 'data-state').map((bar) => bar.attrs['data-state']))).toEqual([
            ['init', 'registerWindow', 'ready', 'destroying', 'destroyed'],
            ['init', 'registerWindow', 'ready', 'destroying', 'destroyed']
        ]);
    });

    test('writes the run as a Chrome trace: a thread per rank, its states in order', async () => {
        const io = capture();
        const file = join(await tempDir(), 'run.trace.json');
        expect(await main(['demo', `--trace=${file}`], { ...io, runDemo: demo() })).toBe(0);
        expect(io.lines.some((line) => line.startsWith(`trace written to ${file}`))).toBe(true);
        const trace = JSON.parse(await readFile(file, 'utf8')) as { traceEvents: Array<{ ph: string; tid: number; name: string; args: { name?: string } }> };
        const threads = trace.traceEvents.filter((e) => e.ph === 'M' && e.name === 'thread_name').map((e) => [e.tid, e.args.name]);
        expect(threads).toEqual([[0, 'rank 0'], [1, 'rank 1']]);
        const states = (tid: number) => trace.traceEvents.filter((e) => e.ph === 'X' && e.tid === tid).map((e) => e.name);
        expect(states(1)).toEqual(['init', 'registerWindow', 'ready', 'destroying', 'destroyed']);
    });

    test('a failing demo exits 1 and still writes the timeline', async () => {
        const io = capture();
        const file = join(await tempDir(), 'fail.svg');
        expect(await main(['demo', '--timeline', file], { ...io, runDemo: demo({ fail: true }) })).toBe(1);
        expect(io.lines).toContain('demo failed: rank 1: TIMEOUT_CPU in barrier.wait');
        expect(withAttr(parseSvg(await readFile(file, 'utf8')), 'data-failure')).toHaveLength(1);
    });

    test('without --timeline or --trace it only runs the demo, with no observers', async () => {
        const seen: DemoRun[] = [];
        expect(await main(['demo', '--ranks', '2'], { ...capture(), runDemo: demo({ seen }) })).toBe(0);
        expect(seen[0]!.observers).toEqual([]);
    });
});
