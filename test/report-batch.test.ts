/**
 * How a rank's worker sends its transitions (workers/runner.ts): batched for up to REPORT_BATCH_MS or
 * MAX_BATCH_RECORDS transitions. A rank program whose awaits are all already resolved (a loop of
 * synchronous native calls) never lets the batch's timer run, so the batch must also go out from
 * the hot path itself: the main thread sees the loop's transitions while it runs, in order, none
 * lost, and the worker never holds more than a batch.
 */
import { describe, expect, test } from 'vitest';

import { EVENTS, PHASES, RankRunner } from '../workers/runner.js';
import { TransitionDecoder } from '../workers/transition-log.js';
import { MAX_BATCH_RECORDS, REPORT_BATCH_MS, type TransitionEvent, type WorkerMessage } from '../workers/protocol.js';

function runner() {
  const seen: TransitionEvent[] = [];
  let posts = 0;
  const decoder = new TransitionDecoder();
  const onMessage = (m: WorkerMessage): void => {
    if (m.kind === 'batch') m.messages.forEach(onMessage);
    else if (m.kind === 'transitions') decoder.decode(m, (t) => seen.push(t));
  };
  const r = new RankRunner(0, { cpuSeconds: 5, gpuSeconds: 5 }, { postMessage: (m) => (posts++, onMessage(m as WorkerMessage)) }, false);
  r.run(EVENTS.register, () => undefined);
  r.flush();
  const held = () => (r as unknown as { log: { size: number } }).log.size;
  return { r, seen, posts: () => posts, held };
}

describe('a rank reports its transitions while a program never yields', () => {
  test(`a synchronous loop of ${3 * MAX_BATCH_RECORDS} barriers: batches go out during it, each of at most ${MAX_BATCH_RECORDS} transitions, all of them in order`, () => {
    const { r, seen, posts, held } = runner();
    const before = seen.length;
    const n = 3 * MAX_BATCH_RECORDS;
    let most = 0;
    for (let i = 0; i < n; i++) {
      r.run(EVENTS.barrier, () => undefined, PHASES.barrier);
      most = Math.max(most, held());
    }
    const during = posts();
    r.flush();
    expect(most).toBeLessThanOrEqual(MAX_BATCH_RECORDS);
    // 2 transitions per barrier: at least one batch per MAX_BATCH_RECORDS of them before the loop ended
    expect(during).toBeGreaterThanOrEqual(Math.floor((2 * n) / MAX_BATCH_RECORDS) - 1);
    const mine = seen.slice(before);
    expect(mine).toHaveLength(2 * n);
    mine.forEach((t, i) => {
      expect(t.to).toBe(i % 2 === 0 ? 'barrier' : 'ready');
      expect(t.seq, `transition ${i}`).toBe(Math.floor(i / 2) + 1);
    });
  });

  test(`an op more than REPORT_BATCH_MS (${REPORT_BATCH_MS} ms) after the batch began sends it, with the timer never run`, () => {
    const { r, seen, posts } = runner();
    const before = seen.length, sent = posts();
    r.run(EVENTS.barrier, () => undefined, PHASES.barrier);
    expect(posts()).toBe(sent);  // the first op of a batch waits for its timer
    const until = performance.now() + 2 * REPORT_BATCH_MS + 1;
    while (performance.now() < until);  // a long synchronous stretch: no timer can run
    r.run(EVENTS.barrier, () => undefined, PHASES.barrier);
    expect(posts()).toBe(sent + 1);
    expect(seen.length - before).toBeGreaterThanOrEqual(2);
    r.flush();
    expect(seen.slice(before).map((t) => t.to)).toEqual(['barrier', 'ready', 'barrier', 'ready']);
  });
});
