// What a follower of an elastic world hands on to the next leader when its leader was lost
// (takeover.ts): the `resume` it sends once it authenticated, and the `resumed` the new leader
// answers. A resume names its process exactly as its join did, the processes it knows lost, and, of
// the survivors' exchanges (live-exchange.ts: the re-formings' and the rejoins') and the run ends'
// exchange (run-exchange.ts), its count, the values it waits on and the results it saw. Nothing that
// comes over the socket is trusted: every field is checked, and a resume that does not fit is refused
// with the field named. The op count needs no field: every survivor gives it in its first re-forming
// round after the loss (elastic-world.ts), which is where the survivors agree on it.
import { isInt, isObject, isText, jsonBytes, quote, who, LIMITS, type Incoming, type Join, type Message } from './protocol.js';
import { DONE_KEPT, LIVE_VALUE_BYTES, MAX_AHEAD, type LiveHandOver } from './live-exchange.js';
import { DECIDED_KEPT, type RunsHandOver } from './run-exchange.js';
import type { RendezvousPeer } from './rendezvous.js';

/** What a follower hands on (with its waiters, on its own side; without them, on the wire). */
export interface HandOver { lost: number[]; live: LiveHandOver; joins: LiveHandOver; runs: RunsHandOver }

const MAX_NUMBER = 2 ** 53;
// Run ends a follower may wait on: one run at a time, as the leader's open runs are bounded (run-exchange.ts).
const MAX_RUNS_WAITING = 64;

/** The resume of process `me`, as it crosses. */
export function resumeMessage(me: Join, h: HandOver): Message {
  const live = (l: LiveHandOver) => ({ at: l.at, waiting: l.waiting.map((w) => ({ seq: w.seq, value: w.value })), done: l.done });
  return {
    t: 'resume', worldSize: me.worldSize, rankOffset: me.rankOffset, localRanks: me.localRanks, pid: me.pid, hostId: me.hostId, nodeId: me.nodeId,
    lost: h.lost, live: live(h.live), joins: live(h.joins), runs: { waiting: h.runs.waiting.map((w) => ({ run: w.run, value: w.value })), decided: h.runs.decided },
  };
}

/** The world as the new leader checks a resume against it. */
export interface ResumeContext {
  peers: readonly RendezvousPeer[];
  lost: ReadonlySet<number>;
  /** the new leader's index */
  leader: number;
  /** whether the leader waits for process `index`'s resume */
  awaits(index: number): boolean;
  /** the largest value of one process in a run end (session-base.ts exchangeLimit) */
  runValueBytes: number;
}

/** The follower's index and what it hands on, or what is wrong with its resume (naming the field). */
export function checkResume(m: Incoming, c: ResumeContext): { index: number; handOver: HandOver } | { problem: string } {
  const bad = (problem: string) => ({ problem });
  const n = c.peers.length, last = c.peers[n - 1]!, worldSize = last.rankOffset + last.localRanks;
  if (m.t !== 'resume') return bad(`it sent ${quote(m.t)}, not a resume`);
  if (m.worldSize !== worldSize) return bad(`worldSize ${quote(m.worldSize)} is not the world's (${worldSize})`);
  const index = c.peers.findIndex((p) => p.rankOffset === m.rankOffset);
  const p = c.peers[index];
  if (p === undefined) return bad(`rankOffset ${quote(m.rankOffset)} is not the first rank of a process of the world`);
  for (const k of ['localRanks', 'pid', 'hostId', 'nodeId'] as const)
    if (m[k] !== p[k]) return bad(`${k} ${quote(m[k])} is not that of ${who(p)}`);
  if (index === c.leader) return bad(`rankOffset ${p.rankOffset} is the new leader's`);
  if (!Array.isArray(m.lost) || m.lost.length > n) return bad(`lost is not an array of at most ${n} process indices`);
  const lost = new Set<number>();
  for (const [i, l] of m.lost.entries()) {
    if (!isInt(l, 0, n - 1) || lost.has(l)) return bad(`lost[${i}] ${quote(l)} is not a process index in [0, ${n}) named once`);
    if (l === index || l === c.leader) return bad(`lost[${i}] ${l} names ${l === index ? 'the resuming process' : 'the new leader'}`);
    lost.add(l);
  }
  const live = liveProblem(m.live, 'live', n) ?? liveProblem(m.joins, 'joins', n) ?? runsProblem(m.runs, n, c.runValueBytes);
  if (live) return bad(live);
  // Every field fits: now whether this process may resume here.
  if (c.lost.has(index)) return bad(`${who(p)} was lost: a process that was lost takes its range back with world.rejoin`);
  if (!c.awaits(index)) return bad(`${who(p)} resumed already, or the world is not taking over`);
  const r = m.runs as Record<string, unknown>;
  return {
    index,
    handOver: {
      lost: [...lost], live: m.live as unknown as LiveHandOver, joins: m.joins as unknown as LiveHandOver,
      runs: { waiting: r.waiting as RunsHandOver['waiting'], decided: r.decided as RunsHandOver['decided'] },
    },
  };
}

