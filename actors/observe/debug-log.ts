/**
 * The library's own life in the debug log (DEBUG=rankflow, NODE_DEBUG=rankflow; the switch is
 * debug.ts): an observer of a group's events, attached once in Group.create, so that nothing in the
 * group or its ranks calls the log. It writes
 *   - the group's creation: its ranks, backend and buffer, the addon build in use; once every rank is
 *     ready, the memory kind and sizes rank 0 reports, and how long it took;
 *   - each rank's transitions, at debug level (namespace rankflow:transitions: DEBUG=rankflow,-rankflow:transitions
 *     leaves them out): from, to, the event, the collective's number and phases;
 *   - waits that take long: a rank that stays in a state other than ready, session.open, destroyed or
 *     failed is reported after 1 s, then each time the wait has doubled, and when it leaves;
 *   - failures, with their code, phase, state and cause;
 *   - the destroy, and how long the group lived.
 * Attaching costs nothing when the log is off: no listener, no timer.
 */
import { loadedAddon } from '../core/addon.js';
import { config } from '../core/config.js';
import { debug, debugEnabled, debugEnabledBy } from './debug.js';
import { epochNow, type ObservableGroup, type RankFailureError, type TransitionEvent } from './observer.js';

/** What the log reads of a group: its events (ObservableGroup) and what it was made of. */
export interface DebugLoggedGroup extends ObservableGroup {
  readonly id: string;
  readonly backend: string;
  readonly worldSize: number;
  readonly rankOffset: number;
  readonly buffer: object;
  /** rank 0's own account (memory kind, sizes); asked once the group is ready */
  info(rank: number): Promise<{ memoryKind: string; symmetricBytes: number; bufferBytes: number; cpuBytes: number; device?: { name: string } }>;
}

/** A wait this long is reported (then at every doubling). */
export const SLOW_WAIT_MS = 1000;
/** How often the ranks' current states are looked at for slow waits. */
const CHECK_MS = 250;
/** States in which a rank is not waiting for anything. */
const RESTING: ReadonlySet<string> = new Set(['ready', 'session.open', 'destroyed', 'failed']);

/** Whether transition lines are written: with the log, unless DEBUG excludes them (`-rankflow:transitions`, as the debug package excludes). */
const transitionsOn = (): boolean => debugEnabled && !(config.debug ?? '').split(/[\s,]+/).some((item) => item.startsWith('-') && debugEnabledBy(item.slice(1), 'rankflow:transitions'));

const seconds = (ms: number): string => `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;

/** Attaches the log to `group` (before its ranks start); returns the function that detaches it. */
export function attachDebugLog(group: DebugLoggedGroup): () => void {
  if (!debugEnabled) return () => {};
  const name = `group ${group.id.slice(0, 8)}`;
  const created = epochNow();
  const transitions = transitionsOn();
  const addon = loadedAddon();
  debug('%s: creating %d rank(s)%s on backend %s; buffer %j; addon: %s', name, group.size,
    group.worldSize !== group.size ? ` (ranks ${group.rankOffset}..${group.rankOffset + group.size - 1} of a world of ${group.worldSize})` : '',
    group.backend, group.buffer, addon ? `${addon.description} ${addon.path}` : 'not loaded');

  // Each local rank's state and since when (epoch ms), and the wait already reported (ms).
  const ranks = group.snapshot().map((s) => ({ rank: s.rank, state: s.state, since: created, reported: 0 }));
  const byRank = new Map(ranks.map((r) => [r.rank, r]));
  let ready = false;

  const onTransition = (t: TransitionEvent): void => {
    const r = byRank.get(t.rank);
    if (r) {
      const waited = t.at - r.since;
      if (r.reported > 0) debug('%s: rank %d left %s after %s (%s -> %s)', name, t.rank, r.state, seconds(waited), t.event, t.to);
      r.state = t.to;
      r.since = t.at;
      r.reported = 0;
    }
    if (transitions) {
      debug('%s: rank %d: %s -> %s (%s)%s%s', name, t.rank, t.from, t.to, t.event, t.seq !== undefined ? ` seq ${t.seq}` : '',
        t.phases?.length ? ` phases ${t.phases.join(',')}` : '');
    }
    if (!ready && ranks.every((x) => x.state === 'ready')) {
      ready = true;
      const took = t.at - created;
      group.info(0).then(
        (i) => debug('%s: ready in %s: memory %s, %d symmetric bytes per rank (buffer %d, host segment %d)%s', name, seconds(took), i.memoryKind,
          i.symmetricBytes, i.bufferBytes, i.cpuBytes, i.device ? `, rank 0 on ${i.device.name}` : ''),
        () => debug('%s: ready in %s', name, seconds(took)),
      );
    }
  };

  const onFailed = ({ rank, error }: { rank: number; error: RankFailureError & { cause?: unknown } }): void => {
    const cause = error.cause instanceof Error ? `; cause: ${error.cause.name}: ${error.cause.message}` : error.cause !== undefined ? `; cause: ${String(error.cause)}` : '';
    debug('%s: rank %d failed: %s %s%s%s%s', name, rank, error.code, error.message, error.phase ? ` (phase ${error.phase})` : '',
      error.state ? ` in state ${error.state}` : '', cause);
  };

  const timer = setInterval(() => {
    const now = epochNow();
    for (const r of ranks) {
      if (RESTING.has(r.state)) continue;
      const waited = now - r.since;
      if (waited >= Math.max(SLOW_WAIT_MS, 2 * r.reported)) {
        r.reported = waited;
        debug('%s: rank %d has been in %s for %s', name, r.rank, r.state, seconds(waited));
      }
    }
  }, CHECK_MS);
  timer.unref();

  group.on('transition', onTransition);
  group.on('failed', onFailed);
  return () => {
    clearInterval(timer);
    group.off('transition', onTransition);
    group.off('failed', onFailed);
    debug('%s: destroyed%s, %s after creation; states: %s', name, ready ? '' : ' before it was ready', seconds(epochNow() - created),
      group.snapshot().map((s) => s.state).join(', '));
  };
}
