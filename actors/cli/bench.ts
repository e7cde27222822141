/**
 * `rankflow bench`: the package's benchmarks, run as they are: the host bench (bench/host.ts,
 * shipped as dist/bench/host.js) always, and the GPU bench (dist/bench/gpu.js) where the addon's
 * probe finds at least two usable GPUs; elsewhere it says the GPU bench is skipped and why. Each
 * runs as its own node process, its output passed through line by line, and writes its JSON
 * result into `--out`. The flags a bench knows are handed to it; the others are not.
 */
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { probeCuda } from '../core/backend.js';
import { debug } from '../observe/debug.js';
import { UsageError, choiceFlag, intFlag, pathFlag, type CliIo, type Command, type OptionValues } from './command.js';

/** The GPU bench measures collectives between GPUs: one GPU is not enough. */
const MIN_GPUS = 2;

const INT_FLAGS = ['ranks', 'iters', 'warmup', 'tokens', 'hidden', 'topk', 'experts', 'barrier-iters', 'overhead-iters'] as const;
const HOST_FLAGS = ['ranks', 'iters', 'warmup', 'tokens', 'hidden', 'topk', 'experts', 'barrier-iters'];
const GPU_FLAGS = ['ranks', 'iters', 'warmup', 'overhead-iters'];

export const benchCommand: Command = {
    name: 'bench',
    summary: 'the host benchmark, and the GPU benchmark where GPUs are',
    usage:
        'usage: rankflow bench [--only host|gpu] [-o|--out DIR] [-r|--ranks N] [--iters N] [--warmup N] ' +
        '[--tokens N] [--hidden N] [--topk N] [--experts N] [--barrier-iters N] [--sms LIST] [--overhead-iters N] [--world]',
    details: `  Runs dist/bench/host.js, then dist/bench/gpu.js where at least ${MIN_GPUS} GPUs are usable.
  --only host|gpu     run one of them (gpu fails where there are no GPUs)
  -o, --out DIR       where the results (host-<date>.json, gpu-<date>.json) go (default: the current directory)
  -r, --ranks N       host ranks (host default 4); GPUs used (gpu default: all)
  --iters N, --warmup N   timed and warm-up calls, both benches
host bench: --tokens N (512), --hidden N (2048), --topk N (8), --experts N (64), --barrier-iters N (2000)
GPU bench:  --sms LIST (8,16,24,32,48,64,96,132), --overhead-iters N (2000), --world (one process per GPU)`,
    options: {
        only: { type: 'string' },
        out: { type: 'string', short: 'o' },
        ...Object.fromEntries(INT_FLAGS.map((name) => [name, name === 'ranks' ? { type: 'string' as const, short: 'r' } : { type: 'string' as const }])),
        sms: { type: 'string' },
        world: { type: 'boolean' }
    },
    async run(values, context) {
        const only = values.only === undefined ? 'both' : choiceFlag(values, 'only', ['host', 'gpu'] as const, 'host');
        const out = pathFlag(values, 'out') ?? process.cwd();
        for (const name of INT_FLAGS) intFlag(values, name, 0, name === 'warmup' ? 0 : 1);
        if (values.sms !== undefined && !/^\d+(,\d+)*$/.test(String(values.sms))) {
            throw new UsageError(`--sms must be a comma list of SM counts, e.g. 8,24,132; got '${String(values.sms)}'`);
        }

        let code = 0;
        if (only !== 'gpu') {
            code = await runBench('host', ['--out', out, ...forward(values, HOST_FLAGS)], context);
        }
        if (only !== 'host') {
            const why = gpuSkipReason(values);
            if (why) {
                context.out(`GPU bench skipped: ${why}`);
                if (only === 'gpu') return 1;
            } else {
                const gpuArgs = ['--out', out, ...forward(values, GPU_FLAGS)];
                if (typeof values.sms === 'string') gpuArgs.push('--sms', values.sms);
                if (values.world) gpuArgs.push('--world');
                code = Math.max(code, await runBench('gpu', gpuArgs, context));
            }
        }
        return code;
    }
};

/** Why the GPU bench cannot run here, from the probe `rankflow doctor` prints; undefined if it can. */
function gpuSkipReason(values: OptionValues): string | undefined {
    const probe = probeCuda();
    debug('bench: probe available=%s devices=%s', probe.available, probe.devices);
    if (!probe.available) return `no usable GPU (${firstLine(probe.reason ?? 'the CUDA backend is unavailable')}); 'rankflow doctor' says more`;
    const devices = typeof probe.devices === 'number' ? probe.devices : 0;
    const wanted = intFlag(values, 'ranks', Math.max(devices, MIN_GPUS), MIN_GPUS);
    if (devices < wanted) return `it needs ${wanted} GPUs and the driver sees ${devices}`;
    return undefined;
}

function firstLine(text: string): string {
    return text.split(/\s*\(tried:|\n/)[0]!.trim();
}

function forward(values: OptionValues, names: readonly string[]): string[] {
    return names.flatMap((name) => (typeof values[name] === 'string' ? [`--${name}`, values[name] as string] : []));
}

/** Runs dist/bench/<name>.js with `args`, passing its output on; resolves to its exit code. */
function runBench(name: 'host' | 'gpu', args: string[], io: CliIo): Promise<number> {
    // From dist/actors/cli/bench.js to dist/bench/<name>.js: the compiled bench, never a copy.
    const script = fileURLToPath(new URL(`../../bench/${name}.js`, import.meta.url));
    io.out(`rankflow bench: ${name} (${script} ${args.join(' ')})`);
    debug('bench: spawning %s %o', script, args);
    return new Promise((resolve) => {
        const child = spawn(process.execPath, [script, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
        const lines = [createInterface({ input: child.stdout! }), createInterface({ input: child.stderr! })];
        lines[0]!.on('line', (line) => io.out(line));
        lines[1]!.on('line', (line) => io.err(line));
        child.on('error', (error) => {
            io.err(`rankflow bench: could not start the ${name} bench: ${error.message}`);
            resolve(1);
        });
        child.on('close', (status, signal) => {
            if (status !== 0) io.err(`rankflow bench: the ${name} bench ${signal ? `was killed by ${signal}` : `exited with ${status}`}`);
            resolve(status ?? 1);
        });
    });
}
