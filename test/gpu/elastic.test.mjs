// Elastic groups on cuda (API.md "Elastic groups"), ranks sharing GPU 0 at W = 2 and 4: each case in a
// child process (fixtures/elastic-child.mjs; a native abort or a hang fails the case, not the runner),
// which must exit 0 with every repetition as the contract says. The host cases of
// test/fixtures/elastic-cases.mjs with their elastic group on cuda (oracle: a healthy host group on
// the masked inputs, bit for bit; after replaceRank the unmasked ones), the kill loop of
// elastic-loop.mjs, and the cuda-only cases of fixtures/elastic-graph-cases.mjs: graphs captured
// before a kill replayed after it, a kill during graph replay, a kill while barrier kernels wait on
// the GPU, a device wait that times out. Prints kill -> rankLeft (API.md: within 200 ms on cuda).
// RANKFLOW_ELASTIC_REPS (default 2), RANKFLOW_ELASTIC_CASES (comma list; default all),
// RANKFLOW_ELASTIC_OPS (kill loop, default 300), RANKFLOW_ELASTIC_GRAPH_REPS (the graph kill, default 4) choose what runs; RANKFLOW_ELASTIC_CHILD_MS bounds a child (240 s).
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { before, test } from 'node:test';
import assert from 'node:assert/strict';

import { requireGpu } from './helpers.mjs';

before(() => requireGpu());

const here = path.dirname(fileURLToPath(import.meta.url));
const reps = Number(process.env.RANKFLOW_ELASTIC_REPS ?? 2);
const ops = Number(process.env.RANKFLOW_ELASTIC_OPS ?? 300);
const graphReps = Number(process.env.RANKFLOW_ELASTIC_GRAPH_REPS ?? 4);
const CHILD_MS = Number(process.env.RANKFLOW_ELASTIC_CHILD_MS ?? 240_000);
// [case, world sizes]: two ranks leaving needs a third to stay; the kill loop kills while more than 2 serve.
const ALL = [
  ['dispatch and combine mask a dead rank, then a replacement serves', [2, 4]],
  // Its loop kills a rank while device-tensor combines replay: the survivors' pull-mode combines read the
  // dying rank's tensors (kernels/combine.cu), so it and the kill during device combines run at W = 8
  // too and GRAPH_REPS times.
  ['a graph captured before a kill replays after it, right', [2, 4, 8]],
  ['a kill during device combines', [2, 4, 8]],
  ['an op in flight when a rank dies', [2, 4]],
  ['a kill while barrier kernels wait on the GPU', [2, 4]],
  ['a device wait that times out leaves', [2, 4]],
  ['the other ops among the live ranks', [2, 4]],
  ['two ranks leave and come back', [4]],
  ['a worker that exits leaves', [4]],
  ['a replacement that dies while joining', [4]],
  ['kill loop', [4]],
];
const only = process.env.RANKFLOW_ELASTIC_CASES?.split(',');
const cases = only ? ALL.filter(([n]) => only.includes(n)) : ALL;

function runCase(name, W, n) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [path.join(here, 'fixtures/elastic-child.mjs'), JSON.stringify({ name, W, reps: n, ops })],
      { stdio: ['ignore', 'pipe', 'pipe'], timeout: CHILD_MS, killSignal: 'SIGKILL' });
    let out = '', err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('exit', (exit, signal) => {
      const lines = out.split('\n').filter(Boolean).map((l) => JSON.parse(l));
      resolve({ exit, signal, err: err.slice(-4000), reps: lines.filter((l) => !l.end), ended: lines.some((l) => l.end) });
    });
  });
}
const percentile = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];
const flat = (rs, k) => rs.flatMap((r) => (r[k] === undefined ? [] : [].concat(r[k])));

for (const [name, sizes] of cases)
  for (const W of sizes) {
    const n = name === 'kill loop' ? 1 : name.startsWith('a graph captured') || name === 'a kill during device combines' ? graphReps : reps;
    test(`${name}, ${W} ranks sharing GPU 0: ${n} time(s) in a child process, never a hang, never a wrong result`, { timeout: CHILD_MS + 10_000 }, async () => {
      const r = await runCase(name, W, n);
      assert.equal(r.signal, null, `killed (a hang past ${CHILD_MS} ms?): ${r.err}`);
      assert.equal(r.exit, 0, r.err);
      assert.ok(r.ended, `the child ended early: ${r.err}`);
      assert.deepEqual(r.reps.filter((x) => !x.ok).map((x) => x.error), []);
      assert.equal(r.reps.length, n);
      const left = flat(r.reps, 'left'), first = flat(r.reps, 'firstOp');
      for (const ms of left) assert.ok(ms < 200, `kill -> rankLeft ${ms.toFixed(1)} ms (API.md: within 200 ms on cuda)`);
      const extra = name === 'kill loop' ? `; ${r.reps[0].kills} kills, ${r.reps[0].replaced} replaced, ${r.reps[0].rejected} ops rejected, ${r.reps[0].succeeded} checked` : '';
      const tl = flat(r.reps, 'timeoutToLeft');
      console.log(`${name}, W = ${W} (cuda): wall ${r.reps.reduce((a, x) => a + x.wall, 0).toFixed(0)} ms` +
        (left.length ? `; kill -> rankLeft p50 ${percentile(left, 50).toFixed(1)} max ${Math.max(...left).toFixed(1)} ms` : '') +
        (first.length ? `; kill -> survivors' op p50 ${percentile(first, 50).toFixed(1)} max ${Math.max(...first).toFixed(1)} ms` : '') +
        (tl.length ? `; gpuSeconds -> rankLeft ${tl.map((x) => x.toFixed(0)).join(', ')} ms` : '') + extra);
      if (name === 'kill loop') {
        assert.ok(r.reps[0].kills >= 1, 'the loop killed no rank');
        assert.equal(r.reps[0].succeeded + r.reps[0].rejected, ops);
      }
    });
  }
