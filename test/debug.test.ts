/**
 * Which DEBUG values turn rankflow's debug log on: names, globs, comma or space lists, and
 * exclusions, as the `debug` package reads them (test/cli.test.ts checks the lines themselves).
 */
import { describe, expect, test } from 'vitest';
import { debugEnabledBy } from '../actors/observe/debug.js';

describe('debugEnabledBy', () => {
    test.each([
        ['rankflow', true],
        ['RANKFLOW', true],
        ['*', true],
        ['rank*', true],
        ['express,rankflow', true],
        ['express rankflow', true],
        [' rankflow , other ', true],
        ['*,-rankflow', false],
        ['-rankflow,rankflow', false],
        ['express', false],
        ['rankflowx', false],
        ['rankflow.*', false],
        ['', false],
        [undefined, false]
    ])('DEBUG=%j -> %s', (value, enabled) => {
        expect(debugEnabledBy(value)).toBe(enabled);
    });
});
