/**
 * engram on the host backend (API.md): engramWrite stores each rank's [entriesPerRank, hidden]
 * table in its host segment (buffer.cpuBytes); engramFetch returns, for global ids g, the row
 * g % entriesPerRank of rank floor(g / entriesPerRank)'s table, from any rank, for both memory kinds
 * with a host segment (hybrid, elastic) and with a scale-up domain smaller than the world.
 */
import { describe, expect, test } from 'vitest';
import { engramSizeHint, tensor, toBf16, type Group, type RankflowError, type Tensor } from '../actors/index.js';
import { recordTransitions, withGroup } from './helpers/group.js';
import { prng, randInt } from './helpers/moe-reference.js';

const base = { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 8 };
const MiB = 1 << 20;

function randomTables(seed: number, W: number, entries: number, hidden: number, dtype: 'bf16' | 'fp32'): Tensor[] {
    const rng = prng(seed);
    return Array.from({ length: W }, () => {
        const values = Array.from({ length: entries * hidden }, () => randInt(rng, 1 << 16) / 256 - 128);
        return dtype === 'bf16' ? tensor('bf16', [entries, hidden], toBf16(values)) : tensor('fp32', [entries, hidden], Float32Array.from(values));
    });
}

/** The reference fetch: row g % entries of rank floor(g / entries)'s table, for each id. */
function referenceFetch(tables: Tensor[], ids: Int32Array): Tensor {
    const [entries, hidden] = tables[0]!.shape as [number, number];
    const out = new (tables[0]!.data.constructor as new (n: number) => Tensor['data'])(ids.length * hidden);
    ids.forEach((g, i) => out.set(tables[Math.floor(g / entries)]!.data.subarray((g % entries) * hidden, (g % entries + 1) * hidden) as never, i * hidden));
    return tensor(tables[0]!.dtype, [ids.length, hidden], out as never);
}

async function writeAndFetch(g: Group, tables: Tensor[], ids: Int32Array[]): Promise<void> {
    await g.engramWrite(tables);
    const got = await g.engramFetch(ids);
    got.forEach((t, r) => expect(t, `rank ${r}`).toEqual(referenceFetch(tables, ids[r]!)));
}

/** Ids covering every rank's table, with repeats, in a shuffled order; rank r gets its own list. */
function idsFor(seed: number, W: number, entries: number, n: number): Int32Array[] {
    const rng = prng(seed);
    return Array.from({ length: W }, (_, r) => {
        const ids = Int32Array.from({ length: n }, (_, i) => (i < W ? i * entries + ((r + i) % entries) : randInt(rng, W * entries)));
        ids[n - 1] = ids[0]!; // a repeated id
        return ids.sort(() => rng() - 0.5);
    });
}

describe('engram: write then fetch by global id', () => {
    test.each([
        ['hybrid (default), one scale-up domain', 4, {}, undefined],
        ['elastic (hybrid: false)', 4, { hybrid: false }, undefined],
        ['hybrid with 2 ranks per node (2 scale-up domains)', 4, {}, 2],
        ['elastic with 2 ranks per node', 4, { hybrid: false }, 2],
        ['hybrid with 1 rank per node', 3, {}, 1],
    ] as const)('%s', async (_, W, extra, ranksPerNode) => {
        const entries = 50;
        const tables = randomTables(W, W, entries, 128, 'bf16');
        await withGroup({ ranks: W, ...(ranksPerNode ? { ranksPerNode } : {}), buffer: { ...base, numExperts: 12, cpuBytes: engramSizeHint({ entriesPerRank: entries, hidden: 128 }), ...extra } }, async (g) => {
            const kind = (await g.info(0)).memoryKind;
            expect(kind).toBe('hybrid' in extra ? 'elastic' : 'hybrid');
            await writeAndFetch(g, tables, idsFor(W, W, entries, 40));
        });
    });

    test('fp32 tables, 8 ranks', async () => {
        const tables = randomTables(8, 8, 16, 64, 'fp32');
        await withGroup({ ranks: 8, buffer: { ...base, cpuBytes: engramSizeHint({ entriesPerRank: 16, hidden: 64, dtype: 'fp32' }) } }, async (g) => {
            await writeAndFetch(g, tables, idsFor(8, 8, 16, 30));
        });
    });

    test('an empty index list gives an empty [0, hidden] tensor', async () => {
        const tables = randomTables(9, 2, 4, 32, 'bf16');
        await withGroup({ ranks: 2, buffer: { ...base, cpuBytes: MiB } }, async (g) => {
            await g.engramWrite(tables);
            const got = await g.engramFetch([new Int32Array(0), Int32Array.of(7, 0)]);
            expect(got[0]).toEqual(tensor('bf16', [0, 32]));
            expect(got[1]).toEqual(referenceFetch(tables, Int32Array.of(7, 0)));
        });
    });

    test('a second engramWrite replaces the tables everywhere', async () => {
        await withGroup({ ranks: 3, buffer: { ...base, numExperts: 6, cpuBytes: MiB } }, async (g) => {
            await writeAndFetch(g, randomTables(10, 3, 8, 16, 'bf16'), idsFor(10, 3, 8, 12));
            await writeAndFetch(g, randomTables(11, 3, 8, 16, 'bf16'), idsFor(11, 3, 8, 12));
        });
    });

    test('every rank passes engram.writing -> ready and engram.fetching -> ready', async () => {
        await withGroup({ ranks: 2, buffer: { ...base, cpuBytes: MiB } }, async (g) => {
            const rec = recordTransitions(g);
            await writeAndFetch(g, randomTables(12, 2, 4, 8, 'bf16'), [Int32Array.of(1), Int32Array.of(6)]);
            for (const r of [0, 1]) expect(rec.paths(r)).toEqual(['engram.writing', 'ready', 'engram.fetching', 'ready']);
        });
    });
});

