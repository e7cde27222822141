/**
 * The timeline: what TimelineRecorder keeps of a group's events, and the structure of the SVG
 * renderTimelineSvg draws from a recorded run (lanes, bars, collective guides, failure marks,
 * idle breaks, axis, legend, labels that fit), checked as elements and attributes rather than
 * pixels; test/inspector.e2e.test.ts measures the labels in a browser.
 */
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, test } from 'vitest';
import {
    TimelineRecorder,
    axisTicks,
    layoutTimeline,
    renderTimelineSvg,
    textWidth,
    type TimelineRecording
} from '../actors/observe/timeline.js';
import { FakeGroup } from './fixtures/fake-group.js';
import { RUN_START, recordedRun } from './fixtures/recorded-run.js';
import { parseSvg, textOf, withAttr, type SvgNode } from './fixtures/svg-tree.js';

const SAMPLE_TITLE = 'rankflow timeline: a recorded 4-rank run (test fixture)';

/** The repository root (the folder with package.json), also when this runs compiled from dist/test. */
function repoRoot(): string {
    let dir = dirname(fileURLToPath(import.meta.url));
    while (!existsSync(join(dir, 'package.json'))) dir = dirname(dir);
    return dir;
}

function lanesOf(svg: string): SvgNode[] {
    return withAttr(parseSvg(svg), 'data-lane');
}

function barsOf(lane: SvgNode): SvgNode[] {
    return withAttr(lane, 'data-state');
}

