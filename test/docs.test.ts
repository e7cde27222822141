/**
 * docs/inspector.md says true things: each of its ```ts examples type-checks against the built
 * package (imported by its name, 'rankflow', as a user would) and runs, in order, in one scratch
 * folder, so a later example can read what an earlier one wrote.
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
        const program = ts.createProgram(files, {
            module: ts.ModuleKind.NodeNext,
            moduleResolution: ts.ModuleResolutionKind.NodeNext,
            target: ts.ScriptTarget.ES2022,
            lib: ['lib.es2022.d.ts'],
            types: ['node'],
            strict: true,
            noEmit: true,
            skipLibCheck: true
        });
        const problems = ts.getPreEmitDiagnostics(program).map((d) => {
            const where = d.file ? `${d.file.fileName.slice(dir.length + 1)}:${d.file.getLineAndCharacterOfPosition(d.start ?? 0).line + 1}` : '';
            return `${where} ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`;
        });
        expect(problems).toEqual([]);
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