describe('engram: refusals and size hint', () => {
    test('without a host segment engramWrite is EINVAL naming buffer.cpuBytes and the size needed', async () => {
        await withGroup({ ranks: 2, buffer: base }, async (g) => {
            const err = (await g.engramWrite(randomTables(20, 2, 100, 128, 'bf16')).catch((e: unknown) => e)) as RankflowError;
            expect(err.code).toBe('EINVAL');
            expect(err.message).toMatch(/^buffer\.cpuBytes: is 0 \(a host segment of 0 bytes\); this engram table needs a host segment of 2097152 bytes \(engramSizeHint\)/);
            expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
        });
    });

    test('a table larger than the host segment is EINVAL naming buffer.cpuBytes', async () => {
        await withGroup({ ranks: 2, buffer: { ...base, cpuBytes: MiB } }, async (g) => {
            // 1 MiB asked for is a 2 MiB segment: 8193 rows of 256 bytes are one row too many
            const err = (await g.engramWrite(randomTables(21, 2, 8193, 128, 'bf16')).catch((e: unknown) => e)) as RankflowError;
            expect(err.code).toBe('EINVAL');
            expect(err.message).toMatch(/buffer\.cpuBytes: is 1048576 \(a host segment of 2097152 bytes\); this engram table needs a host segment of 4194304 bytes/);
        });
    });

    test('a table that fills the segment the ranks made (buffer.cpuBytes rounded up to 2 MiB, as info() says) is taken in driver mode as in a rank program', async () => {
        await withGroup({ ranks: 2, buffer: { ...base, cpuBytes: MiB } }, async (g) => {
            expect((await g.info(0)).cpuBytes).toBe(2 * MiB);
            const tables = randomTables(23, 2, 8192, 128, 'bf16');  // 2 MiB a rank
            await g.engramWrite(tables);
            const rows = await g.engramFetch([Int32Array.of(8191), Int32Array.of(8192)]);
            expect(rows[0]!.data).toEqual(tables[0]!.data.subarray(8191 * 128));
            expect(rows[1]!.data).toEqual(tables[1]!.data.subarray(0, 128));
        });
    });

    test('engramFetch before any engramWrite is STATE; an id outside the table is EINVAL naming it', async () => {
        await withGroup({ ranks: 2, buffer: { ...base, cpuBytes: MiB } }, async (g) => {
            expect(((await g.engramFetch([Int32Array.of(0), Int32Array.of(0)]).catch((e: unknown) => e)) as RankflowError).code).toBe('STATE');
            await g.engramWrite(randomTables(22, 2, 4, 8, 'bf16'));
            const err = (await g.engramFetch([Int32Array.of(0), Int32Array.of(3, 8)]).catch((e: unknown) => e)) as RankflowError;
            expect(err.code).toBe('EINVAL');
            expect(err.message).toMatch(/indices\[1\]\[1\]: 8 is outside \[0, 8\)/);
        });
    });

    test('engramSizeHint: entries * hidden * element bytes, rounded up to 2 MiB', () => {
        expect(engramSizeHint({ entriesPerRank: 1, hidden: 8 })).toBe(2 * MiB);
        expect(engramSizeHint({ entriesPerRank: 4096, hidden: 256 })).toBe(2 * MiB);
        expect(engramSizeHint({ entriesPerRank: 4097, hidden: 256 })).toBe(4 * MiB);
        expect(engramSizeHint({ entriesPerRank: 4096, hidden: 256, dtype: 'fp32' })).toBe(4 * MiB);
        expect(() => engramSizeHint({ entriesPerRank: 0, hidden: 8 })).toThrow(/entriesPerRank/);
    });
});
