/**
 * Which build of the addon a process loads (actors/core/addon-select.ts): the first candidate that is
 * there and passes its probe, the ones before it passed over and said so; a source build without the
 * CUDA backend gives way to the prebuilt cuda build where the machine has a driver. (The real builds:
 * test/package.test.ts runs a host group on the prebuilt host addon; the suite itself runs on a source
 * build with the CUDA backend wherever nvcc is, CI's included, on machines without libcuda.)
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { chooseAddon, fallbackMessage, probeAddon, type AddonCandidate } from '../actors/core/addon-select.js';

let dir = '';
const file = (name: string) => join(dir, name);
const candidate = (origin: AddonCandidate['origin'], name: string): AddonCandidate => ({ origin, path: file(name), description: `${origin} build` });

/** Stand-ins for loaded modules: a working addon (with or without the CUDA part), and broken ones. */
const working = { Context: class {}, layout: () => ({ sizeHint: 4 << 20 }) };
const withCuda = { ...working, cudaProbe: () => ({}) };
const modules: Record<string, unknown> = { 'host.node': working, 'cuda.node': withCuda, 'source-host.node': working, 'not-addon.node': { hello: 1 }, 'bad-layout.node': { ...working, layout: () => { throw new Error('no'); } } };
const load = (path: string): unknown => {
  const name = path.slice(dir.length + 1);
  if (name === 'glibc.node') throw new Error(`${path}: /lib/x86_64-linux-gnu/libc.so.6: version \`GLIBC_2.34' not found\nmore`);
  return modules[name];
};

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'rankflow-addon-select-'));
  for (const name of [...Object.keys(modules), 'glibc.node']) await writeFile(file(name), '');
});
afterAll(() => rm(dir, { recursive: true, force: true }));

describe('choosing the addon', () => {
  test('the first that is there and passes its probe; missing files are skipped without a word', () => {
    const choice = chooseAddon([candidate('source', 'missing.node'), candidate('prebuilt-host', 'host.node'), candidate('prebuilt-cuda', 'cuda.node')], load, false);
    expect(choice.loaded).toMatchObject({ origin: 'prebuilt-host', path: file('host.node'), addon: working });
    expect(choice.passedOver).toEqual([]);
    expect(fallbackMessage(choice)).toBeUndefined();
  });

  test('one that fails to load or its probe is passed over, and the fallback is said', () => {
    const choice = chooseAddon([candidate('prebuilt-cuda', 'glibc.node'), candidate('source', 'not-addon.node'), candidate('prebuilt-host', 'host.node')], load, false);
    expect(choice.loaded?.origin).toBe('prebuilt-host');
    expect(choice.passedOver.map((p) => [p.origin, p.error])).toEqual([
      ['prebuilt-cuda', `${file('glibc.node')}: /lib/x86_64-linux-gnu/libc.so.6: version \`GLIBC_2.34' not found`],
      ['source', 'it is not a rankflow addon (no Context, no layout)'],
    ]);
    expect(fallbackMessage(choice)).toBe(`rankflow: the prebuilt-cuda build at ${file('glibc.node')} was passed over: ${choice.passedOver[0]!.error}; ` +
      `the source build at ${file('not-addon.node')} was passed over: it is not a rankflow addon (no Context, no layout); falling back to the prebuilt-host build at ${file('host.node')}`);
  });

  test('none loads: the error lists each with its reason and says how to build one', () => {
    const choice = chooseAddon([candidate('source', 'bad-layout.node'), candidate('prebuilt-host', 'glibc.node')], load, false);
    expect(choice.loaded).toBeUndefined();
    expect(choice.error).toBe(`no build of the native addon could be loaded:\n  ${file('bad-layout.node')} (source build): its layout() threw: no\n` +
      `  ${file('glibc.node')} (prebuilt-host build): ${file('glibc.node')}: /lib/x86_64-linux-gnu/libc.so.6: version \`GLIBC_2.34' not found\n` +
      'Build it from source: `npm rebuild rankflow` (docs/install.md)');
  });

  test('none there: the error says the install script did not run', () => {
    expect(chooseAddon([candidate('source', 'a.node'), candidate('prebuilt-host', 'b.node')], load, false).error)
      .toMatch(/^the native addon is not built and no prebuilt addon ships for linux-x64 \(looked for .*a\.node, .*b\.node\): its install script did not run; run `npm rebuild rankflow`/);
  });

  test('RANKFLOW_ADDON naming a missing file is that error, with no fallback', () => {
    const choice = chooseAddon([candidate('RANKFLOW_ADDON', 'nope.node')], load, false);
    expect(choice).toEqual({ passedOver: [], error: `RANKFLOW_ADDON names ${file('nope.node')}, which does not exist` });
  });

  test('where cuda is wanted, a source build without CUDA gives way to the cuda prebuilt, and is the last resort', () => {
    const list = [candidate('source', 'source-host.node'), candidate('prebuilt-cuda', 'cuda.node'), candidate('prebuilt-host', 'host.node')];
    const choice = chooseAddon(list, load, true);
    expect(choice.loaded?.origin).toBe('prebuilt-cuda');
    expect(choice.passedOver.map((p) => p.error)).toEqual(['it has no CUDA backend (built without nvcc) and this machine has an NVIDIA driver']);
    // Without cuda wanted the source build is used as it is.
    expect(chooseAddon(list, load, false).loaded?.origin).toBe('source');
    // The cuda prebuilt failing, the source build is used (not the host prebuilt): it is the user's.
    const broken = chooseAddon([candidate('source', 'source-host.node'), candidate('prebuilt-cuda', 'glibc.node'), candidate('prebuilt-host', 'host.node')], load, true);
    expect(broken.loaded?.origin).toBe('source');
    expect(broken.passedOver.map((p) => p.origin)).toEqual(['prebuilt-cuda']);
  });

  test('the probe calls layout() and checks what it answers', () => {
    expect(probeAddon(working)).toBeUndefined();
    expect(probeAddon(null)).toMatch(/not a rankflow addon/);
    expect(probeAddon({ ...working, layout: () => ({ sizeHint: 'x' }) })).toBe('its layout() answered {"sizeHint":"x"}');
  });
});
