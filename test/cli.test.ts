/**
 * The `rankflow` binary as a user runs it: bin/rankflow.js in a child process, judged by its exit
 * code, stdout and stderr. --help and --version, usage errors (exit 2, before anything starts),
 * the demo with one rank and with --name=value flags and its progress lines, doctor as text and
 * as JSON, bench (host; the GPU bench skipped where there is no GPU), and the debug log.
 */
import { execFile, spawn } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { cudaScaleOut } from '../actors/cli/doctor.js';
import { probeCuda } from '../actors/core/backend.js';
import { ensureCompiled, freePort, repoRoot } from './helpers/children.js';

const BIN = join(repoRoot, 'bin', 'rankflow.js');
const VERSION = (JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as { version: string }).version;
/** A demo small enough for a 2-core machine: the point is what it prints, not what it measures. */
const SMALL_DEMO = ['--rounds', '2', '--tokens', '16', '--hidden', '128', '--quiet'];

interface Run {
    code: number | null;
    stdout: string;
    stderr: string;
}

/** Runs `rankflow ...args` to its end (bounded by `timeout`); never rejects. */
function rankflow(args: string[], options: { env?: Record<string, string | undefined>; timeout?: number } = {}): Promise<Run> {
    const env: NodeJS.ProcessEnv = { ...process.env, NODE_DEBUG: undefined, DEBUG: undefined, ...options.env };
    for (const key of Object.keys(env)) if (env[key] === undefined) delete env[key];
    return new Promise((resolve) => {
        execFile(process.execPath, [BIN, ...args], { cwd: repoRoot, env, timeout: options.timeout ?? 60_000 }, (error, stdout, stderr) => {
            const code = error ? (typeof error.code === 'number' ? error.code : null) : 0;
            resolve({ code, stdout, stderr });
        });
    });
}

beforeAll(() => {
    // The binary runs the compiled CLI; `npm test` compiles first, a lone vitest run may not have.
    ensureCompiled('dist/actors/cli/main.js', ['actors/cli/main.ts', 'actors/cli/demo.ts', 'actors/cli/doctor.ts', 'actors/cli/bench.ts']);
});

const dirs: string[] = [];
afterAll(async () => {
    for (const dir of dirs) await rm(dir, { recursive: true, force: true });
});

describe('rankflow --help, --version', () => {
    test('--version prints the package version', async () => {
        expect(await rankflow(['--version'])).toEqual({ code: 0, stdout: `${VERSION}\n`, stderr: '' });
    });

    test.each(['demo', 'inspect', 'doctor', 'bench'])('%s --help exits 0 and prints its usage', async (command) => {
        const run = await rankflow([command, '--help']);
        expect(run.code).toBe(0);
        expect(run.stdout.split('\n')[0]).toMatch(new RegExp(`^usage: rankflow ${command}( |$)`));
        expect(run.stderr).toBe('');
    });

    test('--help lists every command; no command at all is a usage error', async () => {
        const help = await rankflow(['--help']);
        expect(help.code).toBe(0);
        for (const command of ['demo', 'inspect', 'doctor', 'bench']) expect(help.stdout).toMatch(new RegExp(`^  ${command} `, 'm'));
        const none = await rankflow([]);
        expect(none.code).toBe(2);
        expect(none.stderr).toMatch(/^usage: rankflow <command>/);
    });
});

