/**
 * The package as npm would publish it and a user would install it. The tarball is packed for real
 * (with the host prebuilt addon only: RANKFLOW_PREBUILDS=host, as CI's time allows; the cuda one takes
 * minutes and is what a release's `npm pack` adds), and checked for what it holds; then installed into
 * an empty project with --ignore-scripts, where a host group runs on the prebuilt addon and a strict
 * TypeScript project compiles against its declarations (skipLibCheck false); installed with its
 * scripts, it compiles nothing; `npm rebuild` compiles from source, says so, and leaves only the addon.
 * Also the package.json fields a registry and Node read, and that `import` and `require` load it.
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readdir, readFile, rm, writeFile, copyFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, posix } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { ensureCompiled, repoRoot } from './helpers/children.js';

const run = promisify(execFile);
const pkg = JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as Record<string, any>;
const typesNode = pkg.devDependencies['@types/node'] as string;
const platform = `${process.platform}-${process.arch}`;

/** The environment of a user's shell: none of npm's own variables (npm test sets them) nor rankflow's. */
function userEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
    const env: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(process.env)) if (!/^(npm_|RANKFLOW_|DEBUG$|NODE_DEBUG$)/i.test(k)) env[k] = v;
    return { ...env, ...extra };
}

async function npm(args: string[], cwd: string, env = userEnv()): Promise<{ stdout: string; stderr: string; seconds: number }> {
    const t0 = performance.now();
    const { stdout, stderr } = await run('npm', [...args, '--no-audit', '--no-fund', '--prefer-offline'], { cwd, env, maxBuffer: 64 << 20 });
    return { stdout, stderr, seconds: (performance.now() - t0) / 1000 };
}

/** An empty ES-module project in a temporary folder. */
async function project(dirs: string[]): Promise<string> {
    const dir = await mkdtemp(join(tmpdir(), 'rankflow-consumer-'));
    dirs.push(dir);
    await writeFile(join(dir, 'package.json'), JSON.stringify({ name: 'consumer', private: true, type: 'module' }, null, 2));
    return dir;
}

/** A host group on the installed package: dispatch and combine, the result checked against the input. */
const HOST_GROUP = `
import { createGroup, tensor, toBf16, fromBf16 } from 'rankflow';
const g = await createGroup({ backend: 'host', ranks: 2, buffer: { maxTokensPerRank: 4, hidden: 8, topk: 1, numExperts: 2 } });
const x = tensor('bf16', [4, 8], toBf16(Float32Array.from({ length: 32 }, (_, i) => i)));
const d = await g.dispatch([0, 1].map(() => ({ x, topkIdx: Int32Array.from([0, 1, 0, 1]), topkWeights: new Float32Array(4).fill(1) })));
const back = await g.combine(d.map((o) => ({ x: o.x, handle: o.handle })));
const exact = back.every((b) => fromBf16(b.x.data).every((v, i) => v === i));
console.log(JSON.stringify({ size: g.size, backend: g.backend, received: d.map((o) => o.x.shape[0]), exact }));
await g.destroy();
`;

const dirs: string[] = [];
let tarball = '';
let files: string[] = [];

beforeAll(async () => {
    ensureCompiled('dist/actors/index.js', ['actors/index.ts', 'actors/core/addon.ts', 'actors/core/addon-select.ts']);
    // What prepack runs, here for the host prebuilt only; then the pack itself (--ignore-scripts: its
    // prepare would compile the TypeScript again, under the other test files' workers).
    await run(process.execPath, ['native/prebuild.mjs'], { cwd: repoRoot, env: userEnv({ RANKFLOW_PREBUILDS: 'host' }), maxBuffer: 64 << 20 });
    const out = await mkdtemp(join(tmpdir(), 'rankflow-pack-'));
    dirs.push(out);
    const { stdout } = await npm(['pack', '--json', '--ignore-scripts', '--pack-destination', out], repoRoot);
    const packed = (JSON.parse(stdout) as Array<{ filename: string; files: Array<{ path: string }> }>)[0]!;
    tarball = join(out, packed.filename);
    files = packed.files.map((f) => f.path);
}, 900_000);

afterAll(async () => {
    for (const dir of dirs) await rm(dir, { recursive: true, force: true });
});

