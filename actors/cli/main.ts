/**
 * The `rankflow` command: one entry, one parser. Each command (demo.ts, inspect.ts, doctor.ts,
 * bench.ts) declares its options; node:util parseArgs reads them here, strictly, and the command's
 * own checks run before it starts anything. Exit codes: 0 done, 1 the work failed, 2 a usage error
 * (the message and the usage line on stderr), 128 + n when signal n stopped it (inspect: 130 for Ctrl-C).
 * Short flags: -h and -v here, each command's own in its options (-r for --ranks, ...).
 */
import { parseArgs } from 'node:util';
import { debug } from '../observe/debug.js';
import { benchCommand } from './bench.js';
import { UsageError, type CliContext, type CliIo, type Command } from './command.js';
import { demoCommand } from './demo.js';
import { doctorCommand } from './doctor.js';
import { inspectCommand } from './inspect.js';
import { packageVersion } from './version.js';

export const COMMANDS: readonly Command[] = [demoCommand, inspectCommand, doctorCommand, benchCommand];

/** `rankflow --help`: every command with its one-line summary. */
export function usage(): string {
    const width = Math.max(...COMMANDS.map((c) => c.name.length), '-v, --version'.length) + 3;
    return [
        'usage: rankflow <command> [options]      (rankflow <command> --help for its options)',
        ...COMMANDS.map((c) => `  ${c.name.padEnd(width)}${c.summary}`),
        `  ${'-v, --version'.padEnd(width)}print the version`,
        `  ${'-h, --help'.padEnd(width)}this help; rankflow <command> -h for a command's`
    ].join('\n');
}

/** `rankflow <command> --help`. */
export function commandHelp(command: Command): string {
    return `${command.usage}\n${command.details}`;
}

/** Runs `rankflow ...argv`; resolves to the process's exit code. */
export async function main(argv: string[], context: CliContext = {}): Promise<number> {
    const io: CliIo = {
        out: context.out ?? ((line) => process.stdout.write(`${line}\n`)),
        err: context.err ?? ((line) => process.stderr.write(`${line}\n`))
    };
    const [name, ...rest] = argv;
    debug('cli: %o', argv);
    if (name === '--version' || name === '-v' || name === 'version') {
        if (rest.length > 0) return topUsageError(`${name} takes no arguments (got '${rest.join(' ')}')`, io);
        io.out(packageVersion());
        return 0;
    }
    if (name === undefined) {
        io.err(usage());
        return 2;
    }
    if (name === 'help' || name === '--help' || name === '-h') {
        // `rankflow help [command]`: one topic at most, and one that exists.
        if (rest.length > 1) return topUsageError(`${name} takes at most one command (got '${rest.join(' ')}')`, io);
        const topic = COMMANDS.find((c) => c.name === rest[0]);
        if (rest.length === 1 && !topic) return topUsageError(`unknown command '${rest[0]}'`, io);
        io.out(topic ? commandHelp(topic) : usage());
        return 0;
    }
    const command = COMMANDS.find((c) => c.name === name);
    if (!command) return topUsageError(`unknown ${name.startsWith('-') ? 'option' : 'command'} '${name}'`, io);

    let values: Record<string, string | boolean | undefined>;
    try {
        ({ values } = parseArgs({
            args: rest,
            options: { ...command.options, help: { type: 'boolean', short: 'h' } },
            strict: true,
            allowPositionals: false
        }));
    } catch (error) {
        if (!isParseArgsError(error)) throw error;
        return usageError(command, parseArgsMessage(error), io);
    }
    if (values.help) {
        io.out(commandHelp(command));
        return 0;
    }
    try {
        return await command.run(values, { ...context, ...io });
    } catch (error) {
        if (error instanceof UsageError) return usageError(command, error.message, io);
        throw error;
    }
}

function topUsageError(message: string, io: CliIo): number {
    io.err(`rankflow: ${message}`);
    io.err(usage());
    return 2;
}

function usageError(command: Command, message: string, io: CliIo): number {
    io.err(`rankflow ${command.name}: ${message}`);
    io.err(command.usage);
    return 2;
}

function isParseArgsError(error: unknown): error is Error & { code: string } {
    return typeof (error as { code?: unknown })?.code === 'string' && (error as { code: string }).code.startsWith('ERR_PARSE_ARGS_');
}

/** parseArgs's messages, shortened to what was wrong. */
function parseArgsMessage(error: Error & { code: string }): string {
    const quoted = /'([^']+)'/.exec(error.message)?.[1];
    switch (error.code) {
        case 'ERR_PARSE_ARGS_UNKNOWN_OPTION':
            return quoted ? `unknown option '${quoted}'` : 'unknown option';
        case 'ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL':
            return quoted ? `unexpected argument '${quoted}' (every option is --name value)` : 'unexpected argument';
        default:
            return error.message;
    }
}
