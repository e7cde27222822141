/**
 * rankflow's debug log: `debug('format %d', value)` writes `RANKFLOW <pid>: ...` to stderr when
 * either switch names rankflow, and costs one boolean test when neither does.
 *
 *   NODE_DEBUG=rankflow    node's own switch, through util.debuglog (comma lists, `*` globs)
 *   DEBUG=rankflow         the switch most JavaScript tools read (also `DEBUG=*`, `DEBUG=rankflow*`,
 *                          comma or space lists, `-rankflow` to exclude, as the `debug` package reads it)
 *
 * Both print the same line, so a log reads the same whichever switch turned it on.
 */
import { debuglog, format } from 'node:util';

import { config } from '../core/config.js';

const nodeDebug = debuglog('rankflow');

/** Whether a DEBUG value (actors/core/config.ts reads it) turns on the namespace `name`. */
export function debugEnabledBy(value: string | undefined, name = 'rankflow'): boolean {
    if (!value) return false;
    let enabled = false;
    for (const item of value.split(/[\s,]+/)) {
        if (item === '') continue;
        const exclude = item.startsWith('-');
        const pattern = exclude ? item.slice(1) : item;
        if (!globMatches(pattern, name)) continue;
        if (exclude) return false;
        enabled = true;
    }
    return enabled;
}

function globMatches(pattern: string, name: string): boolean {
    const source = pattern
        .split('*')
        .map((part) => part.replace(/[.+?^${}()|[\]\\]/g, '\\$&'))
        .join('.*');
    return new RegExp(`^${source}$`, 'i').test(name);
}

const fromDebugEnv = debugEnabledBy(config.debug);

/** Whether debug lines are written at all; test it before building an expensive message. */
export const debugEnabled: boolean = nodeDebug.enabled || fromDebugEnv;

/** Writes one debug line (util.format arguments) when NODE_DEBUG or DEBUG names rankflow. */
export function debug(message: string, ...args: unknown[]): void {
    if (nodeDebug.enabled) nodeDebug(message, ...args);
    else if (fromDebugEnv) process.stderr.write(`RANKFLOW ${process.pid}: ${format(message, ...args)}\n`);
}
