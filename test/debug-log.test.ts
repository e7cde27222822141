/**
 * DEBUG=rankflow (and NODE_DEBUG=rankflow) logs the library's own life, not only the CLI's: a group's
 * creation with its backend, memory kind and addon build, each rank's transitions (left out with
 * -rankflow:transitions), a wait that takes long while it lasts and when it ends, a failure with its
 * cause, the destroy; and nothing at all without the switch. Judged on a child process's stderr.
 */
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { beforeAll, describe, expect, test } from 'vitest';
import { ensureCompiled, repoRoot } from './helpers/children.js';

const run = promisify(execFile);
const script = join(repoRoot, 'test', 'fixtures', 'debug-log-run.mjs');

async function life(env: Record<string, string>): Promise<{ stdout: string; lines: string[] }> {
  const base = { ...process.env };
  delete base.DEBUG;
  delete base.NODE_DEBUG;
  const { stdout, stderr } = await run(process.execPath, [script], { cwd: repoRoot, env: { ...base, ...env }, timeout: 60_000 });
  return { stdout, lines: stderr.split('\n').filter((l) => /^RANKFLOW \d+: /.test(l)).map((l) => l.replace(/^RANKFLOW \d+: /, '')) };
}

beforeAll(() => {
  ensureCompiled('dist/actors/index.js', ['actors/observe/debug-log.ts', 'actors/group.ts']);
});

describe('the debug log of a group', () => {
  test('DEBUG=rankflow: creation, transitions, the slow wait, the failure and the destroy, in that order', async () => {
    const { stdout, lines } = await life({ DEBUG: 'rankflow' });
    expect(stdout).toBe('barrier after terminate: RANK_FAILED\ndone\n');
    const at = (re: RegExp): number => {
      const i = lines.findIndex((l) => re.test(l));
      expect(i, `a line matching ${re}`).toBeGreaterThanOrEqual(0);
      return i;
    };
    const g = 'group [0-9a-f]{8}: ';
    const order = [
      at(new RegExp(`^${g}creating 2 rank\\(s\\) on backend host; buffer \\{"maxTokensPerRank":4,"hidden":128,"topk":2,"numExperts":8\\}; addon: source build .*rankflow\\.node$`)),
      at(new RegExp(`^${g}rank 0: init -> registerWindow \\(REGISTER\\)`)),
      at(new RegExp(`^${g}ready in \\d+\\.\\d+ s: memory gpu, \\d+ symmetric bytes per rank \\(buffer \\d+, host segment 0\\)$`)),
      at(new RegExp(`^${g}rank 1: ready -> barrier \\(BARRIER\\) seq 2$`)),
      at(new RegExp(`^${g}rank 1 has been in barrier for 1\\.\\d\\d s$`)),
      at(new RegExp(`^${g}rank 1 left barrier after 1\\.\\d\\d s \\(DONE -> ready\\)$`)),
      at(new RegExp(`^${g}rank 1 failed: RANK_FAILED rank 1 was terminated in state ready$`)),
      // Its peer fails with it (fail-fast), naming the rank that failed first.
      at(new RegExp(`^${g}rank 0 failed: RANK_FAILED rank 1 failed: rank 1 was terminated`)),
      at(new RegExp(`^${g}destroyed, \\d+\\.\\d+ s after creation; states: destroyed, destroyed$`)),
    ];
    expect([...order].sort((a, b) => a - b)).toEqual(order);
    // Rank 0 slept outside the barrier: it never waited long in it.
    expect(lines.filter((l) => /rank 0 has been in/.test(l))).toEqual([]);
  }, 60_000);

  test('NODE_DEBUG=rankflow writes the same lines; DEBUG=rankflow,-rankflow:transitions leaves out the transitions only', async () => {
    const node = await life({ NODE_DEBUG: 'rankflow' });
    expect(node.lines.some((l) => / rank 1: ready -> barrier \(BARRIER\)/.test(l))).toBe(true);
    expect(node.lines.some((l) => / rank 1 has been in barrier for /.test(l))).toBe(true);
    const quiet = await life({ DEBUG: 'rankflow,-rankflow:transitions' });
    expect(quiet.lines.filter((l) => / -> /.test(l) && !/left/.test(l))).toEqual([]);
    expect(quiet.lines.some((l) => /: creating 2 rank\(s\)/.test(l))).toBe(true);
    expect(quiet.lines.some((l) => / rank 1 failed: RANK_FAILED/.test(l))).toBe(true);
    expect(quiet.lines.some((l) => /: destroyed, /.test(l))).toBe(true);
  }, 60_000);

  test('without the switch, nothing', async () => {
    const { stdout, lines } = await life({});
    expect(stdout).toBe('barrier after terminate: RANK_FAILED\ndone\n');
    expect(lines).toEqual([]);
  }, 60_000);
});
