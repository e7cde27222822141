/**
 * The `rankflow` command: one entry, one parser. Each command (demo.ts, inspect.ts, doctor.ts,
 * bench.ts) declares its options; node:util parseArgs reads them here, strictly, and the command's
 * own checks run before it starts anything. Exit codes: 0 done, 1 the work failed, 2 a usage error
 * (the message and the usage line on stderr).
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
    const width = Math.max(...COMMANDS.map((c) => c.name.length), '--version'.length) + 3;
    return [
        'usage: rankflow <command> [options]      (rankflow <command> --help for its options)',
        ...COMMANDS.map((c) => `  ${c.name.padEnd(width)}${c.summary}`),
        `  ${'--version'.padEnd(width)}print the version`
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
        io.out(packageVersion());
        return 0;
    }
    if (name === undefined) {
        io.err(usage());
        return 2;
    }
    if (name === 'help' || name === '--help' || name === '-h') {
        const topic = COMMANDS.find((c) => c.name === rest[0]);
        io.out(topic ? commandHelp(topic) : usage());
        return 0;
    }
    const command = COMMANDS.find((c) => c.name === name);
    if (!command) {
        io.err(`rankflow: unknown command '${name}'`);
        io.err(usage());
        return 2;
    }

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
