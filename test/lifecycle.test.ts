/**
 * A group's life in its process: a script that forgets destroy() still exits (the rank workers keep
 * the process alive only while a call is in flight); `node --input-type=module -e` scripts work (the
 * workers leave out the flags about the process's entry point, keep --import & co); `await using`
 * destroys a group and closes a session, `using` frees a device tensor.
 */
import { spawn } from 'node:child_process';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, expect, test } from 'vitest';

import { createGroup, DeviceTensor, type Group, type Session } from '../actors/index.js';
import { parseExecArgv, workerExecArgv } from '../actors/core/worker-argv.js';
import { deviceTensor } from '../actors/core/device-tensor.js';
import { ensureCompiled, repoRoot } from './helpers/children.js';
import { program } from './helpers/group.js';

const buffer = { maxTokensPerRank: 4, hidden: 128, topk: 2, numExperts: 6 };
const lifecycleSources = ['actors/group.ts', 'actors/ranks.ts', 'actors/startup.ts', 'actors/options.ts', 'actors/core/worker-argv.ts', 'workers/rank.ts', 'workers/run-abort.ts', 'workers/program.ts'];

/** Runs node with `args`; resolves with its exit code (or signal), output and how long it took; killed after `limitMs`. */
function node(args: string[], limitMs: number): Promise<{ code: number | string; stdout: string; stderr: string; ms: number }> {
    return new Promise((resolve) => {
        const start = Date.now();
        const child = spawn(process.execPath, args, { cwd: repoRoot, stdio: ['ignore', 'pipe', 'pipe'] });
        let stdout = '', stderr = '';
        child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
        child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
        const timer = setTimeout(() => child.kill('SIGKILL'), limitMs);
        child.on('exit', (code, signal) => {
            clearTimeout(timer);
            resolve({ code: code ?? signal ?? -1, stdout, stderr, ms: Date.now() - start });
        });
    });
}

describe('a process whose group is never destroyed', () => {
    test('exits by itself with code 0 once its last call (a run in flight after the script ended) is done', async () => {
        ensureCompiled('dist/actors/group.js', lifecycleSources);
        const r = await node([path.join(repoRoot, 'test/fixtures/no-destroy.mjs')], 15_000);
        expect(r.stderr).toBe('');
        expect(r.code).toBe(0);
        // the run in flight kept the process alive: its result and the session after it came out
        expect(r.stdout.split('\n')).toEqual(['end of script', 'ran [1,1,1]', 'session open', '']);
        expect(r.ms).toBeLessThan(8000);  // a few seconds even on a loaded machine (about 1 s idle)
    });
});

describe('node --input-type=module -e', () => {
    const dist = pathToFileURL(path.join(repoRoot, 'dist/actors/index.js')).href;
    const script = `
        import { createGroup } from ${JSON.stringify(dist)};
        const g = await createGroup({ backend: 'host', ranks: 2, buffer: ${JSON.stringify(buffer)} });
        await g.barrier();
        const seen = await g.run(${JSON.stringify(program('until-aborted.mjs').href)}, { mode: 'imported' });
        await g.destroy();
        console.log(JSON.stringify({ seen, states: g.snapshot().map((s) => s.state) }));`;

    test.each([
        ['--input-type=module -e', ['--input-type=module', '-e', script]],
        ['--input-type module --eval (separate values)', ['--input-type', 'module', '--eval', script]],
        // --expose-gc applies to the whole process: a worker given it explicitly would refuse it
        ['with --import and --expose-gc kept for the workers', ['--expose-gc', '--import', 'data:text/javascript,globalThis.rfImported=7', '--input-type=module', '-e', script]],
    ])('%s: a script that makes a group works', async (_, args) => {
        ensureCompiled('dist/actors/group.js', lifecycleSources);
        const r = await node(args, 20_000);
        expect(r.stderr).toBe('');
        expect(r.code).toBe(0);
        const out = JSON.parse(r.stdout) as { seen: Array<{ imported: number | null; gc: string }>; states: string[] };
        expect(out.states).toEqual(['destroyed', 'destroyed']);
        const imported = args.includes('--import') ? 7 : null;
        expect(out.seen).toEqual([0, 1].map(() => ({ imported, gc: args.includes('--expose-gc') ? 'function' : 'undefined' })));
    });

    test('workerExecArgv leaves out the entry-point flags with their values and keeps the rest', () => {
        expect(workerExecArgv(['--no-warnings', '--import', 'x.mjs'])).toBeUndefined();  // nothing to leave out: inherited as is
        expect(workerExecArgv(['--input-type=module', '-e', '--import x', '--conditions', 'dev', '-r', './r.cjs'])).toEqual(['--conditions', 'dev', '-r', './r.cjs']);
        expect(workerExecArgv(['-p', '1+1', '--enable-source-maps'])).toEqual(['--enable-source-maps']);
        expect(workerExecArgv(['--eval=x', '--test', '--test-reporter=spec', '--watch-path', '/tmp', '--loader', 'l.mjs'])).toEqual(['--loader', 'l.mjs']);
        expect(parseExecArgv(['--stack-size', '2000', '-e', '-1'])).toEqual([{ name: '--stack-size', args: ['--stack-size', '2000'] }, { name: '-e', args: ['-e', '-1'] }]);
    });
});

