/**
 * The timeline of a group's ranks: a recorder that listens to a group's `transition` and `failed`
 * events and keeps them as plain data, and a renderer that draws such a recording as one
 * standalone SVG (a lane per rank, a bar per state, a guide per collective, a mark per failure).
 *
 * The recording is plain JSON on purpose: the inspector serves it, tests feed a fixture of it, and
 * a run saved with `JSON.stringify(recorder.recording())` can be drawn again later, unchanged.
 * Drawing is a pure function of the recording, so the same run always gives the same bytes.
 */

import type { TransitionEvent } from '../../workers/protocol.js';

/** One rank's state change, as the group emits it (`group.on('transition', ...)`): defined with the worker protocol. */
export type { TransitionEvent };

/** The error a group reports with `group.on('failed', ...)`; only these fields are relied on. */
export interface RankFailureError {
    code: string;
    message: string;
    rank?: number;
    state?: string;
    phase?: string;
}

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

/**
 * What the recorder needs of a group: `actors/group.ts#Group` satisfies it, and so does a bare
 * EventEmitter with a `size` and a `snapshot()`, which is what the tests use.
 */
export interface ObservableGroup {
    readonly size: number;
    readonly backend?: string;
    snapshot(): Array<{ rank: number; state: string; seq?: number }>;
    on(event: 'transition', listener: (transition: TransitionEvent) => void): unknown;
    on(event: 'failed', listener: (failure: { rank: number; error: RankFailureError }) => void): unknown;
    off(event: 'transition', listener: (transition: TransitionEvent) => void): unknown;
    off(event: 'failed', listener: (failure: { rank: number; error: RankFailureError }) => void): unknown;
}

/** Anything that watches a group: the recorder and the inspector server both are one. */
export interface GroupObserver {
    /**
     * Starts watching `group`; returns the function that stops. Call it before the ranks start
     * (createGroup does), or the first transitions are missed.
     */
    attach(group: ObservableGroup): () => void;
}

/** Epoch milliseconds with sub-millisecond precision, the clock transitions are stamped with. */
export function epochNow(): number {
    return performance.timeOrigin + performance.now();
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
        };
        this.detach = detach;
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

// ---------------------------------------------------------------------------------------------
// Layout: the recording as lanes, bars, guides and marks in milliseconds. No pixels yet, so the
// structure can be checked on its own and drawn by more than one renderer.

/** A span of time one rank spent in one state. */
export interface TimelineBar {
    rank: number;
    state: string;
    /** Milliseconds since the timeline's origin. */
    start: number;
    end: number;
    /** False for the state a rank is still in when the timeline ends. */
    closed: boolean;
}

/** The same collective on every rank that took part: where each rank entered it. */
export interface TimelineCollective {
    op: string;
    seq: number;
    entries: Array<{ rank: number; at: number }>;
}

/** A failure or timeout, with the rank and the phase it happened in. */
export interface TimelineFailure {
    rank: number;
    at: number;
    code: string;
    phase: string;
    message: string;
    timeout: boolean;
}

export interface TimelineLayout {
    size: number;
    /** Epoch ms that the timeline's 0 stands for. */
    origin: number;
    /** Length of the axis, ms. */
    duration: number;
    lanes: Array<{ rank: number; bars: TimelineBar[] }>;
    collectives: TimelineCollective[];
    failures: TimelineFailure[];
}

/**
 * Turns a recording into lanes of bars. A rank's bar for a state runs from the transition into
 * it to the next transition out of it; the state a rank is still in runs to `end` (default: when
 * recording ended, or the last thing recorded).
 */