describe('usage errors exit 2 with the message and the usage line', () => {
    test.each([
        [['frobnicate'], /^rankflow: unknown command 'frobnicate'$/m, /^usage: rankflow <command>/m],
        [['demo', '--bogus'], /^rankflow demo: unknown option '--bogus'$/m, /^usage: rankflow demo /m],
        [['demo', '--ranks', 'two'], /^rankflow demo: --ranks must be an integer in \[1, 64\], got 'two'$/m, /^usage: rankflow demo /m],
        [['demo', '--backend', 'tpu'], /^rankflow demo: --backend must be one of auto, host, cuda, got 'tpu'$/m, /^usage: rankflow demo /m],
        [['demo', '--ranks'], /^rankflow demo: .*--ranks/m, /^usage: rankflow demo /m],
        [['demo', 'extra'], /^rankflow demo: unexpected argument 'extra'/m, /^usage: rankflow demo /m],
        [['doctor', '--jsn'], /^rankflow doctor: unknown option '--jsn'$/m, /^usage: rankflow doctor/m],
        [['bench', '--only', 'tpu'], /^rankflow bench: --only must be one of host, gpu, got 'tpu'$/m, /^usage: rankflow bench /m],
        // What only the group would refuse is still the flag's fault: a usage error before anything starts.
        [['demo', '--hidden', '100'], /^rankflow demo: --hidden \(100\) must be a multiple of 8 \(16-byte rows\)$/m, /^usage: rankflow demo /m],
        [['demo', '-t', '2000000'], /^rankflow demo: --tokens must be a positive integer up to 1048576 \(got 2000000\)$/m, /^usage: rankflow demo /m],
        [['--version', 'extra'], /^rankflow: --version takes no arguments \(got 'extra'\)$/m, /^usage: rankflow <command>/m],
        [['-v', '-v'], /^rankflow: -v takes no arguments/m, /^usage: rankflow <command>/m],
        [['help', 'frobnicate'], /^rankflow: unknown command 'frobnicate'$/m, /^usage: rankflow <command>/m],
        [['--frobnicate'], /^rankflow: unknown option '--frobnicate'$/m, /^usage: rankflow <command>/m],
        [['demo', '-x'], /^rankflow demo: unknown option '-x'$/m, /^usage: rankflow demo /m]
    ])('rankflow %j', async (args, message, usage) => {
        const run = await rankflow(args);
        expect(run.code).toBe(2);
        expect(run.stderr).toMatch(message);
        expect(run.stderr).toMatch(usage);
        expect(run.stdout).toBe('');
    });

    test('inspect checks its flags before it serves: a bad flag starts no server and the process ends', async () => {
        const port = await freePort();
        for (const bad of [['--bogus'], ['--ranks', 'x'], ['--port', '70000']]) {
            const run = await rankflow(['inspect', '--port', String(port), ...bad]);
            expect(run.code).toBe(2);
            expect(run.stdout).not.toContain('rankflow inspector:');
            expect(run.stderr).toMatch(/^usage: rankflow inspect /m);
        }
        // Nothing listens there: the port can be bound again.
        const server = createServer();
        await new Promise<void>((resolve, reject) => server.once('error', reject).listen(port, '127.0.0.1', resolve));
        await new Promise<void>((resolve) => server.close(() => resolve()));
    });
});

describe('rankflow demo', () => {
    test('with one rank, its allGather checks out and it exits 0', async () => {
        const run = await rankflow(['demo', '--ranks', '1', '--backend', 'host', ...SMALL_DEMO]);
        expect(run.stdout).toMatch(/^group of 1 rank on 'host' ready/m);
        expect(run.stdout).toMatch(/^ {2}allGather .* checked$/m);
        expect(run.stdout).not.toContain('WRONG');
        expect(run.code).toBe(0);
    });

    test('takes --name=value as --name value, and says on stderr what it is doing, phase by phase', async () => {
        const run = await rankflow(['demo', '--ranks=2', '--backend=host', '--rounds=2', '--tokens=16', '--hidden=128', '--quiet']);
        expect(run.code).toBe(0);
        expect(run.stdout).toMatch(/^group of 2 ranks on 'host' ready/m);
        const phases = run.stderr.split('\n').filter((line) => line.startsWith('rankflow demo: ')).map((line) => line.slice(15).split(/[ :]/)[0]);
        expect(phases).toEqual(['starting', '2', 'allGather', 'building', 'dispatch', 'combine', 'destroying']);
    });
});

describe('short flags', () => {
    test('-h and -v; a command\'s own (-r, -b, -t, -n, -q for the demo; -j for doctor)', async () => {
        expect((await rankflow(['-v'])).stdout).toBe(`${VERSION}\n`);
        expect((await rankflow(['-h'])).stdout).toMatch(/^usage: rankflow <command>/);
        expect((await rankflow(['demo', '-h'])).stdout).toMatch(/^usage: rankflow demo \[-r\|--ranks N\]/);
        const run = await rankflow(['demo', '-r', '2', '-b', 'host', '-t', '16', '--hidden', '128', '-n', '2', '-q']);
        expect(run.code).toBe(0);
        expect(run.stdout).toMatch(/^group of 2 ranks on 'host' ready/m);
        expect(run.stdout).toMatch(/^ {2}barrier .* \(mean of 2, driver mode\)$/m);
        expect(JSON.parse((await rankflow(['doctor', '-j'])).stdout)).toMatchObject({ addon: { loaded: true } });
    });
});

