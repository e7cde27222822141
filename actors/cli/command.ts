/**
 * What a `rankflow` command is: its name, usage, the options main.ts's one parser reads for it
 * (node:util parseArgs), and the function that runs it once they are parsed. Also the checks
 * that turn a parsed string into a number or a choice, failing as a usage error (exit 2) that
 * names the flag: main.ts runs every command's checks before the command starts anything.
 */
import type { ParseArgsConfig } from 'node:util';
import type { GroupObserver } from '../observe/observer.js';
import type { DemoSettings } from './demo.js';

export type OptionSpec = NonNullable<ParseArgsConfig['options']>;

/** What parseArgs hands back for a command's options. */
export type OptionValues = Record<string, string | boolean | undefined>;

/** Where a command prints: a line at a time. */
export interface CliIo {
    out(line: string): void;
    err(line: string): void;
}

/** What the demo is handed: its settings, and the observers to attach before its ranks start. */
export interface DemoRun {
    settings: DemoSettings;
    /**
     * Each must be attached as soon as the group exists and before its ranks start (createGroup
     * does this for its `observers`), or the page and the timeline miss the start-up.
     */
    observers: GroupObserver[];
    io: CliIo;
}

export type RunDemo = (run: DemoRun) => Promise<unknown>;

/** What main() may be given besides argv; tests use it, the `rankflow` binary passes nothing. */
export interface CliContext extends Partial<CliIo> {
    /** The demo that `demo` and `inspect` run; default the real one (demo.ts#runDemo). */
    runDemo?: RunDemo;
    /**
     * Ends `inspect`'s wait after the demo (as Ctrl-C does). Without it the page stays up until
     * SIGINT or SIGTERM, so it can still be looked at after the run.
     */
    signal?: AbortSignal;
}

export type CommandContext = CliContext & CliIo;

export interface Command {
    name: string;
    /** One line for `rankflow --help`. */
    summary: string;
    /** The usage line, printed with every usage error: `usage: rankflow demo [--ranks N] ...`. */
    usage: string;
    /** What `rankflow <name> --help` prints below the usage: a line per option. */
    details: string;
    options: OptionSpec;
    /** Resolves to the exit code; throws UsageError for a flag whose value is wrong. */
    run(values: OptionValues, context: CommandContext): Promise<number>;
}

/** A flag that is there but wrong: main prints the message and the usage line and exits 2. */
export class UsageError extends Error {
    override name = 'UsageError';
}

/** `--name` as an integer in [min, max], or `fallback` when it is absent. */
export function intFlag(values: OptionValues, name: string, fallback: number, min = 1, max = Number.MAX_SAFE_INTEGER): number {
    const text = values[name];
    if (text === undefined) return fallback;
    const value = typeof text === 'string' && /^\s*-?\d+\s*$/.test(text) ? Number(text) : NaN;
    if (!Number.isSafeInteger(value) || value < min || value > max) {
        const range = max === Number.MAX_SAFE_INTEGER ? `>= ${min}` : `in [${min}, ${max}]`;
        throw new UsageError(`--${name} must be an integer ${range}, got '${String(text)}'`);
    }
    return value;
}

/** `--name` as one of `choices`, or `fallback` when it is absent. */
export function choiceFlag<T extends string>(values: OptionValues, name: string, choices: readonly T[], fallback: T): T {
    const text = values[name];
    if (text === undefined) return fallback;
    if (!choices.includes(text as T)) throw new UsageError(`--${name} must be one of ${choices.join(', ')}, got '${String(text)}'`);
    return text as T;
}

/** `--name` as a non-empty string (a path), or undefined when it is absent. */
export function pathFlag(values: OptionValues, name: string): string | undefined {
    const text = values[name];
    if (text === undefined) return undefined;
    if (typeof text !== 'string' || text === '') throw new UsageError(`--${name} needs a file name`);
    return text;
}