export function layoutTimeline(recording: TimelineRecording, end?: number): TimelineLayout {
    // Loops rather than Math.min(...spread): a long run has more entries than a call has arguments.
    let first = recording.startedAt > 0 ? recording.startedAt : Infinity;
    let last = end ?? recording.endedAt ?? -Infinity;
    let rankCount = recording.size;
    for (const { at, rank } of [...recording.transitions, ...recording.failures]) {
        if (at < first) first = at;
        if (at > last) last = at;
        if (rank + 1 > rankCount) rankCount = rank + 1;
    }
    const origin = Number.isFinite(first) ? first : 0;
    const finish = Number.isFinite(last) && last > origin ? last : origin;

    // One pass to bucket by rank; sorting per lane is stable, so transitions stamped with the
    // same time keep the order the rank made them in.
    const byRank = Array.from({ length: rankCount }, () => [] as TransitionEvent[]);
    for (const transition of recording.transitions) byRank[transition.rank]!.push(transition);

    const lanes: TimelineLayout['lanes'] = [];
    for (let rank = 0; rank < rankCount; rank++) {
        const own = byRank[rank]!.sort((a, b) => a.at - b.at);

        const bars: TimelineBar[] = [];
        const initialState = recording.initial.find((entry) => entry.rank === rank)?.state ?? own[0]?.from;
        let state = initialState;
        let since = origin;
        for (const transition of own) {
            if (state !== undefined) {
                bars.push({ rank, state, start: since - origin, end: transition.at - origin, closed: true });
            }
            state = transition.to;
            since = transition.at;
        }
        if (state !== undefined) {
            bars.push({ rank, state, start: since - origin, end: finish - origin, closed: false });
        }
        lanes.push({ rank, bars });
    }

    return {
        size: rankCount,
        origin,
        duration: finish - origin,
        lanes,
        collectives: collectCollectives(recording.transitions, origin),
        failures: collectFailures(recording, origin)
    };
}

/**
 * Groups transitions that carry the same `op` and `seq` into one collective, keeping the first
 * transition each rank made in it (its way in), ordered by first entry across ranks.
 */
function collectCollectives(transitions: readonly TransitionEvent[], origin: number): TimelineCollective[] {
    const byKey = new Map<string, TimelineCollective>();
    for (const transition of transitions) {
        if (transition.op === undefined || transition.seq === undefined) continue;
        const key = `${transition.op}#${transition.seq}`;
        let collective = byKey.get(key);
        if (!collective) {
            collective = { op: transition.op, seq: transition.seq, entries: [] };
            byKey.set(key, collective);
        }
        const at = transition.at - origin;
        const existing = collective.entries.find((entry) => entry.rank === transition.rank);
        if (!existing) collective.entries.push({ rank: transition.rank, at });
        else if (at < existing.at) existing.at = at;
    }
    const collectives = [...byKey.values()];
    for (const collective of collectives) collective.entries.sort((a, b) => a.rank - b.rank);
    const firstEntry = (c: TimelineCollective) => Math.min(...c.entries.map((e) => e.at));
    return collectives.sort((a, b) => firstEntry(a) - firstEntry(b) || a.seq - b.seq);
}

/**
 * One mark per failed rank event. The group's `failed` event and the rank's transition into
 * `failed` describe the same failure, so they are merged: the event gives the code and message,
 * the transition the phase and the exact time. A transition into `failed` with no event still
 * gets a mark, since a rank that died may not have reported.
 */
function collectFailures(recording: TimelineRecording, origin: number): TimelineFailure[] {
    const intoFailed = recording.transitions.filter((t) => t.to === 'failed' || t.to.startsWith('failed.'));
    const used = new Set<TransitionEvent>();
    const failures: TimelineFailure[] = [];

    for (const failure of recording.failures) {
        const transition = intoFailed.find((t) => t.rank === failure.rank && !used.has(t));
        if (transition) used.add(transition);
        failures.push({
            rank: failure.rank,
            at: (transition?.at ?? failure.at) - origin,
            code: failure.code,
            phase: failure.phase ?? transition?.phase ?? failure.state ?? transition?.from ?? 'unknown',
            message: failure.message,
            timeout: isTimeoutCode(failure.code)
        });
    }
    for (const transition of intoFailed) {
        if (used.has(transition)) continue;
        failures.push({
            rank: transition.rank,
            at: transition.at - origin,
            code: transition.event,
            phase: transition.phase ?? transition.from,
            message: `rank ${transition.rank} failed in ${transition.phase ?? transition.from}`,
            timeout: isTimeoutCode(transition.event)
        });
    }
    return failures.sort((a, b) => a.at - b.at || a.rank - b.rank);
}

