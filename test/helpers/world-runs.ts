// What a process of an elastic world's op loop reports (test/fixtures/elastic-world-child.mjs), and the
// checks of group.run across the processes of an elastic world (test/elastic-world.test.ts,
// test/leader-takeover.test.ts): a loop of rank programs (test/fixtures/elastic-world-runs.mjs) that
// each gather every rank's part of the run (programs/world-gather.mjs), checked against the parts of
// the ranks that serve, those that left giving zeros.
import { expect } from 'vitest';

import type { Message } from './children.js';

/** The op loop's end in one process (test/fixtures/elastic-world-child.mjs). */
export interface Done extends Message {
  succeeded: number; rejected: number; skipped: number; oracle: number; errors: string[]; state: string; liveRanks: number[];
  lefts: Array<{ rank: number; at: number; code: string }>; firstOp: number | null; lastError: { code: string; rank?: number; message: string } | null;
}

export interface RunOutcome { i: number; t: number; ok: boolean; values?: Array<{ rank: number; live: number[]; gathered: number[] } | null>; code?: string; rank?: number; message?: string }
export interface RunsDone extends Message { rankOffset: number; outcomes: RunOutcome[]; lefts: Array<{ rank: number; at: number; code: string }>; firstRun: number | null; hang: string | null; state: string; liveRanks: number[] }
/** Rounds of gathers per run (elastic-world-runs.mjs `rounds`). */
export const ROUNDS = 3;

/** What run `i`'s programs gather when the ranks of `live` serve: [1000 q + i, round, -q - 1] from each rank q that does, zeros for the others. */
export const gatheredBy = (i: number, live: number[], W: number): number[] =>
  Array.from({ length: ROUNDS }, (_, k) => Array.from({ length: W }, (_, q) => (live.includes(q) ? [1000 * q + i, k, -q - 1] : [0, 0, 0]))).flat(2);

/** Every survivor's outcomes, run by run: alike in every process, each result the reference of the ranks it ran with. Returns the runs rejected and the first degraded one. */
export function checkRuns(done: RunsDone[], W: number, gone: number[], runs: number, first = 0): { rejected: number[]; degraded: number } {
  const all = Array.from({ length: W }, (_, g) => g), rest = all.filter((g) => !gone.includes(g));
  const rejected: number[] = [];
  let degraded = Infinity;
  for (const d of done) {
    expect(d.hang).toBeNull();
    expect(d.outcomes.map((o) => o.i)).toEqual(Array.from({ length: runs }, (_, j) => first + j));
  }
  for (let j = 0; j < runs; j++) {
    const os = done.map((d) => d.outcomes[j]!), i = first + j;
    // A run rejected in one process is rejected in every process, with RANK_FAILED naming a rank that left.
    expect(os.map((o) => o.ok), `run ${i}`).toEqual(os.map(() => os[0]!.ok));
    if (!os[0]!.ok) {
      for (const o of os) expect({ code: o.code, gone: gone.includes(o.rank!) }, `run ${i}: ${o.message}`).toEqual({ code: 'RANK_FAILED', gone: true });
      rejected.push(i);
      continue;
    }
    const live = os[0]!.values!.find((v) => v !== null)!.live;
    expect([all, rest], `run ${i} ran with ${live}`).toContainEqual(live);
    if (live.length < W) degraded = Math.min(degraded, i);
    else expect(i, `run ${i} ran with every rank after a degraded one`).toBeLessThan(degraded);
    os.forEach((o, p) => {
      expect(o.values!.map((v) => v?.rank)).toEqual(Array.from({ length: o.values!.length }, (_, r) => done[p]!.rankOffset + r));
      for (const v of o.values!) expect({ live: v!.live, gathered: v!.gathered }, `run ${i}, rank ${v!.rank}`).toEqual({ live, gathered: gatheredBy(i, live, W) });
    });
  }
  // At most the run in flight at the loss is rejected, before the degraded ones.
  expect(rejected.length).toBeLessThanOrEqual(1);
  for (const i of rejected) expect(i).toBeLessThan(degraded);
  return { rejected, degraded };
}
