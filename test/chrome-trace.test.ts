/**
 * toChromeTrace: a recording as Chrome trace JSON (the Trace Event Format that Perfetto and
 * chrome://tracing read), checked against the format's rules and against the recorded run
 * itself: a thread per rank, a complete event per state, an instant per failure.
 */
import { describe, expect, test } from 'vitest';
import { TimelineRecorder, toChromeTrace, type ChromeTrace, type TimelineRecording } from '../actors/index.js';
import { FakeGroup } from './fixtures/fake-group.js';
import { RUN_START, recordedRun } from './fixtures/recorded-run.js';

type Event = Record<string, unknown>;

/** The fields each phase type must carry, and their types (Trace Event Format, "JSON Object Format"). */
function formatErrors(trace: unknown): string[] {
    const errors: string[] = [];
    const t = trace as { traceEvents?: unknown };
    if (!t || typeof t !== 'object' || !Array.isArray(t.traceEvents)) return ['traceEvents is not an array'];
    const lastTs = new Map<string, number>();
    t.traceEvents.forEach((raw, i) => {
        const e = raw as Event;
        const where = `traceEvents[${i}] (${String(e.ph)} ${String(e.name)})`;
        if (typeof e.name !== 'string' || e.name === '') errors.push(`${where}: name must be a non-empty string`);
        if (!Number.isInteger(e.pid) || !Number.isInteger(e.tid)) errors.push(`${where}: pid and tid must be integers`);
        if (e.ph === 'M') {
            if (!['process_name', 'thread_name', 'thread_sort_index', 'process_sort_index'].includes(e.name as string)) {
                errors.push(`${where}: unknown metadata name`);
            }
            const args = e.args as Event | undefined;
            const ok = e.name === 'thread_sort_index' ? Number.isInteger(args?.sort_index) : typeof args?.name === 'string';
            if (!ok) errors.push(`${where}: metadata without its argument`);
            return;
        }
        if (typeof e.ts !== 'number' || !Number.isFinite(e.ts) || e.ts < 0) errors.push(`${where}: ts must be a finite number >= 0`);
        if (e.ph === 'X') {
            if (typeof e.dur !== 'number' || !Number.isFinite(e.dur) || e.dur < 0) errors.push(`${where}: dur must be >= 0`);
        } else if (e.ph === 'i') {
            if (!['t', 'p', 'g'].includes(e.s as string)) errors.push(`${where}: instant scope s must be t, p or g`);
        } else {
            errors.push(`${where}: phase ${String(e.ph)} is not written by this export`);
        }
        const key = `${String(e.pid)}/${String(e.tid)}`;
        if ((lastTs.get(key) ?? -Infinity) > (e.ts as number)) errors.push(`${where}: ts goes back in time on ${key}`);
        lastTs.set(key, e.ts as number);
    });
    return errors;
}

const trace: ChromeTrace = toChromeTrace(recordedRun);
const events = trace.traceEvents as Event[];

describe('toChromeTrace', () => {
    test('follows the Trace Event Format: fields per phase, non-negative durations, time order per thread', () => {
        expect(formatErrors(trace)).toEqual([]);
        expect(trace.displayTimeUnit).toBe('ms');
        // The checker itself catches what it should.
        expect(formatErrors({ traceEvents: [{ ph: 'X', name: 'a', pid: 1, tid: 0, ts: 5, dur: -1 }] })).toHaveLength(1);
        expect(formatErrors({ traceEvents: [
            { ph: 'i', name: 'a', pid: 1, tid: 0, ts: 5, s: 't' },
            { ph: 'i', name: 'b', pid: 1, tid: 0, ts: 4, s: 't' }
        ] })).toHaveLength(1);
    });

    test('names the process and one thread per rank', () => {
        const meta = events.filter((e) => e.ph === 'M');
        expect(meta.filter((e) => e.name === 'process_name').map((e) => (e.args as Event).name)).toEqual(['rankflow group']);
        expect(meta.filter((e) => e.name === 'thread_name').map((e) => [e.tid, (e.args as Event).name])).toEqual([
            [0, 'rank 0'], [1, 'rank 1'], [2, 'rank 2'], [3, 'rank 3']
        ]);
        expect(new Set(events.map((e) => e.pid))).toEqual(new Set([1]));
        expect(toChromeTrace(recordedRun, { pid: 4242 }).traceEvents.every((e) => e.pid === 4242)).toBe(true);
    });

    test('has a complete event per state a rank was in, from the transition into it to the next, in µs', () => {
        for (const rank of [0, 1, 2, 3]) {
            const own = recordedRun.transitions.filter((t) => t.rank === rank);
            const starts = [RUN_START, ...own.map((t) => t.at)];
            const ends = [...own.map((t) => t.at), recordedRun.endedAt!];
            const bars = events.filter((e) => e.ph === 'X' && e.tid === rank);
            expect(bars.map((e) => e.name)).toEqual(['init', ...own.map((t) => t.to)]);
            bars.forEach((bar, i) => {
                // Written to the nanosecond.
                expect(bar.ts).toBeCloseTo((starts[i]! - RUN_START) * 1000, 2);
                expect(bar.dur).toBeCloseTo((ends[i]! - starts[i]!) * 1000, 2);
            });
        }
        // The collective a state was entered for rides along in args.
        const dispatch = events.find((e) => e.ph === 'X' && e.tid === 3 && e.name === 'dispatching')!;
        expect(dispatch.args).toMatchObject({ event: 'DISPATCH', op: 'dispatch', seq: 3 });
    });

    test('has an instant event per failure, on the failed rank, at the time it entered failed', () => {
        const instants = events.filter((e) => e.ph === 'i');
        expect(instants.map((e) => [e.tid, e.name, e.cat])).toEqual([
            [2, 'TIMEOUT_GPU in dispatch.recv', 'timeout'],
            [0, 'RANK_FAILED in dispatch', 'failure'],
            [1, 'RANK_FAILED in dispatch', 'failure'],
            [3, 'RANK_FAILED in dispatch', 'failure']
        ]);
        const intoFailed = recordedRun.transitions.find((t) => t.rank === 2 && t.to === 'failed')!;
        expect(instants[0]!.ts).toBeCloseTo((intoFailed.at - RUN_START) * 1000, 2);
        expect(instants[0]!.args).toMatchObject({ message: 'dispatch #9: no tokens from rank 3 within 100 s' });
    });

    test('is plain data, the same for the same recording, also after a JSON round trip', () => {
        const again = toChromeTrace(JSON.parse(JSON.stringify(recordedRun)) as TimelineRecording);
        expect(JSON.stringify(again)).toBe(JSON.stringify(trace));
        expect(trace.otherData).toMatchObject({ source: 'rankflow', ranks: 4, startedAt: RUN_START });
    });

    test('recorder.toChromeTrace() exports what the recorder holds', () => {
        const group = new FakeGroup(2);
        const recorder = new TimelineRecorder();
        const stop = recorder.attach(group);
        group.moveAll('registerWindow', 'xstate.done.actor.init');
        group.moveAll('ready', 'xstate.done.actor.registerWindow');
        stop();
        const exported = recorder.toChromeTrace();
        expect(formatErrors(exported)).toEqual([]);
        expect(exported).toEqual(toChromeTrace(recorder.recording()));
        expect(exported.traceEvents.filter((e) => e.ph === 'X' && e.tid === 1).map((e) => e.name)).toEqual(['init', 'registerWindow', 'ready']);
    });
});