function isTimeoutCode(code: string): boolean {
    return /TIMEOUT/i.test(code);
}

// ---------------------------------------------------------------------------------------------
// Drawing.

export interface TimelineSvgOptions {
    /** Total width in px; default 960. */
    width?: number;
    /** Height of one rank's lane in px; default 26. */
    laneHeight?: number;
    /** Heading drawn above the lanes; default 'rankflow timeline'. */
    title?: string;
    /** Where open bars (a rank's current state) end, epoch ms; default: when recording ended. */
    end?: number;
}

/**
 * Colours of the rank machine's top-level states (machines/rank.ts), in its lifecycle order,
 * which is also the legend's order. Children share their parent's colour ('session.open' is a
 * session). A state not listed gets a colour from its name, so it is stable across runs.
 */
export const STATE_COLORS: Readonly<Record<string, string>> = {
    init: '#9ca3af',
    registerWindow: '#a78bfa',
    ready: '#4ade80',
    barrier: '#facc15',
    allGathering: '#60a5fa',
    dispatching: '#fb923c',
    combining: '#2dd4bf',
    session: '#818cf8',
    engram: '#f472b6',
    pipeline: '#22d3ee',
    destroying: '#94a3b8',
    destroyed: '#cbd5e1',
    failed: '#ef4444'
};

const EXTRA_COLORS = ['#fca5a5', '#fdba74', '#bef264', '#86efac', '#67e8f9', '#93c5fd', '#c4b5fd', '#f9a8d4'];

export function stateColor(state: string): string {
    const top = state.split('.')[0]!;
    const known = STATE_COLORS[top];
    if (known) return known;
    let hash = 0;
    for (const char of top) hash = (hash * 31 + char.charCodeAt(0)) >>> 0;
    return EXTRA_COLORS[hash % EXTRA_COLORS.length]!;
}

const FONT = 'ui-sans-serif, system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif';
const FAILURE_COLOR = '#b91c1c';
const TIMEOUT_COLOR = '#b45309';
const GUIDE_COLOR = '#475569';
/** Rough advance of one character at 11px in the fonts above; used only to decide what fits. */
const CHAR_WIDTH = 6.2;
const BOLD_CHAR_WIDTH = 6.8;

/**
 * Draws a recording as a standalone SVG document: one lane per rank, a bar per state with its
 * duration (hover shows it too), dashed guides joining where each rank entered the same
 * collective, a mark for each failure or timeout labelled with rank and phase, a time axis in ms
 * and a legend. It references nothing outside itself, and the same input gives the same output.
 *
 * Elements carry `data-*` attributes (`data-lane`, `data-state`, `data-collective`,
 * `data-failure`) so the structure can be checked without looking at pixels.
 */
