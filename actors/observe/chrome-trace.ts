/**
 * A timeline recording as Chrome trace JSON (the Trace Event Format), which Perfetto
 * (ui.perfetto.dev) and chrome://tracing open: one process for the group, one thread per rank,
 * a complete event ('X') per state a rank was in, an instant event ('i') per failure, and
 * metadata events ('M') naming the process and the threads. Times are microseconds since the
 * recording began (its epoch time is in `otherData.startedAt`), so the file does not depend on
 * when it was made and the same recording always gives the same JSON.
 */
import { layoutTimeline } from './timeline-layout.js';
import type { TimelineRecording } from './timeline-recorder.js';

export interface ChromeTraceOptions {
    /** The trace's process id for the group; default 1. `rankflow demo --trace` passes its own pid. */
    pid?: number;
    /** The process's name in the trace; default 'rankflow group'. */
    processName?: string;
    /** Where the states the ranks are still in end, epoch ms; default: when recording ended. */
    end?: number;
}

/** The fields of the Trace Event Format this export writes; `ts` and `dur` are microseconds. */
export type ChromeTraceEvent =
    | { ph: 'X'; name: string; cat: string; ts: number; dur: number; pid: number; tid: number; args: Record<string, unknown> }
    | { ph: 'i'; name: string; cat: string; ts: number; s: 't'; pid: number; tid: number; args: Record<string, unknown> }
    | { ph: 'M'; name: 'process_name' | 'thread_name' | 'thread_sort_index'; ts: 0; pid: number; tid: number; args: { name: string } | { sort_index: number } };

export interface ChromeTrace {
    traceEvents: ChromeTraceEvent[];
    displayTimeUnit: 'ms';
    otherData: { source: 'rankflow'; ranks: number; startedAt: number; durationMs: number };
}

/**
 * The recording as a Chrome trace. Drawn from the same layout as the SVG, time to scale (no
 * idle breaks): bar for bar, the states of the picture.
 *
 * ```ts
 * await writeFile('run.trace.json', JSON.stringify(toChromeTrace(recorder.recording())));
 * ```
 */
export function toChromeTrace(recording: TimelineRecording, options: ChromeTraceOptions = {}): ChromeTrace {
    const layout = layoutTimeline(recording, { ...(options.end !== undefined ? { end: options.end } : {}), compressIdle: false });
    const pid = options.pid ?? 1;
    // Microseconds to the nanosecond: enough for any clock here, and no float noise in the file.
    const us = (ms: number) => Math.round(ms * 1e6) / 1e3;

    const metadata: ChromeTraceEvent[] = [
        { ph: 'M', name: 'process_name', ts: 0, pid, tid: 0, args: { name: options.processName ?? 'rankflow group' } }
    ];
    const timed: ChromeTraceEvent[] = [];
    for (const lane of layout.lanes) {
        metadata.push(
            { ph: 'M', name: 'thread_name', ts: 0, pid, tid: lane.rank, args: { name: `rank ${lane.rank}` } },
            { ph: 'M', name: 'thread_sort_index', ts: 0, pid, tid: lane.rank, args: { sort_index: lane.rank } }
        );
        for (const bar of lane.bars) {
            const args: Record<string, unknown> = {};
            if (bar.event !== undefined) args.event = bar.event;
            if (bar.op !== undefined) args.op = bar.op;
            if (bar.seq !== undefined) args.seq = bar.seq;
            if (!bar.closed) args.open = true;
            const ts = us(bar.start);
            timed.push({ ph: 'X', name: bar.state, cat: 'state', ts, dur: Math.max(Math.round((us(bar.end) - ts) * 1e3) / 1e3, 0), pid, tid: bar.rank, args });
        }
    }
    for (const failure of layout.failures) {
        timed.push({
            ph: 'i',
            name: `${failure.code} in ${failure.phase}`,
            cat: failure.timeout ? 'timeout' : 'failure',
            ts: us(failure.at),
            s: 't',
            pid,
            tid: failure.rank,
            args: { code: failure.code, phase: failure.phase, message: failure.message }
        });
    }
    // Viewers want each thread's events in time order; the sort is stable, so at equal times a
    // failure stays after the bar that starts with it.
    timed.sort((a, b) => a.ts - b.ts);

    return {
        traceEvents: [...metadata, ...timed],
        displayTimeUnit: 'ms',
        otherData: { source: 'rankflow', ranks: layout.size, startedAt: layout.origin, durationMs: layout.duration }
    };
}
