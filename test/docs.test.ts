/**
 * docs/inspector.md says true things: each of its ```ts examples type-checks against the built
 * package (imported by its name, 'rankflow', as a user would) and runs, in order, in one scratch
 * folder, so a later example can read what an earlier one wrote. docs/api.md too: its examples
 * (each named by its `// file:` line) type-check together, and its driver program runs its rank
 * program on the host backend.
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { ensureCompiled, repoRoot } from './helpers/children.js';
import { typeCheck } from './helpers/typecheck.js';

const run = promisify(execFile);

/** The ```ts blocks of a markdown file, in order. */
function examples(markdown: string): string[] {
    return [...markdown.matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((m) => m[1]!);
}

const doc = await readFile(join(repoRoot, 'docs', 'inspector.md'), 'utf8');
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
            const js = ts.transpileModule(block, { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 } }).outputText;
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

const api = await readFile(join(repoRoot, 'docs', 'api.md'), 'utf8');

describe('docs/api.md', () => {
    const named = examples(api).map((code) => ({ name: /^\/\/ file: (\S+\.ts)\n/.exec(code)?.[1], code }));
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
            const js = ts.transpileModule(await readFile(join(apiDir, `${name}.ts`), 'utf8'), { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 } }).outputText;
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

describe('README names what exists', () => {
    test('its links and the files it names are in the repository (dist/ paths by their sources)', async () => {
        const readme = await readFile(join(repoRoot, 'README.md'), 'utf8');
        const links = [...readme.matchAll(/\]\(([^)#\s]+)(?:#[^)]*)?\)/g)].map((m) => m[1]!).filter((l) => !/^[a-z]+:/.test(l));
        const named = [...readme.matchAll(/`((?:actors|workers|machines|native|kernels|bench|test|docs|examples|bin|dist)\/[\w./-]+)`/g)].map((m) => m[1]!);
        expect(links.length).toBeGreaterThan(3);
        expect(named.length).toBeGreaterThan(20);
        const source = (p: string) => (p.startsWith('dist/') ? p.slice(5).replace(/\.js$/, '.ts') : p);
        const missing = [...new Set([...links, ...named])].filter((p) => !existsSync(join(repoRoot, source(p))));
        expect(missing).toEqual([]);
    });
});
