/**
 * The failure paths of API.md "Faults", each run 20 times at W = 2, 4 and 8 in a child process
 * (test/fixtures/fault-cases.mjs): destroy or terminate at the wrong moment, an abort during
 * createGroup, a config too big to map, a program that throws, returns early, leaves a session open,
 * or stops on rank.aborted. The child must exit 0 without a signal (a native abort, or an exit with an
 * unsettled promise, fails here instead of ending the runner), and every repetition must have gone
 * as the contract says. Each case also reports how long every rank took to know (`ms`): well under a
 * timeout here; the figures themselves are bench/faults.ts's.
 */
import { describe, expect, test } from 'vitest';

import { percentile, runCaseChild } from './helpers/children.js';

interface Rep { rep: number; ok: boolean; ms?: number; error?: string }

const runCase = (name: string, W: number, reps: number) => runCaseChild<Rep>('faults-child.mjs', name, W, reps);

const CASES = [
    'destroy during run', 'terminate a waiting rank', 'abort during createGroup', 'a config too big to map', 'a program throws',
    'a program returns early', 'rank.aborted in an SPMD loop', 'a program leaves a session open', 'terminate during driver-mode ops',
];

describe.each(CASES)('%s', (name) => {
    test.each([2, 4, 8])('W = %i: 20 times, no signal, no hang, every repetition as the contract says', async (W) => {
        const r = await runCase(name, W, 20);
        const failed = r.reps.filter((x) => !x.ok);
        expect(r.signal, r.stderr).toBe(null);
        expect(r.exit, r.stderr).toBe(0);
        expect(r.ended, `the child ended early: ${r.stderr}`).toBe(true);
        expect(failed.map((x) => x.error)).toEqual([]);
        expect(r.reps).toHaveLength(20);
        const ms = r.reps.map((x) => x.ms ?? 0);
        // not a timeout's worth (the default ones are 100 s and more)
        expect(Math.max(...ms)).toBeLessThan(10_000);
        console.log(`${name}, W = ${W}: until every rank knew, p50 ${percentile(ms, 50).toFixed(1)} ms, p99 ${percentile(ms, 99).toFixed(1)} ms`);
    }, 180_000);
});

test('the original reproducer: 64 ranks whose buffer cannot be mapped, 3 times: EINVAL, no signal', async () => {
    const r = await runCase('a config too big to map', 64, 3);
    expect(r.signal, r.stderr).toBe(null);
    expect(r.exit, r.stderr).toBe(0);
    expect(r.reps.filter((x) => !x.ok).map((x) => x.error)).toEqual([]);
    expect(r.reps).toHaveLength(3);
}, 180_000);
