/**
 * The package as npm would publish it: what the tarball holds (`npm pack --dry-run`: what a user
 * runs, no tests, no source maps pointing at sources it does not ship and no comment naming a map it
 * lacks), the fields a registry and Node read (license, os, exports), and that both `import` and
 * `require` load it.
 */
import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { join, posix } from 'node:path';
import { promisify } from 'node:util';
import { beforeAll, describe, expect, test } from 'vitest';
import { ensureCompiled, repoRoot } from './helpers/children.js';

const run = promisify(execFile);
const pkg = JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as Record<string, any>;

describe('the tarball', () => {
    let files: string[] = [];

    beforeAll(async () => {
        ensureCompiled('dist/actors/index.js', ['actors/index.ts']);
        // --ignore-scripts: packing would run `prepare` (tsc) again.
        const { stdout } = await run('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: repoRoot, maxBuffer: 16 << 20 });
        files = (JSON.parse(stdout) as Array<{ files: Array<{ path: string }> }>)[0]!.files.map((f) => f.path);
    }, 60_000);

    test('ships what a user runs: the compiled package, the CLI and its bench, the addon sources, the docs, the examples, the license', () => {
        for (const file of [
            'package.json', 'README.md', 'LICENSE', 'bin/rankflow.js',
            'dist/actors/index.js', 'dist/actors/index.d.ts', 'dist/actors/cli/main.js', 'dist/machines/index.js',
            'dist/workers/rank.js', 'dist/bench/host.js', 'dist/bench/gpu.js', 'dist/bench/programs/moe-loop.js',
            'native/CMakeLists.txt', 'kernels/kernels.cmake', 'kernels/dispatch.cu',
            'docs/api.md', 'docs/inspector.md', 'docs/scale-out.md', 'examples/moe-step.mjs',
            'examples/interop-addon/CMakeLists.txt', 'examples/interop-addon/src/scale.cu'
        ]) {
            expect(files).toContain(file);
        }
    });

    test('ships no tests, no native test harnesses and no source maps', () => {
        expect(files.filter((f) => f.startsWith('dist/test/'))).toEqual([]);
        expect(files.filter((f) => /^native\/test/.test(f))).toEqual([]);
        // Maps would point at TypeScript sources the tarball does not hold.
        expect(files.filter((f) => f.endsWith('.map'))).toEqual([]);
        expect(files.filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts'))).toEqual([]);
    });

    test('ships no working notes, results or logs: they stay in the repository', () => {
        expect(files.filter((f) => /_STATUS\.md$/.test(f) || /^(bench\/results|test)\//.test(f))).toEqual([]);
    });

    test('ships a picture only where a shipped document shows it', async () => {
        const docs = files.filter((f) => f.endsWith('.md'));
        const shown = new Set<string>();
        for (const doc of docs) {
            const text = await readFile(join(repoRoot, doc), 'utf8');
            for (const m of text.matchAll(/!\[[^\]]*\]\(([^)\s#]+)\)|<img [^>]*src="([^"]+)"/g)) shown.add(posix.join(posix.dirname(doc), m[1] ?? m[2]!));
        }
        expect(files.filter((f) => /\.(png|jpe?g|gif|webp|svg)$/i.test(f) && !shown.has(f))).toEqual([]);
    });

    test('its JavaScript names no source map it does not ship', async () => {
        // A `//# sourceMappingURL=` comment sends debuggers and bundlers after a file that is not there.
        const scripts = files.filter((f) => /\.(m?js|d\.ts)$/.test(f));
        expect(scripts.length).toBeGreaterThan(50);
        const dangling: string[] = [];
        for (const f of scripts) {
            const text = await readFile(join(repoRoot, f), 'utf8');
            for (const m of text.matchAll(/^\/\/# sourceMappingURL=(\S+)$/gm)) {
                if (!files.includes(posix.join(posix.dirname(f), m[1]!))) dangling.push(`${f} -> ${m[1]}`);
            }
        }
        expect(dangling).toEqual([]);
    });
});

describe('package.json', () => {
    test('is MIT with the license text shipped, for Linux only, without unused dependencies', async () => {
        expect(pkg.license).toBe('MIT');
        const license = await readFile(join(repoRoot, 'LICENSE'), 'utf8');
        expect(license).toMatch(/^MIT License/);
        expect(license).toContain('Copyright (c) 2026 rankflow authors');
        expect(pkg.os).toEqual(['linux']);
        expect(pkg.dependencies).not.toHaveProperty('piscina');
        expect(pkg.devDependencies).toMatchObject({ vitest: '4.1.12', vite: '8.3.8' });
    });

    test("exports '.' for import and for require(esm), both the ESM entry", () => {
        expect(pkg.exports['.']).toEqual({
            types: './dist/actors/index.d.ts',
            import: './dist/actors/index.js',
            default: './dist/actors/index.js'
        });
    });
});

describe('loading the package by its name', () => {
    const node = (args: string[]) => run(process.execPath, args, { cwd: repoRoot });

    test('import works', async () => {
        const { stdout } = await node(['--input-type=module', '-e', "const m = await import('rankflow'); console.log(typeof m.createGroup, typeof m.toChromeTrace)"]);
        expect(stdout.trim()).toBe('function function');
    });

    // require(esm) is on by default from Node 20.19 / 22.12; older Nodes cannot require an ES module at all.
    const requireEsm = (process.features as { require_module?: boolean }).require_module === true;

    test.skipIf(!requireEsm)('require works where Node can require an ES module', async () => {
        const { stdout } = await node(['-e', "const m = require('rankflow'); console.log(typeof m.createGroup, typeof m.TimelineRecorder, typeof m.attachInspector)"]);
        expect(stdout.trim()).toBe('function function function');
    });

    test.skipIf(requireEsm)('without require(esm), require fails for that reason, not for a missing export', async () => {
        await expect(node(['-e', "require('rankflow')"])).rejects.toMatchObject({ stderr: expect.not.stringContaining('ERR_PACKAGE_PATH_NOT_EXPORTED') });
    });
});