/** A survivors' exchange's part of a resume: `{ at, waiting: [{ seq, value }], done: [{ seq, values }] }`. */
function liveProblem(v: unknown, name: string, n: number): string | undefined {
  if (!isObject(v)) return `${name} is not an object`;
  if (!isInt(v.at, 0, MAX_NUMBER)) return `${name}.at ${quote(v.at)} is not a count`;
  const at = v.at;
  if (!Array.isArray(v.waiting) || v.waiting.length > MAX_AHEAD) return `${name}.waiting is not an array of at most ${MAX_AHEAD} entries`;
  const seen = new Set<number>();
  for (const [i, w] of v.waiting.entries()) {
    if (!isObject(w) || !isInt(w.seq, Math.max(1, at - MAX_AHEAD), at) || seen.has(w.seq)) return `${name}.waiting[${i}].seq ${quote(isObject(w) ? w.seq : w)} is not an exchange in [${Math.max(1, at - MAX_AHEAD)}, ${at}] named once`;
    if (jsonBytes(w.value) > LIVE_VALUE_BYTES) return `${name}.waiting[${i}].value is more than ${LIVE_VALUE_BYTES} bytes of JSON`;
    seen.add(w.seq);
  }
  if (!Array.isArray(v.done) || v.done.length > DONE_KEPT) return `${name}.done is not an array of at most ${DONE_KEPT} entries`;
  for (const [i, d] of v.done.entries()) {
    if (!isObject(d) || !isInt(d.seq, 1, at) || seen.has(d.seq)) return `${name}.done[${i}].seq ${quote(isObject(d) ? d.seq : d)} is not an exchange in [1, ${at}] it does not wait on`;
    if (!Array.isArray(d.values) || d.values.length !== n || jsonBytes(d.values) > n * LIVE_VALUE_BYTES) return `${name}.done[${i}].values is not ${n} values of at most ${LIVE_VALUE_BYTES} bytes each`;
  }
  return undefined;
}

/** The run ends' part of a resume: `{ waiting: [{ run, value }], decided: [{ run, values | null }] }`. */
function runsProblem(v: unknown, n: number, valueBytes: number): string | undefined {
  if (!isObject(v)) return 'runs is not an object';
  if (!Array.isArray(v.waiting) || v.waiting.length > MAX_RUNS_WAITING) return `runs.waiting is not an array of at most ${MAX_RUNS_WAITING} entries`;
  const seen = new Set<number>();
  for (const [i, w] of v.waiting.entries()) {
    if (!isObject(w) || !isInt(w.run, 1, Number.MAX_SAFE_INTEGER) || seen.has(w.run)) return `runs.waiting[${i}].run ${quote(isObject(w) ? w.run : w)} is not a run number named once`;
    if (jsonBytes(w.value) > valueBytes) return `runs.waiting[${i}].value is more than ${valueBytes} bytes of JSON`;
    seen.add(w.run);
  }
  if (!Array.isArray(v.decided) || v.decided.length > DECIDED_KEPT) return `runs.decided is not an array of at most ${DECIDED_KEPT} entries`;
  for (const [i, d] of v.decided.entries()) {
    if (!isObject(d) || !isInt(d.run, 1, Number.MAX_SAFE_INTEGER) || seen.has(d.run)) return `runs.decided[${i}].run ${quote(isObject(d) ? d.run : d)} is not a run number it does not wait on`;
    if (d.values !== null && (!Array.isArray(d.values) || d.values.length !== n || jsonBytes(d.values) > n * valueBytes))
      return `runs.decided[${i}].values is neither null (cut) nor ${n} run ends`;
  }
  return undefined;
}

/** What is wrong with the new leader's `resumed` (to process `self`, which knows `lost`), or undefined. */
export function resumedProblem(m: Incoming, peers: readonly RendezvousPeer[], self: number, known: { has(index: number): boolean }): string | undefined {
  const n = peers.length;
  if (m.t === 'error') return undefined;  // the caller reads it as the refusal it is
  if (m.t !== 'resumed') return `it sent ${quote(m.t)} instead of resumed`;
  if (!isInt(m.leader, 0, n - 1) || m.leader === self || known.has(m.leader)) return `leader ${quote(m.leader)} is not a process this one knows alive`;
  if (m.pid !== peers[m.leader]!.pid) return `pid ${quote(m.pid)} is not that of ${who(peers[m.leader]!)}`;
  const lost = m.lost;
  if (!Array.isArray(lost) || lost.length > n || !lost.every((l, i) => isInt(l, 0, n - 1) && l !== self && l !== m.leader && lost.indexOf(l) === i))
    return 'lost is not a list of the other processes, each named once';
  return undefined;
}

/** A refusal's text as it may be shown (bounded). */
export const refusal = (m: Incoming): string => (isText(m.message, LIMITS.textChars) ? m.message : 'the new leader refused this resume');
