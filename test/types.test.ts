/**
 * The types a user's TypeScript sees (test/types/*.ts, checked against the built declarations):
 * what `rank.tensor()` returns per backend, the interop methods' arguments, and the misuses they
 * refuse (each `@ts-expect-error` there must meet an error, or the check fails).
 */
import { readdirSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { beforeAll, describe, expect, test } from 'vitest';
import { ensureCompiled, repoRoot } from './helpers/children.js';
import { typeCheck } from './helpers/typecheck.js';

const dir = join(repoRoot, 'test', 'types');

beforeAll(() => {
  ensureCompiled('dist/workers/program.d.ts', ['workers/program.ts', 'workers/interop.ts', 'actors/core/device-tensor.ts', 'actors/index.ts']);
});

describe('the rank-program types', () => {
  test('test/types/*.ts type-check, every misuse marked in them refused', () => {
    const files = readdirSync(dir).filter((f) => f.endsWith('.ts')).map((f) => join(dir, f));
    expect(files.length).toBeGreaterThan(0);
    expect(typeCheck(files, repoRoot)).toEqual([]);
  }, 60_000);

  test('a misuse that is not marked is reported', async () => {
    // So the check above can fail: host data read from a cuda rank's tensor, unmarked.
    const scratch = join(repoRoot, 'build', 'types-check');
    await mkdir(scratch, { recursive: true });
    const file = join(scratch, 'misuse.ts');
    await writeFile(file, [
      "import type { RankProgramHandle } from 'rankflow';",
      "export const f = (rank: RankProgramHandle<'cuda'>) => rank.tensor('bf16', [1]).data;",
      '',
    ].join('\n'));
    const problems = typeCheck([file], repoRoot);
    expect(problems).toEqual([expect.stringMatching(/misuse\.ts:2 Property 'data' does not exist on type 'DeviceTensor<"bf16">'/)]);
  }, 60_000);
});
