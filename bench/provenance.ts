// What every result file of the benchmarks says of itself: when it was measured, at which commit, on
// which machine, and the command that measured it (the guide's rule for committed results).
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';

import { PACKAGE_ROOT } from '../actors/core/config.js';

/**
 * The commit measured: `given` (a --commit flag), else RANKFLOW_COMMIT (a copy of the tree on another
 * machine may carry a stale .git: the caller's word comes first), else git's HEAD, else 'unknown'.
 */
export function commit(given?: string): string {
  if (given) return given;
  if (process.env.RANKFLOW_COMMIT) return process.env.RANKFLOW_COMMIT;
  try {
    return execFileSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: PACKAGE_ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return 'unknown';
  }
}

/** The machine: host name, CPU count and model, memory. */
export function machine(): string {
  const cpus = os.cpus();
  return `${os.hostname()}: ${cpus.length} x ${cpus[0]?.model ?? 'cpu'}, ${Math.round(os.totalmem() / 2 ** 30)} GiB`;
}

/**
 * This process's command line, the script relative to the package, after the RANKFLOW_ settings that
 * change what is measured (RANKFLOW_COMMIT only names the tree).
 */
export function command(): string {
  const settings = Object.entries(process.env).filter(([k]) => k.startsWith('RANKFLOW_') && k !== 'RANKFLOW_COMMIT').map(([k, v]) => `${k}=${v} `).sort().join('');
  return `${settings}node ${path.relative(PACKAGE_ROOT, process.argv[1] ?? '')} ${process.argv.slice(2).join(' ')}`.trim();
}

/** { date, commit, machine, command, node } for a result file. */
export function provenance(given?: string): { date: string; commit: string; machine: string; command: string; node: string } {
  return { date: new Date().toISOString(), commit: commit(given), machine: machine(), command: command(), node: process.version };
}