describe('await using and using', () => {
    test('a group leaving its scope is destroyed; a session leaving its scope is closed first', async () => {
        let outer: Group | undefined;
        let session: Session | undefined;
        {
            await using g = await createGroup({ backend: 'host', ranks: 2, buffer });
            outer = g;
            {
                await using s = await g.openSession({ maxBytes: 64, maxAllGathers: 1 });
                session = s;
                expect(g.snapshot().map((x) => x.state)).toEqual(['session.open', 'session.open']);
            }
            expect(g.snapshot().map((x) => x.state)).toEqual(['ready', 'ready']);
            await g.barrier();
        }
        expect(outer.snapshot().map((x) => x.state)).toEqual(['destroyed', 'destroyed']);
        // disposing again (closed session, destroyed group) is a no-op, not an error
        await session[Symbol.asyncDispose]();
        await outer[Symbol.asyncDispose]();
    });

    test('a session whose group is destroyed is left alone by its disposal', async () => {
        const g = await createGroup({ backend: 'host', ranks: 2, buffer });
        const s = await g.openSession({ maxBytes: 64, maxAllGathers: 1 });
        await g.destroy();
        await expect(s[Symbol.asyncDispose]()).resolves.toBeUndefined();
        await expect(s.close()).rejects.toMatchObject({ code: 'STATE' });
    });

    test('rank.tensor without data zero-fills on the device (no host bytes); with data it uploads them; a refused copy gives the memory back', () => {
        const calls: Array<[string, ...unknown[]]> = [];
        const mem = {
            deviceAlloc: (bytes: number) => (calls.push(['alloc', bytes]), 8192n),
            deviceFree: (p: bigint) => void calls.push(['free', p]),
            deviceUpload: (p: bigint, data: ArrayBufferView) => {
                calls.push(['upload', p, data.byteLength]);
                if (data.byteLength === 12) throw Object.assign(new Error('refused'), { code: 'STATE' });
            },
            deviceZero: (p: bigint, bytes: number) => void calls.push(['zero', p, bytes]),
            deviceDownload: () => new Uint8Array(0),
        };
        const z = deviceTensor(mem, 'bf16', [1000, 7168]);
        expect(calls).toEqual([['alloc', 14_336_000], ['zero', 8192n, 14_336_000]]);
        calls.length = 0;
        deviceTensor(mem, 'int32', [4], Int32Array.of(1, 2, 3, 4));
        expect(calls).toEqual([['alloc', 16], ['upload', 8192n, 16]]);
        calls.length = 0;
        expect(() => deviceTensor(mem, 'int32', [3], Int32Array.of(1, 2, 3))).toThrow(/refused/);
        expect(calls).toEqual([['alloc', 12], ['upload', 8192n, 12], ['free', 8192n]]);
        z.free();
    });

    test('a device tensor leaving its scope is freed, once', () => {
        const freed: bigint[] = [];
        const mem = { deviceAlloc: () => 64n, deviceFree: (p: bigint) => void freed.push(p), deviceUpload: () => {}, deviceZero: () => {}, deviceDownload: () => new Uint8Array(0) };
        let t: DeviceTensor | undefined;
        {
            using d = new DeviceTensor(mem, 'fp32', [4], 4096n);
            t = d;
            expect(d.ptr).toBe(4096n);
        }
        expect(freed).toEqual([4096n]);
        t.free();
        expect(freed).toEqual([4096n]);
        expect(() => t.ptr).toThrow(/freed/);
    });
});
