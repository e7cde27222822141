/**
 * Group helpers for the host-backend tests: a group that is always destroyed, a transition recorder,
 * and the URL of a rank-program fixture.
 */
import { createGroup, type Group, type GroupOptions, type TransitionEvent } from '../../actors/index.js';

/** Runs `fn` with a fresh host group and destroys the group afterwards, whatever happened. */
export async function withGroup<T>(opts: Omit<GroupOptions, 'backend'>, fn: (g: Group) => Promise<T>): Promise<T> {
    const g = await createGroup({ backend: 'host', ...opts });
    try {
        return await fn(g);
    } finally {
        await g.destroy();
    }
}

/** Records every transition of `g` from now on; `paths(r)` lists rank r's states in order. */
export function recordTransitions(g: Group): {
    events: TransitionEvent[]; paths: (rank: number) => string[]; records: (rank: number) => TransitionEvent[]; clear: () => void;
} {
    const events: TransitionEvent[] = [];
    g.on('transition', (t) => events.push(t));
    return {
        events,
        paths: (rank) => events.filter((t) => t.rank === rank).map((t) => t.to),
        records: (rank) => events.filter((t) => t.rank === rank),
        clear: () => void events.splice(0),
    };
}

/** A rank program under test/fixtures/programs (plain .mjs: the workers import it as it is). */
export const program = (name: string): URL => new URL(`../fixtures/programs/${name}`, import.meta.url);