export function renderTimelineSvg(recording: TimelineRecording, options: TimelineSvgOptions = {}): string {
    const layout = layoutTimeline(recording, options.end);
    const width = options.width ?? 960;
    const laneHeight = options.laneHeight ?? 26;
    const laneGap = 8;
    const title = options.title ?? 'rankflow timeline';

    const left = 64;
    const right = 24;
    const plotWidth = Math.max(width - left - right, 100);
    const titleHeight = 30;
    const labelRows = 3;
    const labelRowHeight = 13;
    const lanesTop = titleHeight + labelRows * labelRowHeight + 6;
    const lanesHeight = layout.size * (laneHeight + laneGap) - laneGap;
    const axisTop = lanesTop + lanesHeight + 8;
    const legendTop = axisTop + 30;

    const span = layout.duration > 0 ? layout.duration : 1;
    const x = (ms: number) => left + (ms / span) * plotWidth;
    const laneY = (rank: number) => lanesTop + rank * (laneHeight + laneGap);

    const legendItems = legendStates(layout);
    const legend = layoutLegend(legendItems, left, legendTop, width - right);
    const height = legend.bottom + 14;

    const out: string[] = [];
    out.push(
        `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${num(height)}" ` +
            `viewBox="0 0 ${width} ${num(height)}" font-family="${FONT}" font-size="11" data-timeline="">`
    );
    out.push(`<rect x="0" y="0" width="${width}" height="${num(height)}" fill="#ffffff"/>`);
    out.push(
        `<text x="${left}" y="20" font-size="14" font-weight="600" fill="#0f172a">${escapeXml(title)}</text>`,
        `<text x="${width - right}" y="20" text-anchor="end" fill="#475569">` +
            `${layout.size} rank${layout.size === 1 ? '' : 's'} · ${escapeXml(formatMs(layout.duration))}</text>`
    );

    // Axis grid first, so everything else draws over it.
    const ticks = axisTicks(layout.duration);
    out.push('<g data-axis="">');
    for (const tick of ticks) {
        const tx = num(x(tick));
        out.push(
            `<line x1="${tx}" y1="${lanesTop - 4}" x2="${tx}" y2="${axisTop}" stroke="#e2e8f0" stroke-width="1"/>`,
            `<text x="${tx}" y="${axisTop + 14}" text-anchor="middle" fill="#475569" data-tick="${num(tick)}">` +
                `${escapeXml(formatMs(tick))}</text>`
        );
    }
    out.push(
        `<line x1="${left}" y1="${axisTop}" x2="${num(left + plotWidth)}" y2="${axisTop}" stroke="#64748b" stroke-width="1"/>`,
        '</g>'
    );

    for (const lane of layout.lanes) {
        const y = laneY(lane.rank);
        out.push(`<g data-lane="${lane.rank}">`);
        out.push(
            `<text x="${left - 8}" y="${num(y + laneHeight / 2 + 4)}" text-anchor="end" fill="#0f172a">rank ${lane.rank}</text>`,
            `<rect x="${left}" y="${y}" width="${num(plotWidth)}" height="${laneHeight}" fill="#f8fafc"/>`
        );
        for (const bar of lane.bars) {
            const bx = x(bar.start);
            const bw = Math.max(x(bar.end) - bx, 1);
            const duration = bar.end - bar.start;
            out.push(
                `<g data-state="${escapeXml(bar.state)}" data-start="${num(bar.start)}" data-duration="${num(duration)}"` +
                    `${bar.closed ? '' : ' data-open=""'}>`,
                `<title>rank ${lane.rank} · ${escapeXml(bar.state)} · ${escapeXml(formatMs(duration))}` +
                    `${bar.closed ? '' : ' (still in it)'}</title>`,
                `<rect x="${num(bx)}" y="${y + 2}" width="${num(bw)}" height="${laneHeight - 4}" rx="2" ` +
                    `fill="${stateColor(bar.state)}" stroke="#ffffff" stroke-width="0.5"/>`
            );
            const label = fitLabel([`${bar.state} ${formatMs(duration)}`, bar.state], bw - 6);
            if (label) {
                out.push(
                    `<text x="${num(bx + 3)}" y="${num(y + laneHeight / 2 + 4)}" fill="#0f172a">${escapeXml(label)}</text>`
                );
            }
            out.push('</g>');
        }
        out.push('</g>');
    }

    // Collective guides: a dashed line through each rank's way into the collective. When the
    // ranks entered together it is vertical; a slanted guide shows who arrived late.
    const labelRowEnds = new Array<number>(labelRows).fill(-Infinity);
    for (const collective of layout.collectives) {
        const name = `${collective.op} #${collective.seq}`;
        const points = collective.entries.map(({ rank, at }) => ({ px: x(at), top: laneY(rank), bottom: laneY(rank) + laneHeight }));
        const path = points
            .map((p, i) => `${i === 0 ? 'M' : 'L'}${num(p.px)} ${num(p.top)} L${num(p.px)} ${num(p.bottom)}`)
            .join(' ');
        const first = points[0]!;
        const spread = Math.max(...collective.entries.map((e) => e.at)) - Math.min(...collective.entries.map((e) => e.at));
        out.push(
            `<g data-collective="${escapeXml(`${collective.op}#${collective.seq}`)}" data-ranks="${collective.entries.length}">`,
            `<title>${escapeXml(name)} · ${collective.entries.length} rank${collective.entries.length === 1 ? '' : 's'}` +
                ` · entry spread ${escapeXml(formatMs(spread))}</title>`,
            `<path d="M${num(first.px)} ${num(lanesTop - 4)} L${num(first.px)} ${num(first.top)} ${path}" fill="none" ` +
                `stroke="${GUIDE_COLOR}" stroke-width="1" stroke-dasharray="3 2"/>`
        );
        const labelWidth = name.length * CHAR_WIDTH * 0.9;
        const row = labelRowEnds.findIndex((end) => end + 4 < first.px);
        if (row >= 0) {
            labelRowEnds[row] = first.px + labelWidth;
            out.push(
                `<text x="${num(first.px + 2)}" y="${titleHeight + (row + 1) * labelRowHeight - 2}" font-size="10" ` +
                    `fill="${GUIDE_COLOR}">${escapeXml(name)}</text>`
            );
        }
        out.push('</g>');
    }

    for (const failure of layout.failures) {
        const fx = x(failure.at);
        const cy = laneY(failure.rank) + laneHeight / 2;
        const color = failure.timeout ? TIMEOUT_COLOR : FAILURE_COLOR;
        const text = `rank ${failure.rank} · ${failure.code} in ${failure.phase}`;
        // The label sits on a white pill so it stays legible over the bars; near the right edge
        // it goes to the mark's left rather than off the page.
        const pillWidth = text.length * BOLD_CHAR_WIDTH + 10;
        const toLeft = fx + 10 + pillWidth > width - 4;
        const pillX = toLeft ? fx - 9 - pillWidth : fx + 9;
        out.push(
            `<g data-failure="${failure.timeout ? 'timeout' : 'error'}" data-failed-rank="${failure.rank}" ` +
                `data-phase="${escapeXml(failure.phase)}" data-code="${escapeXml(failure.code)}">`,
            `<title>${escapeXml(`${text} at ${formatMs(failure.at)}: ${failure.message}`)}</title>`,
            `<rect x="${num(pillX)}" y="${num(cy - 8)}" width="${num(pillWidth)}" height="16" rx="3" fill="#ffffff" ` +
                `fill-opacity="0.94" stroke="${color}" stroke-width="1"/>`,
            `<text x="${num(pillX + 5)}" y="${num(cy + 4)}" font-weight="600" fill="${color}">${escapeXml(text)}</text>`,
            failureMark(fx, cy, 6, failure.timeout),
            '</g>'
        );
    }

    out.push('<g data-legend="">');
    for (const item of legend.items) {
        out.push(`<g data-legend-item="${escapeXml(item.key)}">`);
        if (item.kind === 'state') {
            out.push(`<rect x="${num(item.x)}" y="${num(item.y)}" width="12" height="10" rx="2" fill="${stateColor(item.key)}"/>`);
        } else if (item.kind === 'collective') {
            out.push(
                `<path d="M${num(item.x + 6)} ${num(item.y - 1)} L${num(item.x + 6)} ${num(item.y + 11)}" ` +
                    `stroke="${GUIDE_COLOR}" stroke-width="1" stroke-dasharray="3 2"/>`
            );
        } else {
            out.push(failureMark(item.x + 6, item.y + 5, 5.5, item.key === 'timeout'));
        }
        out.push(`<text x="${num(item.x + 16)}" y="${num(item.y + 9)}" fill="#334155">${escapeXml(item.label)}</text>`, '</g>');
    }
    out.push('</g>', '</svg>');
    return out.join('\n') + '\n';
}

