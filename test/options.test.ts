/**
 * Options and inputs checked (API.md, Errors): a key no option is named is EINVAL naming it, with the
 * nearest known name, at every level of createGroup's options, in the size hints and in the ops'
 * option and input objects; tensor() checks its dtype, shape and data; group.run takes a URL or an
 * absolute path and nothing else. Nothing starts and nothing moves when a call is refused.
 */
import { writeFile, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, expect, test } from 'vitest';
import { createGroup, sessionSizeHint, sizeHint, engramSizeHint, tensor, toBf16, type Group } from '../actors/index.js';
import { nearestName, shapeKeys } from '../actors/core/option-keys.js';
import { program, recordTransitions, withGroup } from './helpers/group.js';

const buffer = { maxTokensPerRank: 4, hidden: 128, topk: 2, numExperts: 8 };
const einval = (message: RegExp) => ({ name: 'RankflowError', code: 'EINVAL', message: expect.stringMatching(message) });

describe('the nearest known name', () => {
    test.each([
        ['rank', 'ranks'], ['Ranks', 'ranks'], ['bakend', 'backend'], ['maxTokens', 'maxTokensPerRank'], ['numexperts', 'numExperts'],
        ['cpuSecond', 'cpuSeconds'], ['withCpuSnc', 'withCpuSync'], ['rankoffset', 'rankOffset'], ['zzz', undefined], ['elastic', undefined]
    ])('%s -> %s', (word, near) => {
        const known = ['ranks', 'backend', 'devices', 'buffer', 'timeouts', 'maxTokensPerRank', 'numExperts', 'cpuSeconds', 'withCpuSync', 'rankOffset'];
        expect(nearestName(word, known)).toBe(near);
    });

    test('the keys of an options shape, as messages show it; none for an open shape', () => {
        expect(shapeKeys('{ withCpuSync? }')).toEqual(['withCpuSync']);
        expect(shapeKeys('{ maxBytes, maxAllGathers }')).toEqual(['maxBytes', 'maxAllGathers']);
        expect(shapeKeys('{ buffer, ranks?, backend?, ... }')).toBeUndefined();
        expect(shapeKeys('{ out?: { x } }')).toBeUndefined();
    });
});

describe('createGroup refuses a key it does not know, at every level, before anything starts', () => {
    test.each([
        [{ rank: 2 }, /^options\.rank: is not an option \(did you mean 'ranks'\?\); options takes ranks, backend, devices, /],
        [{ bakend: 'host' }, /^options\.bakend: is not an option \(did you mean 'backend'\?\)/],
        [{ elastc: true }, /^options\.elastc: is not an option \(did you mean 'elastic'\?\); options takes /],
        [{ buffer: { ...buffer, maxTokens: 4 } }, /^buffer\.maxTokens: is not an option \(did you mean 'maxTokensPerRank'\?\); buffer takes maxTokensPerRank, hidden, /],
        [{ timeouts: { cpuSecond: 5 } }, /^timeouts\.cpuSecond: is not an option \(did you mean 'cpuSeconds'\?\); timeouts takes cpuSeconds, gpuSeconds$/],
        [{ world: { size: 2, rankOffset: 0, rendezvous: 'tcp://127.0.0.1:1', nodeID: 'a' } }, /^world\.nodeID: is not an option \(did you mean 'nodeId'\?\)/],
    ])('%j', async (extra, message) => {
        const t0 = performance.now();
        await expect(createGroup({ backend: 'host', ranks: 2, buffer, ...extra } as never)).rejects.toMatchObject(einval(message));
        // Refused in the checks: no worker was started, no rendezvous waited for.
        expect(performance.now() - t0).toBeLessThan(1000);
    });

    test('the size hints refuse unknown keys too; a whole buffer config is a valid sizeHint config', () => {
        expect(() => sizeHint({ ...buffer, topK: 2 } as never, 2)).toThrow(/^config\.topK: is not an option \(did you mean 'topk'\?\)/);
        expect(sizeHint({ ...buffer, cpuBytes: 0, bytes: 1 << 22, hybrid: true }, 2)).toBe(sizeHint(buffer, 2));
        expect(() => sessionSizeHint({ maxBytes: 64, maxAllGather: 2 } as never, 2)).toThrow(/^session\.maxAllGather: is not an option \(did you mean 'maxAllGathers'\?\)/);
        expect(() => engramSizeHint({ entriesPerRank: 4, hidden: 8, dtyp: 'bf16' } as never)).toThrow(/^table\.dtyp: is not an option \(did you mean 'dtype'\?\)/);
    });
});

/** Runs `call`, which must be refused with EINVAL matching `message`, and checks no rank moved. */
async function refusedUnchanged(g: Group, call: () => Promise<unknown>, message: RegExp): Promise<void> {
    const rec = recordTransitions(g);
    const before = g.snapshot();
    await expect(call()).rejects.toMatchObject(einval(message));
    expect(rec.events).toEqual([]);
    expect(g.snapshot()).toEqual(before);
}

