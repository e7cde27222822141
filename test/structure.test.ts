// The architecture's rules, checked on the tree (README, "How it is built"): every source file of the
// layers says in its first lines what it holds and stays readable in size; the environment is read in
// one place; the runtime never asks which backend it runs on (it calls the backend).
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

const root = path.resolve(__dirname, '..');
const SOURCE = /\.(ts|mts|mjs|cc|hpp|h|cu|cuh)$/;
const MAX_LINES = 420;  // "about 400"

function files(dir: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync(path.join(root, dir))) {
    const rel = path.join(dir, name);
    if (statSync(path.join(root, rel)).isDirectory()) out.push(...files(rel));
    else if (SOURCE.test(name) && !name.endsWith('.d.ts')) out.push(rel);
  }
  return out;
}

const layers = ['actors', 'workers', 'machines', 'native/src', 'kernels'].flatMap(files);
const read = (f: string): string => readFileSync(path.join(root, f), 'utf8');

describe('the source tree', () => {
  it('finds the layers\' sources', () => {
    expect(layers.length).toBeGreaterThan(60);
    expect(layers).toContain('actors/group.ts');
    expect(layers).toContain('native/src/binding/context.cc');
  });

  it('every source file opens with a comment saying what it holds', () => {
    const bare = layers.filter((f) => {
      const first = read(f).split('\n').find((l) => l.trim() !== '') ?? '';
      return !/^\s*(\/\/|\/\*|#!)/.test(first);
    });
    expect(bare).toEqual([]);
  });

  it(`no source file of actors/, workers/, machines/, native/ or kernels/ is over ${MAX_LINES} lines`, () => {
    const long = layers.map((f) => [f, read(f).split('\n').length] as const).filter(([, n]) => n > MAX_LINES);
    expect(long).toEqual([]);
  });

  it('the environment is read in actors/core/config.ts only (native code gets its values through init)', () => {
    const ts = layers.filter((f) => /\.(ts|mts|mjs)$/.test(f) && f !== path.join('actors', 'core', 'config.ts'));
    expect(ts.filter((f) => /process\.env\b/.test(read(f)))).toEqual([]);
    const native = layers.filter((f) => /\.(cc|hpp|h|cu|cuh)$/.test(f));
    expect(native.filter((f) => /\bgetenv\s*\(/.test(read(f)))).toEqual([]);
  });

  it("the addon's build scripts read the environment in native/build-config.mjs only", () => {
    const scripts = readdirSync(path.join(root, 'native')).filter((f) => f.endsWith('.mjs')).map((f) => path.join('native', f));
    expect(scripts).toContain(path.join('native', 'build-config.mjs'));
    expect(scripts.filter((f) => f !== path.join('native', 'build-config.mjs') && /process\.env\b/.test(read(f)))).toEqual([]);
  });

  it('outside the backends, the native runtime names no backend kind but where it makes the backend', () => {
    const outside = layers.filter((f) => f.startsWith(path.join('native', 'src')) && !f.startsWith(path.join('native', 'src', 'backends')));
    const asks = outside.filter((f) => /\bon_cuda\s*\(|BackendKind::(Cuda|Host)/.test(read(f)));
    // binding/context.cc turns the config's string into the kind, runtime/context.cc makes the backend
    // of that kind, runtime/config.hpp defaults it: nothing else may branch on it.
    expect(asks.sort()).toEqual([
      path.join('native', 'src', 'binding', 'context.cc'),
      path.join('native', 'src', 'runtime', 'config.hpp'),
      path.join('native', 'src', 'runtime', 'context.cc'),
    ]);
  });

  it('imports go one way: machines/ <- actors/core/ <- workers/ <- the rest of actors/ (no back-arrow)', () => {
    // The layer of a TypeScript source: machines, core (actors/core/, what both threads share), workers, or api (the rest of actors/).
    const layerOf = (f: string): string | undefined =>
      f.startsWith('machines/') ? 'machines' : f.startsWith('actors/core/') ? 'core' : f.startsWith('workers/') ? 'workers' : f.startsWith('actors/') ? 'api' : undefined;
    const rank: Record<string, number> = { machines: 0, core: 1, workers: 2, api: 3 };
    const ts = layers.filter((f) => f.endsWith('.ts') && layerOf(f) !== undefined);
    const back: string[] = [];
    for (const f of ts) {
      for (const m of read(f).matchAll(/^(?:import|export)[^'"]*?from\s+'(\.[^']+)'/gm)) {
        const target = path.normalize(path.join(path.dirname(f), m[1]!)).split(path.sep).join('/');
        const to = layerOf(target);
        if (to !== undefined && rank[to]! > rank[layerOf(f)!]!) back.push(`${f} -> ${target}`);
      }
    }
    expect(ts.length).toBeGreaterThan(50);
    expect(back).toEqual([]);
  });

  it('README\'s table of run-time variables is what actors/core/config.ts reads', () => {
    const inConfig = [...new Set([...read('actors/core/config.ts').matchAll(/\benv\.([A-Z][A-Z0-9_]*)/g)].map((m) => m[1]!))].sort();
    const readme = read('README.md');
    const at = readme.indexOf('## Environment');
    const section = readme.slice(at, readme.indexOf('\n## ', at + 4));
    const rows = section.split('\n').filter((l) => l.startsWith('| `'));
    const inTable = [...new Set(rows.flatMap((l) => [...l.split('|')[1]!.matchAll(/`([A-Z][A-Z0-9_]*)/g)].map((m) => m[1]!)))].sort();
    expect(inConfig.length).toBeGreaterThan(8);
    expect(inTable).toEqual(inConfig);
  });
});