/**
 * A failure is a cross in a disc; a timeout a clock face, so the two read apart without colour.
 */
function failureMark(cx: number, cy: number, r: number, timeout: boolean): string {
    const color = timeout ? TIMEOUT_COLOR : FAILURE_COLOR;
    const k = r / 2;
    const glyph = timeout
        ? `M${num(cx)} ${num(cy)} L${num(cx)} ${num(cy - r * 0.65)} M${num(cx)} ${num(cy)} L${num(cx + r * 0.5)} ${num(cy)}`
        : `M${num(cx - k)} ${num(cy - k)} L${num(cx + k)} ${num(cy + k)} M${num(cx + k)} ${num(cy - k)} L${num(cx - k)} ${num(cy + k)}`;
    return (
        `<circle cx="${num(cx)}" cy="${num(cy)}" r="${num(r)}" fill="${color}" stroke="#ffffff" stroke-width="1.5"/>` +
        `<path d="${glyph}" stroke="#ffffff" stroke-width="1.5" stroke-linecap="round" fill="none"/>`
    );
}

type LegendItem = { kind: 'state' | 'collective' | 'failure'; key: string; label: string };

/** The legend lists what the drawing uses: its states in lifecycle order, then the marks. */
function legendStates(layout: TimelineLayout): LegendItem[] {
    const used = new Set(layout.lanes.flatMap((lane) => lane.bars.map((bar) => bar.state.split('.')[0]!)));
    const known = Object.keys(STATE_COLORS).filter((state) => used.has(state));
    const others = [...used].filter((state) => !(state in STATE_COLORS)).sort();
    const items: LegendItem[] = [...known, ...others].map((state) => ({ kind: 'state', key: state, label: state }));
    if (layout.collectives.length > 0) items.push({ kind: 'collective', key: 'collective', label: 'collective (op #seq)' });
    if (layout.failures.some((f) => !f.timeout)) items.push({ kind: 'failure', key: 'failure', label: 'failure' });
    if (layout.failures.some((f) => f.timeout)) items.push({ kind: 'failure', key: 'timeout', label: 'timeout' });
    return items;
}

