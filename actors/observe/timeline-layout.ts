/**
 * The timeline's layout: a recording as lanes, bars, collective guides, failure marks and idle
 * breaks, in milliseconds. No pixels yet, so the structure can be checked on its own and drawn by
 * more than one renderer (timeline-svg.ts draws it; chrome-trace.ts exports the same bars).
 */
import type { TimelineRecording } from './timeline-recorder.js';
import type { TransitionEvent } from './observer.js';

/** A span of time one rank spent in one state. */
export interface TimelineBar {
    rank: number;
    state: string;
    /** Milliseconds since the timeline's origin. */
    start: number;
    end: number;
    /** False for the state a rank is still in when the timeline ends. */
    closed: boolean;
    /** The transition into this state: its event, and the collective it was part of. */
    event?: string;
    op?: string;
    seq?: number;
}

/** The same collective on every rank that took part: where each rank entered it. */
export interface TimelineCollective {
    op: string;
    seq: number;
    entries: Array<{ rank: number; at: number }>;
}

/** A failure or timeout, or a run's release of a rank (a program's error: the rank lives on), with the rank and the phase it happened in. */
export interface TimelineFailure {
    rank: number;
    at: number;
    code: string;
    phase: string;
    message: string;
    timeout: boolean;
    /** a release (the rank went to `released`, then back to ready), not a failure */
    release?: true;
}

/**
 * A stretch of time in which every rank sat in an idle state (waiting for the program, not in
 * an operation): worker start-up in `init`, `ready` between calls, `destroyed` at the end. The
 * drawing shrinks it to a fixed width, so the operations get the room.
 */
export interface TimelineBreak {
    /** Milliseconds since the timeline's origin. */
    start: number;
    end: number;
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
    /** Idle stretches worth shrinking, in time order; empty when `compressIdle` is false. */
    breaks: TimelineBreak[];
}

export interface TimelineLayoutOptions {
    /** Where open bars (a rank's current state) end, epoch ms; default: when recording ended. */
    end?: number;
    /** Find idle stretches to shrink; default true. */
    compressIdle?: boolean;
    /** States in which a rank waits rather than works; default {@link IDLE_STATES}. */
    idleStates?: readonly string[];
    /**
     * The shortest idle stretch worth a break, as a fraction of the whole run; default 0.05.
     * Shorter pauses between calls stay to scale: breaking them would only add clutter.
     */
    minIdleFraction?: number;
}

/**
 * The rank machine's waiting states (machines/rank.ts): start-up until the worker reports, idle
 * between collectives (also inside a session), and the two ends.
 */
export const IDLE_STATES: readonly string[] = ['init', 'ready', 'session.open', 'destroyed', 'failed'];

/**
 * Turns a recording into lanes of bars. A rank's bar for a state runs from the transition into
 * it to the next transition out of it; the state a rank is still in runs to `options.end`
 * (default: when recording ended, or the last thing recorded).
 */
export function layoutTimeline(recording: TimelineRecording, options: TimelineLayoutOptions = {}): TimelineLayout {
    const end = options.end;
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
        let via: TransitionEvent | undefined;
        const close = (until: number, closed: boolean) => {
            if (state === undefined) return;
            const bar: TimelineBar = { rank, state, start: since - origin, end: until - origin, closed };
            if (via) {
                bar.event = via.event;
                if (via.op !== undefined) bar.op = via.op;
                if (via.seq !== undefined) bar.seq = via.seq;
            }
            bars.push(bar);
        };
        for (const transition of own) {
            close(transition.at, true);
            state = transition.to;
            since = transition.at;
            via = transition;
        }
        close(finish, false);
        lanes.push({ rank, bars });
    }

    const failures = collectFailures(recording, origin);
    const duration = finish - origin;
    const breaks =
        options.compressIdle === false
            ? []
            : idleBreaks(lanes, failures, duration, new Set(options.idleStates ?? IDLE_STATES), options.minIdleFraction ?? 0.05);
    return {
        size: rankCount,
        origin,
        duration,
        lanes,
        collectives: collectCollectives(recording.transitions, origin),
        failures,
        breaks
    };
}

/**
 * The stretches in which no rank is in a working state, found by one sweep over the bars'
 * edges: a counter of working bars open at each instant, idle where it is zero. Failure marks
 * end a stretch too, so a break never hides one.
 */
function idleBreaks(
    lanes: TimelineLayout['lanes'],
    failures: readonly TimelineFailure[],
    duration: number,
    idle: ReadonlySet<string>,
    minFraction: number
): TimelineBreak[] {
    if (!(duration > 0)) return [];
    const edges: Array<{ at: number; delta: number }> = [];
    for (const lane of lanes) {
        for (const bar of lane.bars) {
            if (idle.has(bar.state) || bar.end <= bar.start) continue;
            edges.push({ at: bar.start, delta: 1 }, { at: bar.end, delta: -1 });
        }
    }
    for (const failure of failures) edges.push({ at: failure.at, delta: 1 }, { at: failure.at, delta: -1 });
    // At equal times the opening edges go first, so a bar that starts where another ends never
    // leaves a zero-length idle gap between them.
    edges.sort((a, b) => a.at - b.at || b.delta - a.delta);

    const spans: TimelineBreak[] = [];
    let working = 0;
    let idleSince = 0;
    for (const edge of edges) {
        if (working === 0 && edge.delta > 0 && edge.at > idleSince) spans.push({ start: idleSince, end: edge.at });
        working += edge.delta;
        if (working === 0) idleSince = edge.at;
    }
    if (working === 0 && duration > idleSince) spans.push({ start: idleSince, end: duration });
    const shortest = minFraction * duration;
    return spans.filter((span) => span.end - span.start >= shortest);
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
    // A release is a program's error, not the rank's: its own mark, from the transition that carries it.
    for (const t of recording.transitions) {
        if (t.to !== 'released') continue;
        failures.push({
            rank: t.rank, at: t.at - origin, code: t.error?.code ?? t.event, phase: t.error?.phase ?? t.phase ?? t.from,
            message: t.error?.message ?? `rank ${t.rank} was released in ${t.from}`, timeout: false, release: true,
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
