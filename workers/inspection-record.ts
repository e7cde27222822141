// An xstate inspection event as plain data that crosses to the main thread (createGroup's `inspect`):
// its type, the actor, the event's scalar fields, a snapshot's value and status, an action's type.
import type { InspectionEvent } from 'xstate';

export function plainInspection(rec: InspectionEvent, rank: number, at: number): Record<string, unknown> {
  const out: Record<string, unknown> = { type: rec.type, rank, actorId: (rec.actorRef as { id?: string }).id, sessionId: rec.actorRef.sessionId, at };
  if ('event' in rec && rec.event) {
    const o: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(rec.event as { type: string })) if (v === null || ['string', 'number', 'boolean'].includes(typeof v)) o[k] = v;
    out.event = o;
  }
  if (rec.type === '@xstate.snapshot') {
    const s = rec.snapshot as { value?: unknown; status?: string };
    out.value = s.value;
    out.status = s.status;
  }
  if (rec.type === '@xstate.action') out.action = { type: rec.action.type };
  return out;
}
