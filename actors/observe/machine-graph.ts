/**
 * A state machine as plain data, for drawing: its states as dotted paths and its transitions as
 * (from, event, to) triples. The inspector page draws each rank's machine from this, and
 * `describeMachine` derives it from an xstate v5 machine (machines/rank.ts's `rankMachine`) so
 * the drawing never drifts from the machine that runs.
 */
import type { AnyStateMachine, AnyStateNode } from 'xstate';

export interface MachineDescription {
    /** Every state as a dotted path, parents before their children, in document order. */
    states: string[];
    transitions: Array<{ from: string; to: string; event: string }>;
}

/**
 * Walks an xstate v5 machine's state nodes. Events keep the machine's names (`PHASE_DONE` /
 * `PHASE_FAILED` for the rank machine's phases, `xstate.done.actor.x` for an invoked actor finishing,
 * `xstate.after.DELAY...` for a delay, '' for `always`), so they match the `event` field of the
 * group's transitions. Targetless transitions (self-handling events) are left out: they do not move
 * the rank.
 */
export function describeMachine(machine: AnyStateMachine): MachineDescription {
    const states: string[] = [];
    const transitions: MachineDescription['transitions'] = [];

    const visit = (node: AnyStateNode) => {
        const path = node.path.join('.');
        if (path !== '') states.push(path);
        const outgoing = [...node.transitions.values()].flat();
        for (const definition of [...outgoing, ...(node.always ?? [])]) {
            for (const target of definition.target ?? []) {
                transitions.push({ from: path, to: target.path.join('.'), event: definition.eventType });
            }
        }
        const children = Object.values(node.states) as AnyStateNode[];
        for (const child of children.sort((a, b) => a.order - b.order)) visit(child);
    };
    visit(machine.root);

    return { states, transitions };
}

/** Asserts that `value` looks like a {@link MachineDescription}; says what is wrong if not. */
export function assertMachineDescription(value: unknown): asserts value is MachineDescription {
    const candidate = value as Partial<MachineDescription> | null;
    if (!candidate || !Array.isArray(candidate.states) || !candidate.states.every((s) => typeof s === 'string')) {
        throw new TypeError('machine description: `states` must be an array of dotted state paths (strings)');
    }
    if (
        !Array.isArray(candidate.transitions) ||
        !candidate.transitions.every(
            (t) => t && typeof t.from === 'string' && typeof t.to === 'string' && typeof t.event === 'string'
        )
    ) {
        throw new TypeError('machine description: `transitions` must be an array of { from, to, event } strings');
    }
}