describe('rankflow doctor', () => {
    test('exits 1 when the addon cannot load, saying so, as text and as JSON', async () => {
        const dir = await mkdtemp(join(tmpdir(), 'rankflow-doctor-'));
        dirs.push(dir);
        const broken = join(dir, 'rankflow.node');
        await writeFile(broken, 'not an ELF file');
        const text = await rankflow(['doctor'], { env: { RANKFLOW_ADDON: broken } });
        expect(text.code).toBe(1);
        expect(text.stdout).toMatch(new RegExp(`^addon +not loaded: `, 'm'));
        expect(text.stdout).toMatch(/^problem +the native addon does not load/m);
        const json = await rankflow(['doctor', '--json'], { env: { RANKFLOW_ADDON: join(dir, 'missing.node') } });
        expect(json.code).toBe(1);
        expect(JSON.parse(json.stdout)).toMatchObject({ addon: { loaded: false, error: expect.stringMatching(/^RANKFLOW_ADDON names .*missing\.node, which does not exist$/) }, problems: ['the native addon does not load (see addon)'] });
    });

    test('--json prints one JSON object and nothing else', async () => {
        const run = await rankflow(['doctor', '--json']);
        expect(run.code).toBe(0);
        const report = JSON.parse(run.stdout) as Record<string, any>;
        expect(typeof report).toBe('object');
        expect(report).toMatchObject({ rankflow: VERSION, node: process.version, addon: { loaded: true } });
        expect(['host', 'cuda']).toContain(report.auto.backend);
        expect(typeof report.cuda.available).toBe('boolean');
        expect(Array.isArray(report.cuda.gpus)).toBe(true);
        if (!report.cuda.available) expect(typeof report.cuda.unavailable.reason).toBe('string');
        // Which transport crosses nodes, per backend; cuda's says whether the NCCL found has its calls.
        expect(report.scaleOut.host.transport).toMatch(/^TCP between rail peers/);
        expect(report.scaleOut.cuda).toMatchObject({ transport: expect.stringMatching(/^grouped ncclSend\/ncclRecv between rail peers/), enabled: true });
        expect(report.scaleOut.cuda.runs).toMatch(/^barrier and allGather .*; dispatch with a CPU sync and combine .*; AGRS sessions, engram .* and ppExchange .*; dispatch without a CPU sync and graphs refuse with BACKEND_UNAVAILABLE/);
        if (report.nccl?.unavailable) expect(report.scaleOut.cuda).toMatchObject({ available: false, unavailable: `no NCCL: ${report.nccl.unavailable.reason}` });
        else expect(report.scaleOut.cuda.available).toBe(typeof report.nccl?.version === 'string');
    });

    test("cuda's scale-out entry from each NCCL probe: found with both calls, found without them, not found", () => {
        const runs = /^barrier and allGather .*refuse with BACKEND_UNAVAILABLE/;
        expect(cudaScaleOut({ path: '/x/libnccl.so.2', version: '2.28.3', p2p: true })).toEqual({
            transport: expect.stringMatching(/^grouped ncclSend\/ncclRecv/), available: true, enabled: true, runs: expect.stringMatching(runs)
        });
        expect(cudaScaleOut({ path: '/x/libnccl.so.2', version: '2.28.3', p2p: false, p2pReason: 'NCCL at /x/libnccl.so.2 has no ncclSend/ncclRecv' }))
            .toMatchObject({ available: false, unavailable: 'NCCL at /x/libnccl.so.2 has no ncclSend/ncclRecv' });
        expect(cudaScaleOut({ reason: 'no usable NCCL >= 2.28 was found (tried:\n  libnccl.so.2: libnccl.so.2: nope). Install it.' }))
            .toMatchObject({ available: false, unavailable: 'no NCCL: no usable NCCL >= 2.28 was found' });
        expect(cudaScaleOut(undefined)).toMatchObject({ available: false, unavailable: expect.stringMatching(/no CUDA backend/) });
    });

    test('as text: each library tried on its own line, its path once, no probe internals', async () => {
        const [text, json] = await Promise.all([rankflow(['doctor']), rankflow(['doctor', '--json'])]);
        expect(text.code).toBe(0);
        const lines = text.stdout.trimEnd().split('\n');
        expect(lines[0]).toBe(`rankflow ${VERSION} (node ${process.version}, ${process.platform} ${process.arch})`);
        expect(lines.slice(1).map((line) => /^(\S+)/.exec(line)?.[1]).filter(Boolean).every((label) =>
            ['addon', 'kernels', 'driver', 'GPUs', 'GPU', 'NCCL', 'cuda', 'scaleout', 'auto', 'problem'].includes(label!))).toBe(true);
        expect(lines.filter((line) => /^(scaleout +host: TCP between rail peers| +cuda: grouped ncclSend\/ncclRecv)/.test(line))).toHaveLength(2);
        expect(text.stdout).not.toMatch(/groups:|\{"|\(\s*[^()]*\(/);
        const report = JSON.parse(json.stdout) as { cuda: { unavailable?: { tried: Array<{ path: string }> } }; nccl?: { unavailable?: { tried: Array<{ path: string }> } } };
        const tried = [...(report.cuda.unavailable?.tried ?? []), ...(report.nccl?.unavailable?.tried ?? [])].map((t) => t.path);
        const escape = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
        for (const path of tried) {
            const own = lines.filter((line) => new RegExp(`^ +(tried +)?${escape(path)}(: |$)`).test(line));
            expect(own).toHaveLength(1);
            // dlerror repeats the path it was given; the line says it once.
            const bare = path.replace(/\s+\(.*\)$/, '');
            expect(own[0]!.split(bare).length - 1).toBe(1);
        }
        expect(lines.at(-1)).toMatch(/^auto {5}picks '(host|cuda)'$/);
    });
});

describe('rankflow inspect, stopped', () => {
    test.each([['SIGINT', 130], ['SIGTERM', 143]] as const)('by %s after the demo: the page closes and it exits %d', async (signal, code) => {
        const child = spawn(process.execPath, [BIN, 'inspect', '--port', '0', '--backend', 'host', '--ranks', '1', ...SMALL_DEMO], {
            cwd: repoRoot, env: { ...process.env, NODE_DEBUG: '', DEBUG: '' }, stdio: ['ignore', 'pipe', 'pipe']
        });
        let stdout = '';
        const serving = new Promise<void>((resolve) => child.stdout.on('data', (chunk: Buffer) => {
            stdout += chunk.toString();
            if (stdout.includes('inspector still serving at ')) resolve();
        }));
        const exited = new Promise<number | null>((resolve) => child.on('exit', (c) => resolve(c)));
        await serving;
        child.kill(signal);
        expect(await exited).toBe(code);
        expect(stdout).toMatch(/^demo finished$/m);
    }, 60_000);
});

describe('rankflow bench', () => {
    const tiny = ['--ranks', '2', '--tokens', '8', '--hidden', '128', '--topk', '2', '--experts', '8', '--iters', '2', '--warmup', '1', '--barrier-iters', '10'];
    const gpus = probeCuda();
    const noGpu = !gpus.available;

    async function outDir(): Promise<string> {
        const dir = await mkdtemp(join(tmpdir(), 'rankflow-bench-'));
        dirs.push(dir);
        return dir;
    }

    test('--only host runs the host bench (dist/bench/host.js) with the flags it knows, its result in --out', async () => {
        const out = await outDir();
        const run = await rankflow(['bench', '--only', 'host', '--out', out, ...tiny], { timeout: 120_000 });
        expect(run.code).toBe(0);
        expect(run.stdout).toMatch(/^rankflow bench: host \(.*dist\/bench\/host\.js /m);
        expect(run.stdout).toMatch(/^rankflow host benchmark: 2 ranks, 8 tokens x 128 hidden bf16, top-2 of 8 experts/m);
        expect(run.stdout).not.toContain('GPU bench');
        const files = (await readdir(out)).filter((f) => /^host-.*\.json$/.test(f));
        expect(files).toHaveLength(1);
        const result = JSON.parse(await readFile(join(out, files[0]!), 'utf8')) as { config: Record<string, number> };
        expect(result.config).toMatchObject({ ranks: 2, tokens: 8, hidden: 128, topk: 2, experts: 8, iters: 2, barrierIters: 10 });
    }, 120_000);

    test.skipIf(!noGpu)('without GPUs it runs the host bench, then says the GPU bench is skipped and why', async () => {
        const run = await rankflow(['bench', '--out', await outDir(), ...tiny], { timeout: 120_000 });
        expect(run.code).toBe(0);
        const host = run.stdout.indexOf('rankflow host benchmark:');
        const skipped = run.stdout.search(/^GPU bench skipped: no usable GPU \(.+\); 'rankflow doctor' says more$/m);
        expect(host).toBeGreaterThanOrEqual(0);
        expect(skipped).toBeGreaterThan(host);
    }, 120_000);

    test.skipIf(!noGpu)('--only gpu without GPUs says why and exits 1, having run nothing', async () => {
        const run = await rankflow(['bench', '--only', 'gpu', '--out', await outDir()]);
        expect(run.code).toBe(1);
        expect(run.stdout).toMatch(/^GPU bench skipped: no usable GPU/m);
        expect(run.stdout).not.toContain('rankflow host benchmark');
    });
});

describe('the debug log', () => {
    const debugLine = /^RANKFLOW \d+: cli: /m;

    test.each([
        [{ DEBUG: 'rankflow' }, true],
        [{ DEBUG: 'express,rankflow' }, true],
        [{ DEBUG: '*' }, true],
        [{ NODE_DEBUG: 'rankflow' }, true],
        [{ DEBUG: '*,-rankflow' }, false],
        [{ DEBUG: 'express' }, false],
        [{}, false]
    ])('env %j: RANKFLOW <pid>: lines on stderr: %s', async (env, shown) => {
        const run = await rankflow(['--version'], { env });
        expect(run.code).toBe(0);
        expect(run.stdout).toBe(`${VERSION}\n`);
        if (shown) expect(run.stderr).toMatch(debugLine);
        else expect(run.stderr).toBe('');
    });
});
