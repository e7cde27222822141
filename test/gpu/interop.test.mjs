// The application's own CUDA work beside rankflow's (rank.cudaStream(), cudaContext(), recordEvent(),
// waitEvent(), wrapDevice()), through the example addon of examples/interop-addon, built here with
// cmake-js and nvcc: its kernel scales a dispatch's received rows in place on the rank's stream, and
// again from those rows into memory of its own on a stream of its own, ordered by events both ways;
// both are combined. Each kernel first waits 50 ms on the GPU, so a missing order reads rows unwritten.
// Compared bit for bit with a host group given the same inputs and the same scaling done in JS.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { bf16ToFloat, createGroup, floatToBf16, layouts, requireGpu, tensor } from './helpers.mjs';
import { MOE_BUFFER, moeInput } from './moe-inputs.mjs';
import { factorA, factorB, factors } from './interop-inputs.mjs';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const ADDON_DIR = path.join(root, 'examples', 'interop-addon');
const ADDON = path.join(root, 'build', 'interop-addon', 'Release', 'rankflow_interop_example.node');

/**
 * Builds the example addon (cmake-js, nvcc) when it is missing or older than its sources. A machine
 * given only the runtime dependencies (the GPU machine: no cmake-js) uses the one built beside them.
 */
function buildAddon() {
  const sources = ['CMakeLists.txt', ...readdirSync(path.join(ADDON_DIR, 'src')).map((f) => path.join('src', f))].map((f) => path.join(ADDON_DIR, f));
  if (existsSync(ADDON) && statSync(ADDON).mtimeMs >= Math.max(...sources.map((f) => statSync(f).mtimeMs))) return;
  const cmakeJs = path.join(root, 'node_modules', 'cmake-js', 'bin', 'cmake-js');
  if (!existsSync(cmakeJs)) {
    if (existsSync(ADDON)) return;
    throw new Error(`the example addon ${path.relative(root, ADDON)} is not here and cmake-js is not installed to build it: build it where cmake-js is (this file's first run there does) and carry build/interop-addon along`);
  }
  execFileSync(process.execPath, [cmakeJs, 'compile', '--directory', ADDON_DIR, '--out', path.join(root, 'build', 'interop-addon')],
    { cwd: root, stdio: 'inherit' });
}

before(() => {
  requireGpu();
  buildAddon();
});

const { hidden } = MOE_BUFFER;
const TOKENS = { 2: [100, 77], 4: [100, 77, 0, 128] };
const bytes = (a) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);
/** bf16 rows times per-row factors, rounded to nearest even (what the addon's kernel does). */
const scale = (x, f) => Uint16Array.from(x, (b, i) => floatToBf16(bf16ToFloat(b) * f[Math.floor(i / hidden)]));

for (const layout of layouts([2, 4])) {
  const W = layout.ranks;
  const tokens = TOKENS[W];
  describe(`the application's kernels beside rankflow's: ${layout.name}`, () => {
    let cuda, host, res;
    const seed = 41;
    before(async () => {
      cuda = await createGroup({ backend: 'cuda', ranks: W, devices: layout.devices, buffer: MOE_BUFFER });
      host = await createGroup({ backend: 'host', ranks: W, buffer: MOE_BUFFER });
      res = await cuda.run(new URL('./programs/interop-scale.mjs', import.meta.url), { seed, tokens, addonPath: ADDON });
    });
    after(async () => {
      await cuda?.destroy();
      await host?.destroy();
    });

    test("rank.cudaStream() and rank.cudaContext() are the rank's: its stream's context, current on its thread", () => {
      for (const o of res) assert.deepEqual(o.handles, { stream: true, contextIsCurrent: true, streamContext: true });
    });

    test('combines of rows scaled on the rank stream and on the addon stream (events both ways, wrapped memory) equal the host', async () => {
      const ins = tokens.map((T, r) => {
        const i = moeInput(seed, r, T);
        return { x: tensor('bf16', [T, hidden], i.x), topkIdx: i.topkIdx, topkWeights: i.topkWeights };
      });
      const h = await host.dispatch(ins);
      const rowsA = h.map((d) => scale(d.x.data, factors(factorA, d.srcRank, d.srcToken)));
      const rowsB = h.map((d, r) => scale(rowsA[r], factors((_, t) => factorB(t), d.srcRank, d.srcToken)));
      const combineB = await host.combine(h.map((d, r) => ({ x: tensor('bf16', d.x.shape, rowsB[r]), handle: d.handle })));
      const combineA = await host.combine(h.map((d, r) => ({ x: tensor('bf16', d.x.shape, rowsA[r]), handle: d.handle })));
      res.forEach((o, r) => {
        assert.equal(o.numRecv, h[r].x.shape[0], `rank ${r}: rows received`);
        assert.ok(bytes(o.combineA).equals(bytes(combineA[r].x.data)), `rank ${r}: combine of the rows scaled on the rank's stream`);
        assert.ok(bytes(o.combineB).equals(bytes(combineB[r].x.data)), `rank ${r}: combine of the addon's rows (its stream, its memory)`);
      });
      // The scaling changed every rank's result (so equal results are not the unscaled ones).
      const plain = await host.combine(h.map((d) => ({ x: d.x, handle: d.handle })));
      res.forEach((o, r) => {
        if (tokens[r] > 0) assert.ok(!bytes(o.combineA).equals(bytes(plain[r].x.data)), `rank ${r}: scaling A changed nothing`);
      });
    });

    test('wrapDevice refuses memory CUDA does not know and addresses not 16-byte aligned, with EINVAL; the rank goes on', () => {
      for (const o of res) {
        assert.match(o.refused.unknown, /^EINVAL: wrapDevice: ptr 0x100000 is not memory CUDA knows/);
        assert.match(o.refused.misaligned, /^EINVAL: ptr: 0x[0-9a-f]+ is not 16-byte aligned/);
      }
      assert.deepEqual(cuda.snapshot().map((s) => s.state), Array(W).fill('ready'));
    });
  });
}
