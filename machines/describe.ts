// A plain description of a machine's graph (state paths and transitions), for pictures and tests.
import type { AnyStateMachine, AnyStateNode } from 'xstate';

export interface MachineDescription {
  states: string[];
  transitions: Array<{ from: string; to: string; event: string }>;
}

const pathOf = (node: AnyStateNode): string => node.path.join('.');

/** Walks every state node; transitions keep their event type (after-timers as `after:<delay>`). */
export function describeMachine(machine: AnyStateMachine): MachineDescription {
  const states: string[] = [];
  const transitions: MachineDescription['transitions'] = [];
  const visit = (node: AnyStateNode): void => {
    if (node.path.length > 0) states.push(pathOf(node));
    for (const [event, defs] of node.transitions) {
      for (const def of defs) {
        for (const target of def.target ?? []) {
          const label = event.startsWith('xstate.after.') ? `after:${event.split('.')[2]}` : event;
          transitions.push({ from: pathOf(node) || '(root)', to: pathOf(target), event: label });
        }
      }
    }
    for (const child of Object.values(node.states) as AnyStateNode[]) visit(child);
  };
  visit(machine.root);
  return { states, transitions };
}

/** The dotted path of a snapshot value: 'ready', 'dispatching.cpuSync', 'session.open'. */
export function statePath(value: unknown): string {
  if (typeof value === 'string') return value;
  if (value && typeof value === 'object') {
    const [key, inner] = Object.entries(value as Record<string, unknown>)[0] ?? [];
    if (key === undefined) return '';
    const rest = statePath(inner);
    return rest ? `${key}.${rest}` : key;
  }
  return '';
}