describe('the tarball', () => {
    test('ships what a user runs: the compiled package, the prebuilt addon, the CLI and its bench, the addon sources and build scripts, the docs, the examples, the license', () => {
        for (const file of [
            'package.json', 'README.md', 'LICENSE', 'bin/rankflow.js',
            'dist/actors/index.js', 'dist/actors/index.d.ts', 'dist/actors/cli/main.js', 'dist/machines/index.js',
            'dist/workers/rank.js', 'dist/bench/host.js', 'dist/bench/gpu.js', 'dist/bench/programs/moe-loop.js',
            `prebuilds/${platform}/rankflow-host.node`,
            'native/CMakeLists.txt', 'native/package.json', 'native/install.mjs', 'native/build.mjs', 'native/build-config.mjs',
            'kernels/kernels.cmake', 'kernels/dispatch.cu',
            'docs/api.md', 'docs/install.md', 'docs/inspector.md', 'docs/scale-out.md', 'examples/moe-step.mjs',
            'examples/interop-addon/CMakeLists.txt', 'examples/interop-addon/src/scale.cu'
        ]) {
            expect(files).toContain(file);
        }
    });

    test('ships no tests, no native test harnesses, no source maps, no build folder and no pack-time script', () => {
        expect(files.filter((f) => f.startsWith('dist/test/'))).toEqual([]);
        expect(files.filter((f) => /^native\/test/.test(f))).toEqual([]);
        // Maps would point at TypeScript sources the tarball does not hold.
        expect(files.filter((f) => f.endsWith('.map'))).toEqual([]);
        expect(files.filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts'))).toEqual([]);
        expect(files.filter((f) => f.startsWith('build/'))).toEqual([]);
        expect(files).not.toContain('native/prebuild.mjs');
        // Only the addons the loader looks for (actors/core/addon-select.ts).
        expect(files.filter((f) => f.startsWith('prebuilds/'))).toEqual([`prebuilds/${platform}/rankflow-host.node`]);
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

    test('its declarations name no deep path of comlink (untyped there) and no comlink type at all (they need the DOM lib)', async () => {
        const dts = files.filter((f) => f.endsWith('.d.ts'));
        const named = [];
        for (const f of dts) if (/from ['"]comlink/.test(await readFile(join(repoRoot, f), 'utf8'))) named.push(f);
        expect(named).toEqual([]);
    });
});

describe('installed from the tarball with --ignore-scripts', () => {
    let dir = '';
    let seconds = 0;

    beforeAll(async () => {
        dir = await project(dirs);
        ({ seconds } = await npm(['install', '--ignore-scripts', tarball, `@types/node@${typesNode}`], dir));
        console.log(`npm install --ignore-scripts <tarball>: ${seconds.toFixed(1)} s`);
    }, 300_000);

    test('a host group runs, on the prebuilt host addon, without a word of fallback; nothing was compiled', async () => {
        await writeFile(join(dir, 'host-group.mjs'), HOST_GROUP);
        const { stdout, stderr } = await run(process.execPath, ['host-group.mjs'], { cwd: dir, env: userEnv() });
        expect(JSON.parse(stdout)).toEqual({ size: 2, backend: 'host', received: [4, 4], exact: true });
        expect(stderr).not.toMatch(/falling back|passed over/);
        const doctor = await run(process.execPath, [join(dir, 'node_modules/rankflow/bin/rankflow.js'), 'doctor', '--json'], { cwd: dir, env: userEnv() });
        expect(JSON.parse(doctor.stdout).addon).toEqual({ loaded: true, origin: 'prebuilt-host', path: join(dir, `node_modules/rankflow/prebuilds/${platform}/rankflow-host.node`) });
        expect(existsSync(join(dir, 'node_modules/rankflow/build'))).toBe(false);
    }, 120_000);

    test('a strict TypeScript project compiles against the shipped declarations (skipLibCheck false), with the default lib and with lib ES2022 alone', async () => {
        await copyFile(join(repoRoot, 'test/types/consumer/index.ts'), join(dir, 'index.ts'));
        const strict = { target: 'ES2022', module: 'NodeNext', strict: true, noEmit: true, skipLibCheck: false };
        const configs = {
            'tsconfig.defaults.json': { compilerOptions: strict, files: ['index.ts'] },
            'tsconfig.node.json': {
                compilerOptions: { ...strict, lib: ['ES2022'], types: ['node'], noUncheckedIndexedAccess: true, noImplicitOverride: true, noPropertyAccessFromIndexSignature: true },
                files: ['index.ts']
            }
        };
        const tsc = join(repoRoot, 'node_modules/typescript/bin/tsc');
        for (const [name, config] of Object.entries(configs)) {
            await writeFile(join(dir, name), JSON.stringify(config, null, 2));
            const result = await run(process.execPath, [tsc, '-p', name], { cwd: dir }).then(() => 'compiles', (e: { stdout: string }) => e.stdout);
            expect(result, name).toBe('compiles');
        }
        // The check can fail: a bf16 tensor's data read as a Float32Array is refused.
        await writeFile(join(dir, 'misuse.ts'), "import { tensor } from 'rankflow';\nexport const data: Float32Array = tensor('bf16', [1]).data;\n");
        await writeFile(join(dir, 'tsconfig.misuse.json'), JSON.stringify({ compilerOptions: strict, files: ['misuse.ts'] }));
        const misuse = await run(process.execPath, [tsc, '-p', 'tsconfig.misuse.json'], { cwd: dir }).then(() => '', (e: { stdout: string }) => e.stdout);
        expect(misuse).toMatch(/^misuse\.ts\(2,14\): error TS2322: Type 'Uint16Array<ArrayBufferLike>' is not assignable to type 'Float32Array/m);
    }, 120_000);

    test('npm rebuild compiles from source, says what it builds and how far it is, and leaves nothing but the addon, which is then used', async () => {
        const { stderr } = await npm(['rebuild', 'rankflow', '--foreground-scripts'], dir);
        expect(stderr).toMatch(/^rankflow: building the native addon from source \(npm rebuild\): the host backend; CUDA skipped: /m);
        expect(stderr).toMatch(/^rankflow: compiling host: \d+%$/m);
        expect(stderr).toMatch(/^rankflow: built build\/native\/Release\/rankflow\.node \(host backend\) in \d+ s$/m);
        const build = join(dir, 'node_modules/rankflow/build');
        expect((await readdir(build, { recursive: true })).sort()).toEqual(['native', join('native', 'Release'), join('native', 'Release', 'rankflow.node')]);
        const doctor = await run(process.execPath, [join(dir, 'node_modules/rankflow/bin/rankflow.js'), 'doctor', '--json'], { cwd: dir, env: userEnv() });
        expect(JSON.parse(doctor.stdout).addon).toMatchObject({ loaded: true, origin: 'source' });
        const { stdout } = await run(process.execPath, ['host-group.mjs'], { cwd: dir, env: userEnv() });
        expect(JSON.parse(stdout)).toMatchObject({ exact: true });
    }, 600_000);
});

describe('installed from the tarball with its install script', () => {
    test('the script finds the prebuilt addon loads here and compiles nothing', async () => {
        const dir = await project(dirs);
        const { stdout, stderr, seconds } = await npm(['install', '--foreground-scripts', tarball], dir);
        console.log(`npm install <tarball>: ${seconds.toFixed(1)} s`);
        expect(`${stdout}${stderr}`).toMatch(new RegExp(`^rankflow: using the prebuilt host addon \\(prebuilds/${platform}/rankflow-host\\.node\\): nothing to compile$`, 'm'));
        expect(stderr).not.toMatch(/building the native addon/);
        expect(existsSync(join(dir, 'node_modules/rankflow/build'))).toBe(false);
        await writeFile(join(dir, 'host-group.mjs'), HOST_GROUP);
        expect(JSON.parse((await run(process.execPath, ['host-group.mjs'], { cwd: dir, env: userEnv() })).stdout)).toMatchObject({ exact: true });
    }, 300_000);
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

    test('install picks a prebuilt addon or builds from source; pack makes the prebuilt addons', () => {
        expect(pkg.scripts).toMatchObject({ install: 'node native/install.mjs', prepack: 'node native/prebuild.mjs', 'build:addon': 'node native/build.mjs' });
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