function layoutLegend(items: LegendItem[], left: number, top: number, right: number) {
    const placed: Array<LegendItem & { x: number; y: number }> = [];
    let cx = left;
    let cy = top;
    for (const item of items) {
        const itemWidth = 16 + item.label.length * CHAR_WIDTH + 14;
        if (cx + itemWidth > right && cx > left) {
            cx = left;
            cy += 18;
        }
        placed.push({ ...item, x: cx, y: cy });
        cx += itemWidth;
    }
    return { items: placed, bottom: cy + 12 };
}

/** Tick positions in ms: a 1, 2 or 5 step that gives five to ten ticks over the duration. */
export function axisTicks(duration: number): number[] {
    if (!(duration > 0)) return [0];
    const rough = duration / 8;
    const magnitude = 10 ** Math.floor(Math.log10(rough));
    const step = [1, 2, 5, 10].map((m) => m * magnitude).find((s) => s >= rough)!;
    const ticks: number[] = [];
    // Counted in integer steps so float error never adds or drops a tick.
    for (let i = 0; i * step <= duration + step * 1e-9; i++) ticks.push(Number((i * step).toPrecision(12)));
    return ticks;
}

/** Milliseconds as people read them on an axis: '0 ms', '2.5 ms', '1200 ms'. */
export function formatMs(ms: number): string {
    const rounded = ms >= 100 ? Math.round(ms) : ms >= 10 ? Math.round(ms * 10) / 10 : Math.round(ms * 100) / 100;
    return `${rounded} ms`;
}

function fitLabel(candidates: string[], room: number): string | undefined {
    return candidates.find((label) => label.length * CHAR_WIDTH <= room);
}

/** Coordinates to two decimals, without trailing zeros, so output is stable and small. */
function num(value: number): string {
    return String(Math.round(value * 100) / 100);
}

export function escapeXml(text: string): string {
    return text.replace(/[&<>"']/g, (char) => `&#${char.charCodeAt(0)};`);
}
