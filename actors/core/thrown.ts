// What a rank program threw, as it crosses from the rank's worker to the main thread: a RankflowError
// keeps its code, rank, phase and state; any Error its class name (built-in classes are rebuilt as
// themselves), message and stack; anything else its value where it can be cloned, else its text.
// The group's run then rejects with the rebuilt value as its `cause`.
import { RankflowError, type RankflowErrorCode } from './errors.js';

export interface ThrownValue {
  isError: boolean;
  name: string;
  message: string;
  stack?: string;
  /** a RankflowError's fields */
  code?: string;
  rank?: number;
  phase?: string;
  state?: string;
  /** what was thrown, where it is not an Error (structured-cloneable) */
  value?: unknown;
}

const BUILT_IN: Record<string, new (message?: string) => Error> = {
  Error, TypeError, RangeError, SyntaxError, ReferenceError, EvalError, URIError,
};

/** The thrown value `e`, as plain data that postMessage can carry. */
export function thrownOf(e: unknown): ThrownValue {
  if (e instanceof Error) {
    const f = e as Error & { code?: unknown; rank?: unknown; phase?: unknown; state?: unknown };
    return {
      isError: true, name: e.name, message: e.message, ...(e.stack !== undefined ? { stack: e.stack } : {}),
      ...(e instanceof RankflowError ? { code: e.code } : typeof f.code === 'string' ? { code: f.code } : {}),
      ...(typeof f.rank === 'number' ? { rank: f.rank } : {}),
      ...(typeof f.phase === 'string' ? { phase: f.phase } : {}),
      ...(typeof f.state === 'string' ? { state: f.state } : {}),
    };
  }
  let value: unknown;
  try {
    value = structuredClone(e);
  } catch {
    value = String(e);
  }
  return { isError: false, name: typeof e, message: describeValue(e), value };
}

/** The value `t` describes, rebuilt on this thread: what the program threw, as near as can be. */
export function rebuildThrown(t: ThrownValue): unknown {
  if (!t.isError) return t.value;
  let e: Error;
  if (t.name === 'RankflowError' && t.code !== undefined) {
    e = new RankflowError(t.code as RankflowErrorCode, t.message, { rank: t.rank, phase: t.phase, state: t.state });
  } else {
    const Ctor = Object.hasOwn(BUILT_IN, t.name) ? BUILT_IN[t.name]! : Error;
    e = new Ctor(t.message);
    if (e.name !== t.name) Object.defineProperty(e, 'name', { value: t.name, writable: true, configurable: true });
    if (t.code !== undefined) Object.defineProperty(e, 'code', { value: t.code, writable: true, configurable: true, enumerable: true });
  }
  if (t.stack !== undefined) e.stack = t.stack;
  return e;
}

/** "TypeError: boom", or the value's text. */
export function thrownText(t: ThrownValue): string {
  return t.isError ? `${t.name}: ${t.message}` : `${t.name} ${t.message}`;
}

function describeValue(v: unknown): string {
  try {
    const s = typeof v === 'string' ? JSON.stringify(v) : typeof v === 'object' && v !== null ? JSON.stringify(v) ?? String(v) : String(v);
    return s.length > 200 ? `${s.slice(0, 200)}...` : s;
  } catch {
    return Object.prototype.toString.call(v);
  }
}
