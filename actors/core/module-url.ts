// group.run's module: a URL or an absolute path, checked on the main thread before any rank moves. A
// relative path would be resolved by each rank's worker against the process's working directory (not
// against the caller's file), and a missing file would fail there with an error naming the worker's
// own file: so both are EINVAL here, saying what to pass instead.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { describe, invalid } from './errors.js';

const HOW = "pass a URL (new URL('./program.mjs', import.meta.url)) or an absolute path";

/** The module's URL as the workers import it: file: (the file exists) or data:. */
export function checkModuleUrl(name: string, v: unknown): string {
  let url: URL;
  if (v instanceof URL) url = v;
  else if (typeof v === 'string' && path.isAbsolute(v)) url = pathToFileURL(v);
  else if (typeof v === 'string' && /^[a-z][a-z\d+.-]+:/i.test(v)) {
    try {
      url = new URL(v);
    } catch {
      throw invalid(name, `${describe(v)} is not a valid URL: ${HOW}`);
    }
  } else if (typeof v === 'string') {
    throw invalid(name, `${describe(v)} is a relative path, which the ranks' workers would resolve against the working directory (${process.cwd()}): ${HOW}`);
  } else {
    throw invalid(name, `must be a URL or an absolute path (got ${describe(v)})`);
  }
  if (url.protocol === 'data:') return url.href;
  if (url.protocol !== 'file:') throw invalid(name, `${url.protocol} URLs cannot be loaded by the ranks' workers: ${HOW}`);
  const file = fileURLToPath(url);
  if (!existsSync(file)) throw invalid(name, `there is no file at ${file}`);
  return url.href;
}