describe('renderTimelineSvg', () => {
    const svg = renderTimelineSvg(recordedRun, { title: SAMPLE_TITLE });

    test('draws one lane per rank, in rank order', () => {
        expect(lanesOf(svg).map((lane) => lane.attrs['data-lane'])).toEqual(['0', '1', '2', '3']);
        expect(lanesOf(svg).map((lane) => textOf(lane.children[0]!))).toEqual(['rank 0', 'rank 1', 'rank 2', 'rank 3']);
    });

    test('draws a bar per state a rank was in, in the order it was in them', () => {
        const rank0 = barsOf(lanesOf(svg)[0]!).map((bar) => bar.attrs['data-state']);
        expect(rank0).toEqual([
            'init', 'registerWindow', 'ready',
            'barrier', 'ready', 'allGathering', 'ready', 'dispatching', 'ready', 'combining', 'ready',
            'session.opening', 'session.open', 'session.gathering', 'session.open',
            'session.reducing', 'session.open', 'session.closing', 'ready',
            'dispatching', 'failed', 'destroying', 'destroyed'
        ]);
        // Every lane: the initial state, then one bar per transition the rank made.
        for (const lane of lanesOf(svg)) {
            const rank = Number(lane.attrs['data-lane']);
            const own = recordedRun.transitions.filter((t) => t.rank === rank);
            expect(barsOf(lane).map((bar) => bar.attrs['data-state'])).toEqual(['init', ...own.map((t) => t.to)]);
        }
    });

    test('gives each bar its start and duration in ms; the last one stays open to the end', () => {
        const bars = barsOf(lanesOf(svg)[0]!);
        const first = recordedRun.transitions.filter((t) => t.rank === 0);
        expect(bars[0]!.attrs).toMatchObject({ 'data-state': 'init', 'data-start': '0', 'data-duration': '3' });
        expect(bars[1]!.attrs).toMatchObject({ 'data-state': 'registerWindow', 'data-start': '3', 'data-duration': '38' });
        const last = bars[bars.length - 1]!;
        expect(last.attrs['data-state']).toBe('destroyed');
        expect('data-open' in last.attrs).toBe(true);
        expect(Number(last.attrs['data-duration'])).toBeCloseTo(recordedRun.endedAt! - first[first.length - 1]!.at, 2);
        expect(bars.filter((bar) => 'data-open' in bar.attrs)).toHaveLength(1);
        expect(textOf(bars[1]!)).toContain('rank 0 · registerWindow · 38 ms');
    });

    test('lines up each collective across the ranks that took part, in order', () => {
        const guides = withAttr(parseSvg(svg), 'data-collective');
        expect(guides.map((g) => g.attrs['data-collective'])).toEqual([
            'barrier#1', 'allGather#2', 'dispatch#3', 'combine#4',
            'openSession#5', 'allGather#6', 'reduceScatter#7', 'closeSession#8', 'dispatch#9'
        ]);
        expect(guides.every((g) => g.attrs['data-ranks'] === '4')).toBe(true);

        // dispatch #3: rank 3 came in 6.5 ms after rank 0, so its guide bends toward rank 3's lane.
        const dispatch3 = guides[2]!;
        const path = dispatch3.children.find((c) => c.tag === 'path')!.attrs.d!;
        const xs = [...path.matchAll(/[ML]([\d.]+) /g)].map((m) => Number(m[1]));
        expect(Math.max(...xs) - Math.min(...xs)).toBeGreaterThan(10);
        expect(textOf(dispatch3)).toContain('dispatch #3');
    });

    test('marks every failure and timeout with its rank and phase', () => {
        const marks = withAttr(parseSvg(svg), 'data-failure');
        expect(
            marks.map((m) => [m.attrs['data-failure'], m.attrs['data-failed-rank'], m.attrs['data-code'], m.attrs['data-phase']])
        ).toEqual([
            ['timeout', '2', 'TIMEOUT_GPU', 'dispatch.recv'],
            ['error', '0', 'RANK_FAILED', 'dispatch'],
            ['error', '1', 'RANK_FAILED', 'dispatch'],
            ['error', '3', 'RANK_FAILED', 'dispatch']
        ]);
        expect(textOf(marks[0]!)).toContain('rank 2 · TIMEOUT_GPU in dispatch.recv');
        expect(textOf(marks[0]!)).toContain('no tokens from rank 3 within 100 s');
    });

    test('marks a rank that entered failed without reporting it', () => {
        const recording: TimelineRecording = {
            size: 2,
            startedAt: RUN_START,
            initial: [{ rank: 0, state: 'ready' }, { rank: 1, state: 'ready' }],
            transitions: [{ rank: 1, from: 'barrier', to: 'failed', event: 'TIMEOUT_CPU', at: RUN_START + 5, phase: 'barrier.wait' }],
            failures: []
        };
        const marks = withAttr(parseSvg(renderTimelineSvg(recording)), 'data-failure');
        expect(marks).toHaveLength(1);
        expect(marks[0]!.attrs).toMatchObject({ 'data-failure': 'timeout', 'data-failed-rank': '1', 'data-phase': 'barrier.wait' });
    });

    test("marks a run's release apart from failures: the ranks go released -> recovering -> ready, and the legend says it was a program's error", async () => {
        const { createGroup } = await import('../actors/index.js');
        const recorder = new TimelineRecorder();
        const g = await createGroup({ backend: 'host', ranks: 3, buffer: { maxTokensPerRank: 4, hidden: 64, topk: 2, numExperts: 6 }, observers: [recorder] });
        try {
            await g.run(new URL('../dist/bench/programs/fault-loop.js', import.meta.url), { ops: 10, at: 3, who: 1, how: 'throw' }).catch(() => {});
        } finally {
            await g.destroy();
        }
        const tree = parseSvg(renderTimelineSvg(recorder.recording()));
        const marks = withAttr(tree, 'data-failure');
        expect(marks.length).toBeGreaterThanOrEqual(2);  // the two ranks the thrower released (at least: in an op or at its start)
        for (const m of marks) {
            expect(m.attrs).toMatchObject({ 'data-failure': 'release', 'data-code': 'ABORTED' });
            expect(textOf(m)).toContain("rank 1's program threw: TypeError: boom");
        }
        expect(new Set(marks.map((m) => m.attrs['data-failed-rank']))).toEqual(new Set(['0', '2']));
        const legend = withAttr(tree, 'data-legend-item').map((n) => n.attrs['data-legend-item']);
        expect(legend).toEqual(expect.arrayContaining(['released', 'recovering', 'release']));
        expect(legend).not.toContain('failure');
    });

    test('has a time axis in ms', () => {
        const ticks = withAttr(parseSvg(svg), 'data-tick');
        expect(ticks.map((t) => t.attrs['data-tick'])).toEqual(['0', '50', '100', '150', '200', '250', '300']);
        expect(ticks.map(textOf)).toEqual(['0 ms', '50 ms', '100 ms', '150 ms', '200 ms', '250 ms', '300 ms']);
    });

    test('has a legend of the states drawn, in lifecycle order, then the marks used', () => {
        const items = withAttr(parseSvg(svg), 'data-legend-item').map((item) => item.attrs['data-legend-item']);
        expect(items).toEqual([
            'init', 'registerWindow', 'ready', 'barrier', 'allGathering', 'dispatching', 'combining', 'session',
            'destroying', 'destroyed', 'failed', 'collective', 'failure', 'timeout'
        ]);
    });

    test('is a standalone document that refers to nothing outside itself', () => {
        const root = parseSvg(svg);
        expect(root.children.map((c) => c.tag)).toEqual(['svg']);
        expect(root.children[0]!.attrs.xmlns).toBe('http://www.w3.org/2000/svg');
        expect(svg.replace('http://www.w3.org/2000/svg', '')).not.toMatch(/href|url\(|https?:|<image|<script|<foreignObject/i);
    });

    test('escapes names it did not choose', () => {
        const recording: TimelineRecording = {
            size: 1,
            startedAt: RUN_START,
            initial: [{ rank: 0, state: 'ready' }],
            transitions: [{ rank: 0, from: 'ready', to: 'odd<&>"state', event: 'E', at: RUN_START + 10, op: 'x<y', seq: 1 }],
            failures: []
        };
        const tree = parseSvg(renderTimelineSvg(recording));
        expect(withAttr(tree, 'data-state').map((b) => b.attrs['data-state'])).toEqual(['ready', 'odd<&>"state']);
        expect(withAttr(tree, 'data-collective')[0]!.attrs['data-collective']).toBe('x<y#1');
    });

    test('gives the same bytes for the same run, also after a JSON round trip', async () => {
        const again = renderTimelineSvg(JSON.parse(JSON.stringify(recordedRun)) as TimelineRecording, { title: SAMPLE_TITLE });
        expect(again).toBe(svg);
        // docs/timeline-sample.svg is this drawing; `vitest -u` refreshes it after a deliberate change.
        await expect(svg).toMatchFileSnapshot(join(repoRoot(), 'docs', 'timeline-sample.svg'));
    });
});

describe('layoutTimeline', () => {
    test('an empty recording still lays out its lanes', () => {
        const layout = layoutTimeline({ size: 2, startedAt: RUN_START, initial: [], transitions: [], failures: [] });
        expect(layout.lanes).toEqual([{ rank: 0, bars: [] }, { rank: 1, bars: [] }]);
        expect(layout.duration).toBe(0);
        expect(() => parseSvg(renderTimelineSvg({ size: 2, startedAt: RUN_START, initial: [], transitions: [], failures: [] }))).not.toThrow();
    });

    test('axis ticks step by 1, 2 or 5 times a power of ten', () => {
        expect(axisTicks(0)).toEqual([0]);
        expect(axisTicks(9)).toEqual([0, 2, 4, 6, 8]);
        expect(axisTicks(0.3)).toEqual([0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3]);
        expect(axisTicks(12_000)).toEqual([0, 2000, 4000, 6000, 8000, 10000, 12000]);
    });
});

describe('TimelineRecorder', () => {
    test('records transitions from attach on, with the states the ranks had then', () => {
        const group = new FakeGroup(2);
        const recorder = new TimelineRecorder();
        recorder.attach(group);
        group.move(0, 'registerWindow', 'xstate.done.actor.init');
        group.move(1, 'registerWindow', 'xstate.done.actor.init');
        group.move(0, 'ready', 'xstate.done.actor.registerWindow');

        const recording = recorder.recording();
        expect(recording.size).toBe(2);
        expect(recording.initial).toEqual([{ rank: 0, state: 'init' }, { rank: 1, state: 'init' }]);
        expect(recording.transitions.map((t) => [t.rank, t.from, t.to])).toEqual([
            [0, 'init', 'registerWindow'],
            [1, 'init', 'registerWindow'],
            [0, 'registerWindow', 'ready']
        ]);
        expect(recording.endedAt).toBeUndefined();
    });

    test('keeps op, seq and phase, and nothing the group did not send', () => {
        const group = new FakeGroup(1, 'ready');
        const recorder = new TimelineRecorder();
        recorder.attach(group);
        group.move(0, 'barrier', 'BARRIER', { op: 'barrier', seq: 4 });
        group.move(0, 'failed', 'TIMEOUT_CPU', { op: 'barrier', seq: 4, phase: 'barrier.wait' });
        const [enter, fail] = recorder.recording().transitions;
        expect(Object.keys(enter!).sort()).toEqual(['at', 'event', 'from', 'op', 'rank', 'seq', 'to']);
        expect(fail).toMatchObject({ op: 'barrier', seq: 4, phase: 'barrier.wait' });
    });

    test('stamps failures with the time they were reported', () => {
        const group = new FakeGroup(2, 'ready');
        const recorder = new TimelineRecorder();
        recorder.attach(group);
        const before = performance.timeOrigin + performance.now();
        group.fail(1, { code: 'RANK_FAILED', message: 'worker exited', rank: 1, state: 'dispatching' });
        const [failure] = recorder.recording().failures;
        expect(failure).toMatchObject({ rank: 1, code: 'RANK_FAILED', message: 'worker exited', state: 'dispatching' });
        expect(failure!.at).toBeGreaterThanOrEqual(before);
    });

    test('stops at detach, and says when', () => {
        const group = new FakeGroup(1);
        const recorder = new TimelineRecorder();
        const detach = recorder.attach(group);
        group.move(0, 'registerWindow', 'E');
        detach();
        group.move(0, 'ready', 'E');
        expect(recorder.recording().transitions).toHaveLength(1);
        expect(recorder.recording().endedAt).toBeGreaterThan(0);
        expect(recorder.isRecording).toBe(false);
        expect(group.listenerCount('transition')).toBe(0);
        expect(group.listenerCount('failed')).toBe(0);
    });

    test('refuses a second group while recording one', () => {
        const recorder = new TimelineRecorder();
        recorder.attach(new FakeGroup(1));
        expect(() => recorder.attach(new FakeGroup(1))).toThrow(/already recording/);
    });

    test('past maxEntries keeps the latest window, folding older ones into the initial states', () => {
        const group = new FakeGroup(2);
        const recorder = new TimelineRecorder({ maxEntries: 4 });
        recorder.attach(group);
        const states = ['registerWindow', 'ready', 'barrier', 'ready', 'allGathering', 'ready'];
        for (const state of states) group.moveAll(state, 'E');

        const recording = recorder.recording();
        expect(recording.transitions.length).toBeGreaterThanOrEqual(4);
        expect(recording.transitions.length).toBeLessThanOrEqual(5);
        // Replaying the kept window from the folded initial states ends where the ranks are.
        const end = new Map(recording.initial.map(({ rank, state }) => [rank, state]));
        for (const t of recording.transitions) {
            expect(t.from).toBe(end.get(t.rank));
            end.set(t.rank, t.to);
        }
        expect([...end.values()]).toEqual(['ready', 'ready']);
    });

    test('draws what it recorded', () => {
        const group = new FakeGroup(2);
        const recorder = new TimelineRecorder();
        recorder.attach(group);
        group.moveAll('registerWindow', 'E');
        group.moveAll('ready', 'E');
        const lanes = lanesOf(recorder.toSvg());
        expect(lanes.map((lane) => barsOf(lane).map((bar) => bar.attrs['data-state']))).toEqual([
            ['init', 'registerWindow', 'ready'],
            ['init', 'registerWindow', 'ready']
        ]);
    });
});

describe('idle stretches', () => {
    /** Two ranks start for 1000 ms, run one 4 ms barrier, sit ready for 2000 ms, and are destroyed. */
    const slowStart: TimelineRecording = {
        size: 2,
        startedAt: RUN_START,
        endedAt: RUN_START + 3020,
        initial: [{ rank: 0, state: 'init' }, { rank: 1, state: 'init' }],
        transitions: [0, 1].flatMap((rank) => [
            { rank, from: 'init', to: 'ready', event: 'PHASE_DONE', at: RUN_START + 1000 + rank },
            { rank, from: 'ready', to: 'barrier', event: 'BARRIER', at: RUN_START + 1005, op: 'barrier', seq: 1 },
            { rank, from: 'barrier', to: 'ready', event: 'PHASE_DONE', at: RUN_START + 1009, op: 'barrier', seq: 1 },
            { rank, from: 'ready', to: 'destroying', event: 'DESTROY', at: RUN_START + 3009 },
            { rank, from: 'destroying', to: 'destroyed', event: 'PHASE_DONE', at: RUN_START + 3015 }
        ]),
        failures: []
    };

    test('are the spans in which every rank waits, long enough to matter', () => {
        // Worker start-up and the ready after it (both waiting) until the barrier, then the long
        // ready until destroying; the 5 ms in destroyed at the end is too short to matter.
        expect(layoutTimeline(slowStart).breaks).toEqual([{ start: 0, end: 1005 }, { start: 1009, end: 3009 }]);
        expect(layoutTimeline(slowStart, { compressIdle: false }).breaks).toEqual([]);
    });

    test('never cover a state that works, nor a failure', () => {
        // recordedRun waits 100 ms in dispatching before it times out: that is the story, not idle time.
        expect(layoutTimeline(recordedRun).breaks).toEqual([]);
        const failing: TimelineRecording = {
            ...slowStart,
            failures: [{ rank: 1, at: RUN_START + 2000, code: 'RANK_FAILED', message: 'rank 0 failed', state: 'ready' }]
        };
        const breaks = layoutTimeline(failing).breaks;
        expect(breaks.some((b) => b.start < 2000 && b.end > 2000)).toBe(false);
    });

    test('are drawn shrunk, so the operations get the width; bars keep their real durations', () => {
        const svg = renderTimelineSvg(slowStart, { width: 960 });
        const tree = parseSvg(svg);
        expect(withAttr(tree, 'data-break').map((b) => [b.attrs['data-start'], b.attrs['data-duration']])).toEqual([
            ['0', '1005'], ['1009', '2000']
        ]);
        const barrier = withAttr(tree, 'data-state').find((bar) => bar.attrs['data-state'] === 'barrier')!;
        expect(barrier.attrs['data-duration']).toBe('4');
        // To scale, 4 ms of 3020 would be 1 px of the 872 px plot; with the breaks it is a visible bar.
        const width = (svgText: string) => {
            const bar = withAttr(parseSvg(svgText), 'data-state').find((b) => b.attrs['data-state'] === 'barrier')!;
            return Number(bar.children.find((c) => c.tag === 'rect')!.attrs.width);
        };
        expect(width(renderTimelineSvg(slowStart, { compressIdle: false }))).toBeLessThan(2);
        expect(width(svg)).toBeGreaterThan(50);
        expect(withAttr(tree, 'data-legend-item').map((i) => i.attrs['data-legend-item'])).toContain('break');
    });

    test('leave no tick inside a break; labelled ticks stay apart and inside the drawing', () => {
        const tree = parseSvg(renderTimelineSvg(slowStart, { width: 960 }));
        const ticks = withAttr(tree, 'data-tick').map((t) => Number(t.attrs['data-tick']));
        expect(ticks.length).toBeGreaterThan(2);
        for (const tick of ticks) expect((tick > 0 && tick < 1005) || (tick > 1009 && tick < 3009)).toBe(false);
        const xs = withAttr(tree, 'data-tick').map((t) => Number(t.attrs.x));
        expect(xs).toEqual([...xs].sort((a, b) => a - b));
    });
});

describe('labels', () => {
    /** Each label's box by the renderer's own width bound: x, x + textWidth. */
    function labelBoxes(svg: string, kind: string, size: number) {
        return withAttr(parseSvg(svg), 'data-label')
            .filter((label) => label.attrs['data-label'] === kind)
            .map((label) => ({ text: textOf(label), x0: Number(label.attrs.x), x1: Number(label.attrs.x) + textWidth(textOf(label), size), y: label.attrs.y }));
    }

    test('collective labels never overlap in a row, nor run past the right edge', () => {
        for (const width of [480, 700, 960, 1400]) {
            const svg = renderTimelineSvg(recordedRun, { width });
            const boxes = labelBoxes(svg, 'collective', 10);
            expect(boxes.length).toBeGreaterThan(0);
            for (const box of boxes) expect(box.x1).toBeLessThanOrEqual(width);
            for (const a of boxes) {
                for (const b of boxes) {
                    if (a !== b && a.y === b.y) expect(a.x1 <= b.x0 || b.x1 <= a.x0).toBe(true);
                }
            }
        }
    });

    test('a state label fits inside its bar, shortened first, dropped when nothing fits', () => {
        const svg = renderTimelineSvg(recordedRun, { width: 700 });
        for (const bar of withAttr(parseSvg(svg), 'data-state')) {
            const label = bar.children.find((c) => c.attrs['data-label'] === 'state');
            if (!label) continue;
            const rect = bar.children.find((c) => c.tag === 'rect')!;
            const x0 = Number(rect.attrs.x);
            const x1 = x0 + Number(rect.attrs.width);
            expect(Number(label.attrs.x)).toBeGreaterThanOrEqual(x0);
            expect(Number(label.attrs.x) + textWidth(textOf(label), 11)).toBeLessThanOrEqual(x1);
        }
        const texts = withAttr(parseSvg(svg), 'data-label').map(textOf);
        expect(texts.some((t) => t.endsWith('…'))).toBe(true);
    });
});