describe("the ops' option and input objects refuse unknown keys; nothing moves", () => {
    test('barrier, openSession, run, dispatch and combine', async () => {
        await withGroup({ ranks: 2, buffer }, async (g) => {
            await refusedUnchanged(g, () => g.barrier({ withCpuSnc: true } as never), /^options\.withCpuSnc: is not an option \(did you mean 'withCpuSync'\?\); options takes withCpuSync$/);
            await refusedUnchanged(g, () => g.openSession({ maxBytes: 64, maxAllGather: 1 } as never), /^options\.maxAllGather: is not an option \(did you mean 'maxAllGathers'\?\)/);
            await refusedUnchanged(g, () => g.run(program('until-aborted.mjs'), { mode: 'count' }, { signl: AbortSignal.abort() } as never), /^options\.signl: is not an option \(did you mean 'signal'\?\)/);
            const x = tensor('bf16', [2, 128], toBf16(new Float32Array(256).fill(1)));
            const input = { x, topkIdx: Int32Array.from([0, 5, 1, 6]), topkWeights: new Float32Array(4).fill(0.5) };
            await refusedUnchanged(g, () => g.dispatch([input, { ...input, expertAlignmnt: 4 } as never]), /^inputs\[1\]\.expertAlignmnt: is not an option \(did you mean 'expertAlignment'\?\)/);
            const out = await g.dispatch([input, input]);
            await refusedUnchanged(g, () => g.combine(out.map((d) => ({ x: d.x, handle: d.handle, bais: [] })) as never), /^inputs\[0\]\.bais: is not an option \(did you mean 'bias'\?\)/);
            // The same calls without the typo go through.
            await g.barrier({ withCpuSync: true });
            expect((await g.combine(out.map((d) => ({ x: d.x, handle: d.handle })))).map((c) => c.x.shape)).toEqual([[2, 128], [2, 128]]);
        });
    });
});

describe('tensor() checks its arguments', () => {
    test.each([
        [() => tensor('float16' as never, [2]), /^dtype: must be one of bf16, fp32, fp8e4m3, int32 \(got "float16"\)$/],
        [() => tensor('constructor' as never, [2]), /^dtype: must be one of /],
        [() => tensor('fp32', [2, -1]), /^shape: must be an array of non-negative integers \(got \[2, -1\]\)$/],
        [() => tensor('fp32', [1.5]), /^shape: must be an array of non-negative integers/],
        [() => tensor('fp32', 4 as never), /^shape: must be an array of non-negative integers \(got 4\)$/],
        [() => tensor('fp32', [2, 3], new Float32Array(5)), /^data: has 5 elements; shape \[2, 3\] needs 6$/],
        [() => tensor('bf16', [2], new Float32Array(2) as never), /^data: must be a Uint16Array for dtype bf16 \(got Float32Array\)$/],
        [() => tensor('fp32', [2 ** 26, 2 ** 26]), /^shape: \[67108864, 67108864\] is 4503599627370496 elements: /],
    ])('%s', (make, message) => {
        expect(make).toThrow(expect.objectContaining(einval(message)));
    });

    test('a zero-filled tensor, or one wrapping the data given (no copy)', () => {
        expect(tensor('int32', [2, 2]).data).toEqual(new Int32Array(4));
        const data = new Float32Array([1, 2]);
        expect(tensor('fp32', [2], data).data).toBe(data);
        expect(tensor('fp8e4m3', [0]).data).toEqual(new Uint8Array(0));
    });
});

describe('group.run takes a URL or an absolute path', () => {
    test('a relative path, a missing file, an http URL and a number are EINVAL saying what to pass; an absolute path runs', async () => {
        const dir = await mkdtemp(join(tmpdir(), 'rankflow-run-'));
        try {
            const file = join(dir, 'prog.mjs');
            await writeFile(file, 'export default (rank, args) => rank.rank * args.k;\n');
            await withGroup({ ranks: 2, buffer }, async (g) => {
                await refusedUnchanged(g, () => g.run('prog.mjs'), /^moduleUrl: "prog\.mjs" is a relative path, which the ranks' workers would resolve against the working directory .*: pass a URL \(new URL\('\.\/program\.mjs', import\.meta\.url\)\) or an absolute path$/);
                await refusedUnchanged(g, () => g.run('./test/prog.mjs'), /^moduleUrl: "\.\/test\/prog\.mjs" is a relative path/);
                await refusedUnchanged(g, () => g.run(join(dir, 'missing.mjs')), new RegExp(`^moduleUrl: there is no file at ${join(dir, 'missing.mjs').replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`));
                await refusedUnchanged(g, () => g.run(new URL('https://example.com/prog.mjs')), /^moduleUrl: https: URLs cannot be loaded by the ranks' workers/);
                await refusedUnchanged(g, () => g.run(7 as never), /^moduleUrl: must be a URL or an absolute path \(got 7\)$/);
                expect(await g.run(file, { k: 3 })).toEqual([0, 3]);
                expect(await g.run(pathToFileURL(file), { k: 2 })).toEqual([0, 2]);
                expect(await g.run(pathToFileURL(file).href, { k: 1 })).toEqual([0, 1]);
            });
        } finally {
            await rm(dir, { recursive: true, force: true });
        }
    });
});
