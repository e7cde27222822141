/**
 * What an observer of a group may rely on, and nothing more: the group's `transition` and `failed`
 * events, its size and snapshot. The timeline recorder and the inspector server are observers;
 * `createGroup({ observers })` attaches any object with an `attach(group)` method before the
 * ranks start, so it sees them from `init`.
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

/**
 * What an observer needs of a group: `actors/group.ts#Group` satisfies it, and so does a bare
 * EventEmitter with a `size` and a `snapshot()`, which is what the tests use.
 */
export interface ObservableGroup {
    readonly size: number;
    readonly backend?: string;
    /** the group's own state and live ranks ('degraded' while ranks of an elastic group are out) */
    readonly state?: string;
    readonly liveRanks?: number[];
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
