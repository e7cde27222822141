/**
 * The timeline recorder: listens to a group's `transition` and `failed` events and keeps them as
 * a {@link TimelineRecording}, plain JSON on purpose: the inspector serves it, tests feed a
 * fixture of it, and a run saved with `JSON.stringify(recorder.recording())` can be drawn again
 * later (timeline-svg.ts) or exported for Perfetto (chrome-trace.ts), unchanged.
 */
import { toChromeTrace, type ChromeTrace, type ChromeTraceOptions } from './chrome-trace.js';
import { debug } from './debug.js';
import { epochNow, type GroupObserver, type ObservableGroup, type RankFailureError, type TransitionEvent } from './observer.js';
import { renderTimelineSvg, type TimelineSvgOptions } from './timeline-svg.js';

/** A failure as recorded: the group's event does not carry a time, so the recorder stamps one. */
export interface FailureRecord {
    rank: number;
    at: number;
    code: string;
    message: string;
    /** The state the rank was in when it failed. */
    state?: string;
    phase?: string;
}

/** Everything a timeline is drawn from. Plain data: it survives `JSON.stringify`. */
export interface TimelineRecording {
    size: number;
    /** When recording began (epoch ms); the first state of each lane starts here. */
    startedAt: number;
    /** When recording stopped; absent while it is still running. */
    endedAt?: number;
    /** Each rank's state when recording began. */
    initial: Array<{ rank: number; state: string }>;
    transitions: TransitionEvent[];
    failures: FailureRecord[];
}

/** One recorded item, tagged, in the order it arrived. */
export type TimelineEntry =
    | { kind: 'transition'; transition: TransitionEvent }
    | { kind: 'failure'; failure: FailureRecord };

export interface TimelineRecorderOptions {
    /**
     * How many entries to keep; default 200000. Past it the oldest are folded into the initial
     * states, so a long benchmark keeps a correct window of its latest activity in bounded memory.
     */
    maxEntries?: number;
}

/**
 * Records a group's transitions and failures as a {@link TimelineRecording}.
 *
 * ```ts
 * const recorder = new TimelineRecorder();
 * const stop = recorder.attach(group);   // before the ranks start, to see them from 'init'
 * ...
 * await group.destroy();
 * stop();
 * await writeFile('run.svg', recorder.toSvg());
 * await writeFile('run.trace.json', JSON.stringify(recorder.toChromeTrace()));
 * ```
 */
export class TimelineRecorder implements GroupObserver {
    private size = 0;
    private startedAt = 0;
    private endedAt: number | undefined;
    private initial = new Map<number, string>();
    private log: TimelineEntry[] = [];
    private readonly maxEntries: number;
    private readonly listeners = new Set<(entry: TimelineEntry) => void>();
    private detach: (() => void) | undefined;

    constructor(options: TimelineRecorderOptions = {}) {
        this.maxEntries = options.maxEntries ?? 200_000;
        if (!(this.maxEntries >= 1)) {
            throw new RangeError(`TimelineRecorder: maxEntries must be at least 1, got ${options.maxEntries}`);
        }
    }

    attach(group: ObservableGroup): () => void {
        if (this.detach) {
            throw new Error('TimelineRecorder.attach: already recording a group; call the function attach returned first');
        }
        this.size = group.size;
        this.startedAt = epochNow();
        this.endedAt = undefined;
        this.initial = new Map(group.snapshot().map(({ rank, state }) => [rank, state]));
        this.log = [];

        const onTransition = (transition: TransitionEvent) => {
            // Copied field by field: the group may reuse or extend its event objects, and the
            // recording must stay plain data.
            const record: TransitionEvent = {
                rank: transition.rank,
                from: transition.from,
                to: transition.to,
                event: transition.event,
                at: transition.at
            };
            if (transition.op !== undefined) record.op = transition.op;
            if (transition.seq !== undefined) record.seq = transition.seq;
            if (transition.phase !== undefined) record.phase = transition.phase;
            // a release is not a failure (no 'failed' event): its error comes with the transition only
            if (transition.to === 'released' && transition.error) record.error = { ...transition.error };
            this.push({ kind: 'transition', transition: record });
        };
        const onFailed = ({ rank, error }: { rank: number; error: RankFailureError }) => {
            const record: FailureRecord = {
                rank,
                at: epochNow(),
                code: error?.code ?? 'UNKNOWN',
                message: error?.message ?? String(error)
            };
            if (error?.state !== undefined) record.state = error.state;
            if (error?.phase !== undefined) record.phase = error.phase;
            this.push({ kind: 'failure', failure: record });
        };
        group.on('transition', onTransition);
        group.on('failed', onFailed);

        const detach = () => {
            if (this.detach !== detach) return;
            group.off('transition', onTransition);
            group.off('failed', onFailed);
            this.endedAt = epochNow();
            this.detach = undefined;
            debug('timeline: stopped after %d entries', this.log.length);
        };
        this.detach = detach;
        debug('timeline: recording %d ranks', this.size);
        return detach;
    }

    /** Whether a group is being recorded now. */
    get isRecording(): boolean {
        return this.detach !== undefined;
    }

    /** A copy of what was recorded so far. */
    recording(): TimelineRecording {
        const recording: TimelineRecording = {
            ...this.head(),
            transitions: [],
            failures: []
        };
        for (const entry of this.log) {
            if (entry.kind === 'transition') recording.transitions.push({ ...entry.transition });
            else recording.failures.push({ ...entry.failure });
        }
        if (this.endedAt !== undefined) recording.endedAt = this.endedAt;
        return recording;
    }

    /** The recording without its entries: cheap, for a stream's header. */
    head(): Pick<TimelineRecording, 'size' | 'startedAt' | 'initial'> {
        return {
            size: this.size,
            startedAt: this.startedAt,
            initial: [...this.initial].sort(([a], [b]) => a - b).map(([rank, state]) => ({ rank, state }))
        };
    }

    /** The entries kept, in arrival order; not copied, so read them only. */
    entries(): readonly TimelineEntry[] {
        return this.log;
    }

    /** Calls `listener` with every entry recorded from now on; returns the function that stops. */
    subscribe(listener: (entry: TimelineEntry) => void): () => void {
        this.listeners.add(listener);
        return () => {
            this.listeners.delete(listener);
        };
    }

    /** Draws what was recorded so far; see {@link renderTimelineSvg}. */
    toSvg(options?: TimelineSvgOptions): string {
        return renderTimelineSvg(this.recording(), options);
    }

    /** What was recorded so far as Chrome trace JSON, for Perfetto; see {@link toChromeTrace}. */
    toChromeTrace(options?: ChromeTraceOptions): ChromeTrace {
        return toChromeTrace(this.recording(), options);
    }

    private push(entry: TimelineEntry): void {
        this.log.push(entry);
        // Trimmed in batches of a quarter so the cost of dropping stays amortised O(1).
        if (this.log.length > this.maxEntries + Math.ceil(this.maxEntries / 4)) {
            const dropped = this.log.splice(0, this.log.length - this.maxEntries);
            for (const old of dropped) {
                if (old.kind !== 'transition') continue;
                this.initial.set(old.transition.rank, old.transition.to);
                this.startedAt = Math.max(this.startedAt, old.transition.at);
            }
        }
        for (const listener of this.listeners) listener(entry);
    }
}
