// The failure paths of test/fault-paths.test.ts on cuda, ranks sharing GPU 0 (W = 2, 4 and 8): each
// case of test/fixtures/fault-cases.mjs repeated in a child process, which must exit 0 without a
// signal, every repetition as the contract says; prints how long until every rank knew (p50, p99).
// RANKFLOW_FAULT_REPS (default 20) and RANKFLOW_FAULT_CASES (comma list; default all) choose what runs.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { before, test } from 'node:test';
import assert from 'node:assert/strict';

import { requireGpu } from './helpers.mjs';

before(() => requireGpu());

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const reps = Number(process.env.RANKFLOW_FAULT_REPS ?? 20);
const ALL = [
  'destroy during run', 'terminate a waiting rank', 'abort during createGroup', 'a config too big to map', 'a program throws',
  'a program returns early', 'rank.aborted in an SPMD loop', 'a program leaves a session open', 'terminate during driver-mode ops',
];
const cases = process.env.RANKFLOW_FAULT_CASES ? process.env.RANKFLOW_FAULT_CASES.split(',') : ALL;

function runCase(name, W) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [path.join(root, 'test/fixtures/faults-child.mjs'), JSON.stringify({ name, W, reps, backend: 'cuda' })], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('exit', (exit, signal) => {
      const lines = out.split('\n').filter(Boolean).map((l) => JSON.parse(l));
      resolve({ exit, signal, err, reps: lines.filter((l) => !l.end), ended: lines.some((l) => l.end) });
    });
  });
}
const percentile = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];

for (const name of cases)
  for (const W of [2, 4, 8])
    test(`${name}, ${W} ranks sharing GPU 0: ${reps} times, no signal, no hang, every repetition as the contract says`, { timeout: 300_000 }, async () => {
      const r = await runCase(name, W);
      assert.equal(r.signal, null, r.err);
      assert.equal(r.exit, 0, r.err);
      assert.ok(r.ended, `the child ended early: ${r.err}`);
      assert.deepEqual(r.reps.filter((x) => !x.ok).map((x) => x.error), []);
      assert.equal(r.reps.length, reps);
      const ms = r.reps.map((x) => x.ms ?? 0);
      console.log(`${name}, W = ${W} (cuda): until every rank knew, p50 ${percentile(ms, 50).toFixed(1)} ms, p99 ${percentile(ms, 99).toFixed(1)} ms; wall ${r.reps.reduce((a, x) => a + x.wall, 0).toFixed(0)} ms`);
    });
