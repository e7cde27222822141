/**
 * README.md and docs/ say true things, and every code block in them is checked:
 * - docs/inspector.md: each ```ts example type-checks against the built package (imported by its
 *   name, 'rankflow', as a user would) and runs, in order, in one scratch folder, so a later example
 *   can read what an earlier one wrote;
 * - docs/api.md and README.md: their ```ts examples (each named by its `// file:` line) type-check
 *   together, and their drivers run their rank programs on the host backend (the cuda programs need a
 *   GPU: they only type-check); README's ```js program is examples/moe-step.mjs (examples.test.ts runs it);
 * - docs/scale-out.md: its world example runs as the two processes it describes;
 * - every ```sh line is a command the package has (a `rankflow` command and flags its parser takes,
 *   an npm script, a file that exists), and README's ```text block is what the demo prints;
 * - a block of any other kind is an error, so a new block cannot go unchecked.
 * Also: their links lead to files the package ships, the paths they name exist, README names files the
 * package lacks only where it points at the repository's results, and the two result folders'
 * indexes name exactly the files there.
 */
import { execFile, spawn } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, posix } from 'node:path';
import { parseArgs } from 'node:util';
import { promisify } from 'node:util';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { COMMANDS } from '../actors/cli/main.js';
import { ensureCompiled, freePort, repoRoot } from './helpers/children.js';
import { typeCheck } from './helpers/typecheck.js';

const run = promisify(execFile);

/** The fenced blocks of a markdown file, in order, with their language and first line. */
function fenced(markdown: string): Array<{ lang: string; code: string; line: number }> {
    return [...markdown.matchAll(/^```(\w*)\n([\s\S]*?)^```$/gm)].map((m) => ({ lang: m[1]!, code: m[2]!, line: markdown.slice(0, m.index).split('\n').length }));
}

/** The ```ts blocks of a markdown file, in order. */
function examples(markdown: string): string[] {
    return fenced(markdown).filter((b) => b.lang === 'ts').map((b) => b.code);
}

/** TypeScript as the examples' users run it: compiled for Node 20 (ES2022, so `await using` is rewritten). */
function toJs(code: string): string {
    return ts.transpileModule(code, { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 } }).outputText;
}

/** `// file: NAME.ts` examples of a markdown file. */
function namedExamples(markdown: string): Array<{ name: string | undefined; code: string }> {
    return examples(markdown).map((code) => ({ name: /^\/\/ file: (\S+\.ts)\b/.exec(code)?.[1], code }));
}

const readme = await readFile(join(repoRoot, 'README.md'), 'utf8');
const docNames = readdirSync(join(repoRoot, 'docs')).filter((f) => f.endsWith('.md')).sort();
const docs = new Map<string, string>([['README.md', readme]]);
for (const name of docNames) docs.set(`docs/${name}`, await readFile(join(repoRoot, 'docs', name), 'utf8'));

const doc = docs.get('docs/inspector.md')!;
const blocks = examples(doc);
// Inside the package (build/ is ignored by git), so 'rankflow' resolves to it by its own name.
const dir = join(repoRoot, 'build', 'docs-examples');
let cwd = '';

beforeAll(async () => {
    ensureCompiled('dist/actors/index.js', ['actors/index.ts', 'actors/observe/timeline.ts']);
    await rm(dir, { recursive: true, force: true });
    await mkdir(dir, { recursive: true });
    cwd = await mkdtemp(join(tmpdir(), 'rankflow-docs-'));
    for (const [i, block] of blocks.entries()) await writeFile(join(dir, `example-${i}.ts`), block);
});

afterAll(async () => {
    if (cwd) await rm(cwd, { recursive: true, force: true });
});

describe('docs/inspector.md', () => {
    test('has examples', () => {
        expect(blocks.length).toBeGreaterThanOrEqual(4);
    });

    test('every example type-checks against the package', () => {
        const files = blocks.map((_, i) => join(dir, `example-${i}.ts`));
        expect(typeCheck(files, dir)).toEqual([]);
    }, 60_000);

    test('every example runs, in order', async () => {
        for (const [i, block] of blocks.entries()) {
            const js = toJs(block);
            const file = join(dir, `example-${i}.mjs`);
            await writeFile(file, js);
            const { stdout } = await run(process.execPath, [file], { cwd, timeout: 60_000 });
            expect(typeof stdout).toBe('string');
        }
        // What the timeline example wrote, and what the one after it drew from that.
        for (const name of ['run.svg', 'run.json', 'run.trace.json', 'again.svg']) expect(existsSync(join(cwd, name))).toBe(true);
        const trace = JSON.parse(await readFile(join(cwd, 'run.trace.json'), 'utf8')) as { traceEvents: Array<{ ph: string }> };
        expect(trace.traceEvents.some((e) => e.ph === 'X')).toBe(true);
        expect(await readFile(join(cwd, 'again.svg'), 'utf8')).toMatch(/^<svg /);
    }, 120_000);
});

