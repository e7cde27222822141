// How a run ended in each process of a world, as the processes agree on it (actors/run.ts): every
// process exchanges one RunEnd after its own programs ended, and each takes the merge, so that all
// recover to the same numbers and reject with the same error. Values come over a socket: each is
// checked (sizes bounded) before it counts.
import type { ThrownValue } from '../core/thrown.js';
import { LIMITS, isInt, isObject, isText, quote } from './protocol.js';
import type { RendezvousPeer } from './rendezvous.js';

export interface RunEnd {
  run: number;
  /** the largest sequence number and session count of the process's ranks */
  seq: number;
  sessions: number;
  /** every rank of the process ended its program without error, ready, at the same sequence number */
  inStep: boolean;
  /** its programs ran different collectives: one was cut short by a release, or they ended at different numbers */
  mismatch: boolean;
  /** the first of its programs that threw (its time: epoch ms) */
  threw?: { rank: number; at: number; thrown: ThrownValue };
  /** the earliest of its programs that returned while others ran */
  returned?: { rank: number; seq: number };
}

const STACK_CHARS = 8192;

/** `e` as it crosses: texts cut to what the receivers accept. */
export function runEndWire(e: RunEnd): RunEnd {
  if (!e.threw) return e;
  const t = e.threw.thrown;
  const thrown: ThrownValue = {
    isError: t.isError, name: t.name.slice(0, LIMITS.idChars), message: t.message.slice(0, LIMITS.textChars),
    ...(t.stack !== undefined ? { stack: t.stack.slice(0, STACK_CHARS) } : {}),
    ...(t.code !== undefined ? { code: t.code.slice(0, LIMITS.idChars) } : {}),
    ...(t.phase !== undefined ? { phase: t.phase.slice(0, LIMITS.idChars) } : {}),
    ...(t.rank !== undefined ? { rank: t.rank } : {}),
    ...(!t.isError ? { value: t.message.slice(0, LIMITS.textChars) } : {}),
  };
  return { ...e, threw: { ...e.threw, thrown } };
}

/** What is wrong with process `of`'s RunEnd for run `run`, or undefined. */
export function runEndProblem(v: unknown, run: number, of: RendezvousPeer): string | undefined {
  if (!isObject(v)) return 'its run end is not an object';
  if (v.run !== run) return `its run end is for run ${quote(v.run)}, not ${run}`;
  if (!isInt(v.seq, 0, Number.MAX_SAFE_INTEGER) || !isInt(v.sessions, 0, 2 ** 32 - 1)) return 'its run end has no sequence number or session count';
  if (typeof v.inStep !== 'boolean' || typeof v.mismatch !== 'boolean') return 'its run end says nothing of its ranks being in step';
  const mine = (r: unknown) => isInt(r, of.rankOffset, of.rankOffset + of.localRanks - 1);
  if (v.threw !== undefined) {
    const t = v.threw as Record<string, unknown>;
    const x = isObject(t) ? (t.thrown as Record<string, unknown>) : undefined;
    if (!isObject(t) || !mine(t.rank) || typeof t.at !== 'number' || !Number.isFinite(t.at) || !isObject(x) || typeof x.isError !== 'boolean' ||
        !isText(x.name, LIMITS.idChars) || !isText(x.message, LIMITS.textChars) || (x.stack !== undefined && !isText(x.stack, STACK_CHARS)) ||
        (x.code !== undefined && !isText(x.code, LIMITS.idChars)) || (x.phase !== undefined && !isText(x.phase, LIMITS.idChars)))
      return 'its run end names a thrower that is not one of its ranks, or an invalid error';
  }
  if (v.returned !== undefined) {
    const r = v.returned as Record<string, unknown>;
    if (!isObject(r) || !mine(r.rank) || !isInt(r.seq, 0, Number.MAX_SAFE_INTEGER)) return 'its run end names a return that is not one of its ranks';
  }
  return undefined;
}

/** The world's run end: the largest numbers, in step (and matched) only if every process is at the same one, the earliest throw and return. */
export function mergeRunEnds(ends: RunEnd[]): RunEnd {
  const seq = Math.max(...ends.map((e) => e.seq));
  const threw = ends.flatMap((e) => (e.threw ? [e.threw] : [])).sort((a, b) => a.at - b.at)[0];
  const returned = ends.flatMap((e) => (e.returned ? [e.returned] : [])).sort((a, b) => a.seq - b.seq)[0];
  return {
    run: ends[0]!.run, seq, sessions: Math.max(...ends.map((e) => e.sessions)),
    inStep: ends.every((e) => e.inStep && e.seq === seq), mismatch: ends.some((e) => e.mismatch || e.seq !== seq),
    ...(threw ? { threw } : {}), ...(returned ? { returned } : {}),
  };
}
