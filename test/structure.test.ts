// The architecture's rules, checked on the tree (README, "How it is built"): every source file of the
// layers says in its first lines what it holds and stays readable in size; the environment is read in
// one place; the runtime never asks which backend it runs on (it calls the backend); in workers/, only
// the op table (workers/ops/) calls the rank's native context.
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

  it("workers/ops/ (the op table) is the one place in workers/ that calls the rank's native context, and holds it privately", () => {
    // Without comments (a comment may name a native call); '://' in a string is not one.
    const code = (f: string): string => read(f).replace(/\/\*[\s\S]*?\*\//g, '').replace(/(^|\s)\/\/.*$/gm, '$1');
    const addon = read('actors/core/addon.ts');
    const body = addon.slice(addon.indexOf('export interface NativeContext {'), addon.indexOf('\n}', addon.indexOf('export interface NativeContext {')));
    const members = new Set([...body.matchAll(/^\s+(?:readonly\s+)?(\w+)\s*[(:]/gm)].map((m) => m[1]!));
    expect(members).toContain('inflightWait');
    expect(members).toContain('abortOffset');
    const opsDir = path.join('workers', 'ops') + path.sep;
    const table = layers.filter((f) => f.startsWith(opsDir));
    const others = layers.filter((f) => f.startsWith('workers' + path.sep) && !f.startsWith(opsDir));
    expect(table).toContain(path.join('workers', 'ops', 'index.ts'));
    expect(others).toContain(path.join('workers', 'program.ts'));
    // Names the op table declares too (info, seq, barrier, ...) are called outside it through the table.
    const declared = new Set(table.flatMap((f) => [...code(f).matchAll(/^\s+(?:async\s+|get\s+)?(\w+)\s*(?:<[^>]*>)?\(/gm)].map((m) => m[1]!)));
    const onlyNative = [...members].filter((m) => !declared.has(m));
    expect(onlyNative).toContain('inflightWait');
    const calls: string[] = [];
    for (const f of others) {
      const src = code(f);
      for (const m of src.matchAll(/(?<![.\w$])(?:native|context|ctx|nativeContext)\s*\??\.\s*(\w+)/g)) if (members.has(m[1]!)) calls.push(`${f}: ${m[0]}`);
      for (const m of src.matchAll(new RegExp(`\\.\\s*(?:${onlyNative.join('|')})\\b`, 'g'))) calls.push(`${f}: ${m[0]}`);
      for (const m of src.matchAll(/\.native\b|\{[^{}]*\bnative\b[^{}]*\}\s*=|\bNativeContext\b/g)) calls.push(`${f}: ${m[0]}`);
      // device tensors call the context they are made with: only the op table makes them
      for (const m of src.matchAll(/\bnew\s+(?:DeviceTensor|SessionDeviceView)\b|\b(?:deviceTensor|deviceEmpty|externalTensor)\s*\(/g)) calls.push(`${f}: ${m[0]}`);
    }
    expect(calls).toEqual([]);
    // The context is made in the worker's entry, and its one use there is to hand it to RankOps.
    const made = others.filter((f) => /\.Context\s*\(/.test(code(f)));
    expect(made).toEqual([path.join('workers', 'rank.ts')]);
    const rank = code(path.join('workers', 'rank.ts'));
    const name = /(?:const|let)\s+(\w+)\s*=\s*new\s+\w+\.Context\s*\(/.exec(rank)?.[1];
    expect(name).toBeDefined();
    const uses = [...rank.matchAll(new RegExp(`\\b${name}\\b`, 'g'))].length;
    expect(new RegExp(`new RankOps\\(\\s*\\w+\\s*,\\s*${name}\\s*,`).test(rank)).toBe(true);
    expect(uses).toBe(2);
    // Inside the table the context is private to RankOps and its parts.
    const held = table.flatMap((f) => [...code(f).matchAll(/^\s*(.*?)\bnative\s*:\s*NativeContext\b/gm)].map((m) => `${f}: ${m[1]!.trim()}`));
    expect(held.length).toBeGreaterThanOrEqual(4);
    expect(held.filter((h) => !h.endsWith('private readonly'))).toEqual([]);
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