const api = docs.get('docs/api.md')!;

describe('docs/api.md', () => {
    const named = namedExamples(api);
    const apiDir = join(repoRoot, 'build', 'docs-api');

    beforeAll(async () => {
        ensureCompiled('dist/workers/program.d.ts', ['actors/index.ts', 'workers/program.ts', 'workers/interop.ts']);
        await rm(apiDir, { recursive: true, force: true });
        await mkdir(apiDir, { recursive: true });
        for (const { name, code } of named) if (name) await writeFile(join(apiDir, name), code);
    });

    test('names every example, among them a rank program, its driver and a cuda interop program', () => {
        expect(named.map((n) => n.name)).toEqual(['program.ts', 'main.ts', 'interop-program.ts']);
    });

    test('every example type-checks against the package', () => {
        expect(typeCheck(named.map((n) => join(apiDir, n.name!)), apiDir)).toEqual([]);
    }, 60_000);

    test('the driver runs the rank program on the host backend', async () => {
        for (const name of ['program', 'main']) {
            const js = toJs(await readFile(join(apiDir, `${name}.ts`), 'utf8'));
            await writeFile(join(apiDir, `${name}.js`), js);
        }
        const { stdout } = await run(process.execPath, [join(apiDir, 'main.js')], { cwd: apiDir, timeout: 60_000 });
        const lines = stdout.trim().split('\n');
        expect(lines).toHaveLength(3);
        expect(lines[0]).toMatch(/^rank 0 on host: received \d+ rows; every rank's: \d+, \d+$/);
        expect(lines[1]).toMatch(/^rank 1 on host: received \d+ rows; every rank's: \d+, \d+$/);
        expect(lines[2]).toBe('tensors: has 0 entries; the group has 2 ranks');
    }, 60_000);
});

describe('docs/api.md covers the package', () => {
    test("names every export of 'rankflow'", async () => {
        const index = await readFile(join(repoRoot, 'actors', 'index.ts'), 'utf8');
        const names = [...index.matchAll(/^export (?:type )?\{([^}]*)\}/gm)].flatMap((m) => m[1]!.split(',').map((n) => n.trim()).filter(Boolean));
        expect(names.length).toBeGreaterThan(40);
        expect(names.filter((n) => !api.includes(`\`${n}\``))).toEqual([]);
    });

    test('names every public member of Group, Session, RankHandle, DeviceTensor and the rank-program handle', async () => {
        const dir = join(repoRoot, 'build', 'docs-members');
        await mkdir(dir, { recursive: true });
        const file = join(dir, 'members.ts');
        await writeFile(file, [
            "import type { DeviceTensor, Group, RankHandle, RankProgramHandle, Session } from 'rankflow';",
            "export declare const members: [Group, Session, RankHandle, DeviceTensor, RankProgramHandle<'cuda'>, RankProgramHandle<'host'>];",
            '',
        ].join('\n'));
        const program = ts.createProgram([file], { module: ts.ModuleKind.NodeNext, moduleResolution: ts.ModuleResolutionKind.NodeNext, target: ts.ScriptTarget.ES2022, strict: true, noEmit: true, skipLibCheck: true, types: ['node'] });
        const checker = program.getTypeChecker();
        const source = program.getSourceFile(file)!;
        const decl = source.statements.find(ts.isVariableStatement)!.declarationList.declarations[0]!;
        const tuple = checker.getTypeAtLocation(decl) as ts.TypeReference;
        const missing: string[] = [];
        for (const type of checker.getTypeArguments(tuple)) {
            for (const p of checker.getPropertiesOfType(type)) {
                const d = p.declarations?.[0];
                if (!d || d.getSourceFile().fileName.includes('node_modules')) continue;  // EventEmitter's own
                const flags = ts.getCombinedModifierFlags(d);
                if (flags & (ts.ModifierFlags.Private | ts.ModifierFlags.Protected)) continue;
                if (ts.getJSDocTags(d).some((t) => t.tagName.text === 'internal')) continue;
                // Symbol-keyed members (Symbol.asyncDispose, Symbol.dispose) are named by their symbol
                const symbol = /^__@(\w+)@\d+$/.exec(p.name);
                if (symbol) {
                    if (!api.includes(`Symbol.${symbol[1]}`)) missing.push(`${checker.typeToString(type).slice(0, 40)}[Symbol.${symbol[1]}]`);
                    continue;
                }
                if (!api.includes(`\`${p.name}`) && !api.includes(`${p.name}(`)) missing.push(`${checker.typeToString(type).slice(0, 40)}.${p.name}`);
            }
        }
        expect(missing).toEqual([]);
    }, 60_000);
});

describe("README's examples", () => {
    const named = namedExamples(readme);
    const dir = join(repoRoot, 'build', 'docs-readme');

    beforeAll(async () => {
        ensureCompiled('dist/workers/program.d.ts', ['actors/index.ts', 'workers/program.ts', 'workers/session-views.ts']);
        await rm(dir, { recursive: true, force: true });
        await mkdir(dir, { recursive: true });
        for (const { name, code } of named) if (name) await writeFile(join(dir, name), code);
    });

    test('names every example: a rank program, the driver that runs it, a cuda program', () => {
        expect(named.map((n) => n.name)).toEqual(['program.ts', 'main.ts', 'cuda-program.ts']);
    });

    test('every example type-checks against the package', () => {
        expect(typeCheck(named.map((n) => join(dir, n.name!)), dir)).toEqual([]);
    }, 60_000);

    test('the driver, compiled for Node 20 (await using included), runs the rank program on the host backend', async () => {
        for (const name of ['program', 'main']) await writeFile(join(dir, `${name}.js`), toJs(await readFile(join(dir, `${name}.ts`), 'utf8')));
        const { stdout } = await run(process.execPath, [join(dir, 'main.js')], { cwd: dir, timeout: 60_000 });
        // n = 4 on 2 ranks: every rank sums 4 x (1 + 2).
        expect(stdout.trim()).toBe('sums: 12 12');
    }, 60_000);

    test('shows `await using` only in TypeScript, which tsc compiles for the Node 20 that cannot parse it', () => {
        const js = [...docs].flatMap(([file, md]) => fenced(md).filter((b) => b.lang === 'js' && /\bawait using\b|^\s*using\s+\w+\s*=/m.test(b.code)).map((b) => `${file}:${b.line}`));
        expect(js).toEqual([]);
    });
});

describe('docs/scale-out.md', () => {
    const [world, ...more] = examples(docs.get('docs/scale-out.md')!);
    const dir = join(repoRoot, 'build', 'docs-scale-out');

    test('its world example runs as the two processes it describes', async () => {
        expect(more).toEqual([]);
        ensureCompiled('dist/actors/world/join.js', ['actors/index.ts', 'actors/startup.ts', 'actors/world/join.ts']);
        await rm(dir, { recursive: true, force: true });
        await mkdir(dir, { recursive: true });
        await writeFile(join(dir, 'world.ts'), world!);
        expect(typeCheck([join(dir, 'world.ts')], dir)).toEqual([]);
        await writeFile(join(dir, 'world.js'), toJs(world!));
        const port = String(await freePort());
        const env = { ...process.env, RANKFLOW_WORLD_TOKEN: 'docs-test-token-0123456789abcdef' };
        const outputs = await Promise.all([0, 1].map((k) => run(process.execPath, [join(dir, 'world.js'), String(k), port], { cwd: dir, env, timeout: 60_000 })));
        expect(outputs.map((o) => o.stdout.trim())).toEqual([
            'process 0: local ranks 0, 1 of 4; gathered 0 1 2 3',
            'process 1: local ranks 2, 3 of 4; gathered 0 1 2 3',
        ]);
    }, 90_000);
});

/** Why a shell line is not a command the package has, or undefined when it is. */
function shellProblem(line: string, scripts: Record<string, string>): string | undefined {
    const words = line.trim().split(/\s+/).map((w) => w.replace(/^"(.*)"$/, '$1'));
    while (/^[A-Z_][A-Z0-9_]*=/.test(words[0] ?? '')) words.shift();   // VAR=value prefixes
    const [tool, ...args] = words;
    const rankflowArgs = (argv: string[]): string | undefined => {
        const [name, ...rest] = argv;
        const command = COMMANDS.find((c) => c.name === name);
        if (!command) return `no rankflow command '${name}'`;
        try {
            parseArgs({ args: rest, options: { ...command.options, help: { type: 'boolean', short: 'h' } }, strict: true, allowPositionals: false });
        } catch (error) {
            return (error as Error).message;
        }
        return undefined;
    };
    if (tool === 'npx' && args[0] === 'rankflow') return rankflowArgs(args.slice(1));
    if (tool === 'node' && args[0] === 'bin/rankflow.js') return rankflowArgs(args.slice(1));
    if (tool === 'node') {
        const file = args.find((a) => !a.startsWith('-'))!;
        const source = file.startsWith('dist/') ? file.slice(5).replace(/\.js$/, '.ts') : file;
        return existsSync(join(repoRoot, source)) ? undefined : `no file ${file}`;
    }
    if (tool === 'npm' && args[0] === 'run') {
        const script = scripts[args[1]!];
        if (!script) return `no npm script '${args[1]}'`;
        const extra = args.indexOf('--');
        return extra > 0 && script.startsWith('node bin/rankflow.js ') ? rankflowArgs([...script.split(' ').slice(2), ...args.slice(extra + 1)]) : undefined;
    }
    if (tool === 'npm' && ['install', 'ci', 'test', 'pack'].includes(args[0]!)) return undefined;
    // npm's own flags (--foreground-scripts) change how a rebuild shows, not what it is
    if ((tool === 'npm' || tool === 'pnpm') && args.filter((a) => !a.startsWith('--')).join(' ') === 'rebuild rankflow') return undefined;
    if (tool === 'pnpm' && args.join(' ') === 'approve-builds') return undefined;
    if (tool === 'npx' && args[0] === 'cmake-js') return `cmake-js ${args.slice(1).join(' ')}`.startsWith(scripts.install!) ? undefined : `not the install script's build: ${line}`;
    return `a command the docs test does not know: ${line}`;
}

describe('shell commands in README.md and docs/', () => {
    test('each is a command the package has: a rankflow command with flags it takes, an npm script, a file there', async () => {
        const { scripts } = JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
        const lines = [...docs].flatMap(([file, md]) => fenced(md).filter((b) => b.lang === 'sh').flatMap((b) =>
            b.code.split('\n').map((l) => l.replace(/\s#.*$/, '').trim()).filter(Boolean).flatMap((l) => l.split('&&')).map((command) => ({ where: `${file}:${b.line}`, command }))));
        expect(lines.length).toBeGreaterThan(10);
        expect(lines.map((l) => ({ ...l, problem: shellProblem(l.command, scripts) })).filter((l) => l.problem)).toEqual([]);
    });

    test('the checker refuses what the package does not have', () => {
        const scripts = { demo: 'node bin/rankflow.js demo', install: 'cmake-js compile --directory native --out build/native' };
        expect(shellProblem('npx rankflow demo --tokenz 5', scripts)).toMatch(/tokenz/);
        expect(shellProblem('npx rankflow deploy', scripts)).toMatch(/no rankflow command/);
        expect(shellProblem('npm run bench', scripts)).toMatch(/no npm script/);
        expect(shellProblem('npm run demo -- --rounds', scripts)).toMatch(/rounds/);
        expect(shellProblem('node dist/bench/nothing.js', scripts)).toMatch(/no file/);
        expect(shellProblem('curl https://example.com | sh', scripts)).toMatch(/does not know/);
    });
});

describe("README's demo output", () => {
    test('is what `rankflow demo --quiet --rounds 3` prints, the elided times aside', async () => {
        const block = fenced(readme).filter((b) => b.lang === 'text');
        expect(block).toHaveLength(1);
        ensureCompiled('dist/actors/cli/main.js', ['actors/cli/main.ts', 'actors/cli/demo.ts']);
        const { stdout } = await run(process.execPath, [join(repoRoot, 'bin', 'rankflow.js'), 'demo', '--quiet', '--rounds', '3'], {
            cwd: repoRoot, timeout: 60_000, env: { ...process.env, RANKFLOW_BACKEND: 'host', DEBUG: '', NODE_DEBUG: '' },
        });
        const expected = block[0]!.code.trimEnd().split('\n');
        const printed = stdout.trimEnd().split('\n');
        expect(printed).toHaveLength(expected.length);
        printed.forEach((line, i) => {
            const pattern = expected[i]!.replace(/[.*+?^${}()|[\]\\]/g, '\\$&').replace(/…/g, '[0-9.]+');
            expect(line).toMatch(new RegExp(`^${pattern}$`));
        });
    }, 60_000);
});

describe('every code block in README.md and docs/', () => {
    test('is one that a test above checks', async () => {
        const moeStep = await readFile(join(repoRoot, 'examples', 'moe-step.mjs'), 'utf8');
        const checked = (file: string, b: { lang: string; code: string }): boolean => {
            if (b.lang === 'sh') return true;                                       // the shell commands
            if (file === 'README.md' && b.lang === 'text') return true;             // the demo's output
            if (file === 'README.md' && b.lang === 'js') return b.code === moeStep; // examples.test.ts runs it
            if (b.lang !== 'ts') return false;
            if (file === 'README.md' || file === 'docs/api.md') return /^\/\/ file: \S+\.ts\b/.test(b.code);
            return file === 'docs/inspector.md' || file === 'docs/scale-out.md';
        };
        const unchecked = [...docs].flatMap(([file, md]) => fenced(md).filter((b) => !checked(file, b)).map((b) => `${file}:${b.line} (${b.lang || 'no language'})`));
        expect(unchecked).toEqual([]);
    });
});

/** `a{1..3}b` -> a1b, a2b, a3b; other names as they are. */
function expandBraces(name: string): string[] {
    const m = /\{(\d+)\.\.(\d+)\}/.exec(name);
    if (!m) return [name];
    const out: string[] = [];
    for (let i = Number(m[1]); i <= Number(m[2]); i++) out.push(...expandBraces(name.replace(m[0], String(i))));
    return out;
}

/** Repository paths a markdown file names in code spans (`bench/results/x.json`, `native/src/...`). */
function namedPaths(md: string): string[] {
    return [...md.matchAll(/`((?:actors|workers|machines|native|kernels|bench|test|docs|examples|bin|dist)\/[\w./{}-]+)`/g)].flatMap((m) => expandBraces(m[1]!.replace(/\/$/, '')));
}

/** Relative link and image targets of a markdown file, resolved against it. */
function linkTargets(file: string, md: string): string[] {
    return [...md.matchAll(/\]\(([^)#\s]+)(?:#[^)]*)?\)/g)].map((m) => m[1]!).filter((l) => !/^[a-z]+:/.test(l)).map((l) => posix.normalize(posix.join(posix.dirname(file), l)).replace(/\/$/, ''));
}

describe('README.md and docs/ name what exists', () => {
    let shipped: string[] = [];

    beforeAll(async () => {
        ensureCompiled('dist/actors/index.js', ['actors/index.ts']);
        // --ignore-scripts: packing would run `prepare` (tsc) again.
        const { stdout } = await run('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: repoRoot, maxBuffer: 16 << 20 });
        shipped = (JSON.parse(stdout) as Array<{ files: Array<{ path: string }> }>)[0]!.files.map((f) => f.path);
    }, 60_000);

    test('README stays a user\'s document: at most 400 lines', () => {
        expect(readme.split('\n').length).toBeLessThanOrEqual(400);
    });

    test('every link leads to a file (or folder) the package ships', () => {
        const inTarball = (p: string) => shipped.includes(p) || shipped.some((f) => f.startsWith(`${p}/`));
        const links = [...docs].flatMap(([file, md]) => linkTargets(file, md).map((target) => ({ file, target })));
        expect(links.length).toBeGreaterThan(15);
        expect(links.filter((l) => !inTarball(l.target))).toEqual([]);
    });

    test('every path they name is in the repository (dist/ paths by their sources)', () => {
        const source = (p: string) => (p.startsWith('dist/') ? p.slice(5).replace(/\.js$/, '.ts') : p);
        const named = [...docs].flatMap(([file, md]) => namedPaths(md).map((path) => ({ file, path })));
        expect(named.length).toBeGreaterThan(40);
        expect(named.filter((n) => !existsSync(join(repoRoot, source(n.path))))).toEqual([]);
    });

    test('README names a file the package lacks only in "Tests and benchmarks", and only a committed result or GPU log', () => {
        const start = readme.indexOf('\n## Tests and benchmarks\n');
        const end = readme.indexOf('\n## ', start + 1);
        expect(start).toBeGreaterThan(0);
        const lacking = (md: string) => namedPaths(md).filter((p) => !shipped.includes(p) && !shipped.some((f) => f.startsWith(`${p}/`)));
        expect(lacking(readme.slice(0, start) + readme.slice(end))).toEqual([]);
        const results = lacking(readme.slice(start, end));
        expect(results.length).toBeGreaterThan(3);
        expect(results.filter((p) => !/^(bench\/results|test\/gpu\/logs)\/[^/]+$/.test(p))).toEqual([]);
    });
});

describe('the indexes of bench/results and test/gpu/logs', () => {
    test.each(['bench/results', 'test/gpu/logs'])('%s/README.md names every file there, and only those', async (folder) => {
        const index = await readFile(join(repoRoot, folder, 'README.md'), 'utf8');
        const files = readdirSync(join(repoRoot, folder)).filter((f) => f !== 'README.md').sort();
        const named = [...new Set([...index.matchAll(/`([\w.{}-]+\.(?:json|log|md|txt))`/g)].flatMap((m) => expandBraces(m[1]!)))].sort();
        expect(files.length).toBeGreaterThan(2);
        expect(named).toEqual(files);
    });
});
