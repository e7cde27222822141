/**
 * examples/ says true things: README's "Using it" program is examples/moe-step.mjs, verbatim; it
 * type-checks against the package (as JavaScript, checkJs) and runs to its own check's 'ok' on the
 * host backend. The interop addon's sources are built and run on GPUs (test/gpu/interop.test.mjs).
 */
import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { beforeAll, describe, expect, test } from 'vitest';
import { ensureCompiled, repoRoot } from './helpers/children.js';
import { typeCheck } from './helpers/typecheck.js';

const run = promisify(execFile);
const file = join(repoRoot, 'examples', 'moe-step.mjs');

beforeAll(() => {
  ensureCompiled('dist/actors/index.js', ['actors/index.ts', 'actors/group.ts', 'actors/ranks.ts', 'actors/startup.ts', 'actors/options.ts']);
});

describe('examples/moe-step.mjs', () => {
  test("is README's \"Using it\" program, verbatim", async () => {
    const readme = await readFile(join(repoRoot, 'README.md'), 'utf8');
    const section = readme.slice(readme.indexOf('\n## Using it\n'));
    const block = /^```js\n([\s\S]*?)^```$/m.exec(section);
    expect(block?.[1]).toBe(await readFile(file, 'utf8'));
  });

  test('type-checks against the package', () => {
    expect(typeCheck([file], repoRoot, { allowJs: true, checkJs: true })).toEqual([]);
  }, 60_000);

  test('runs on the host backend: allGather, dispatch + combine equal to the dense step, session; exit code 0', async () => {
    const { stdout } = await run(process.execPath, [file], { cwd: repoRoot, timeout: 60_000 });
    const lines = stdout.trim().split('\n');
    expect(lines[0]).toBe('allGather: [ 8 ] 0 0 1 10 2 20 3 30');
    expect(lines[1]).toMatch(/^dispatch: \d+, \d+, \d+, \d+ rows received; combine: max \|error\| 0\.00\d\d vs dense$/);
    expect(lines[2]).toBe('session: 1 2 3 4 | 10 10');
    expect(lines[3]).toMatch(/^ok: 4 ranks on 'host', \d+ transitions, destroyed destroyed destroyed destroyed$/);
  }, 60_000);
});
