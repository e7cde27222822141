/** The package's version, as `rankflow --version` and `rankflow doctor` print it: read from its package.json. */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { PACKAGE_ROOT } from '../core/config.js';

let cached: string | undefined;

export function packageVersion(): string {
    cached ??= String((JSON.parse(readFileSync(join(PACKAGE_ROOT, 'package.json'), 'utf8')) as { version?: unknown }).version);
    return cached;
}
