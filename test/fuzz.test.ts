/**
 * Fuzzing the public API's inputs on the host backend, with a seeded PRNG: each case takes a valid
 * call, breaks one thing in it, and expects EINVAL whose message starts with the argument's name
 * (`inputs[1].topkIdx[5]: ...`). A refused call moves no rank: afterwards every rank is still where
 * it was, with the same seq, and a correct collective still works.
 */
import { afterAll, beforeAll, describe, expect, test } from 'vitest';

import {
    createGroup, RankflowError, tensor, type DispatchHandle, type DispatchInput, type Group, type GroupOptions, type Tensor,
} from '../actors/index.js';
import { resources, settledResources, expectReleased } from './fixtures/resources.js';

const W = 2;
const H = 128;
const K = 2;
const E = 8;
const MAX_TOKENS = 16;
const buffer = { maxTokensPerRank: MAX_TOKENS, hidden: H, topk: K, numExperts: E, fp8Dispatch: true, cpuBytes: 2 << 20 };
const ENGRAM_ROWS = 4;

/** mulberry32: a small seeded PRNG, so that a failing case can be replayed from its seed. */
function prng(seed: number) {
    let a = seed >>> 0;
    const next = (): number => {
        a = (a + 0x6d2b79f5) >>> 0;
        let t = a;
        t = Math.imul(t ^ (t >>> 15), t | 1);
        t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
        return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
    const int = (lo: number, hi: number): number => lo + Math.floor(next() * (hi - lo + 1));
    return { next, int, pick: <T>(xs: readonly T[]): T => xs[int(0, xs.length - 1)]! };
}
type Rng = ReturnType<typeof prng>;

const bf16 = (rng: Rng, rows: number): Tensor<'bf16'> =>
    tensor('bf16', [rows, H], Uint16Array.from({ length: rows * H }, () => rng.int(0x3c00, 0x4000)));

/** K distinct experts per token, sometimes an unused slot (-1); rank r's first token always reaches every rank. */
function routing(rng: Rng, tokens: number): Int32Array {
    const idx = new Int32Array(tokens * K);
    for (let t = 0; t < tokens; t++) {
        const experts = t === 0 ? [0, E - 1] : [...Array(E).keys()].sort(() => rng.next() - 0.5).slice(0, K);
        experts.forEach((e, k) => { idx[t * K + k] = k > 0 && t > 0 && rng.next() < 0.2 ? -1 : e; });
    }
    return idx;
}

function dispatchInput(rng: Rng, tokens: number): DispatchInput {
    return {
        x: bf16(rng, tokens),
        topkIdx: routing(rng, tokens),
        topkWeights: Float32Array.from({ length: tokens * K }, () => rng.next()),
    };
}

let group: Group;
let tokens: number[];
/** Two dispatches with the same token counts (handles of one and of the other), and one of another group. */
let first: DispatchHandle[];
let second: DispatchHandle[];
let foreign: DispatchHandle;
let bufferBytes: number;

beforeAll(async () => {
    const setup = prng(1);
    group = await createGroup({ ranks: W, backend: 'host', buffer });
    tokens = [setup.int(2, MAX_TOKENS), setup.int(2, MAX_TOKENS)];
    first = (await group.dispatch(tokens.map((t) => dispatchInput(setup, t)))).map((o) => o.handle);
    second = (await group.dispatch(tokens.map((t) => dispatchInput(setup, t)))).map((o) => o.handle);
    await group.engramWrite([tensor('fp32', [ENGRAM_ROWS, 8]), tensor('fp32', [ENGRAM_ROWS, 8])]);
    bufferBytes = (await group.info(0)).bufferBytes;
    const other = await createGroup({ ranks: W, backend: 'host', buffer });
    foreign = (await other.dispatch(tokens.map((t) => dispatchInput(setup, t))))[0]!.handle;
    await other.destroy();
});

afterAll(async () => {
    await group?.destroy();
});

/** One broken call: what to call, and the argument its error must name. */
interface Case {
    kind: string;
    call: () => Promise<unknown>;
    arg: string;
}

/** Copies the per-rank inputs and lets `change` break rank r's. */
function withRank<T, U = T>(inputs: T[], r: number, change: (input: T) => U): Array<T | U> {
    return inputs.map((input, q) => (q === r ? change({ ...input }) : input));
}

const otherRank = (r: number): number => (r + 1) % W;
/** The rank the agreement checks name when rank r disagrees with the others: rank 0 is the reference. */
const disagreeing = (r: number): number => (r === 0 ? 1 : r);

function dispatchCase(rng: Rng): Case {
    const r = rng.int(0, W - 1);
    const inputs = tokens.map((t) => dispatchInput(rng, t));
    const T = tokens[r]!;
    const at = `inputs[${r}]`;
    const broken = (kind: string, arg: string, change: (d: DispatchInput) => DispatchInput): Case =>
        ({ kind, arg, call: () => group.dispatch(withRank(inputs, r, change)) });
    const slot = rng.int(0, T * K - 1);
    const cases: Array<() => Case> = [
        () => ({ kind: 'inputs not an array', arg: 'inputs', call: () => group.dispatch(inputs[0] as never) }),
        () => ({ kind: 'one input per rank', arg: 'inputs', call: () => group.dispatch(inputs.slice(0, rng.int(0, W - 1))) }),
        () => ({ kind: 'input not an object', arg: at, call: () => group.dispatch(inputs.map((d, q) => (q === r ? rng.pick([null, 7, 'x']) : d)) as never) }),
        () => broken('x missing', `${at}.x`, (d) => ({ ...d, x: undefined as never })),
        () => broken('x dtype unknown', `${at}.x.dtype`, (d) => ({ ...d, x: { ...d.x, dtype: rng.pick(['fp16', 'bfloat16', '']) as never } })),
        () => broken('x dtype not dispatchable', `${at}.x.dtype`, (d) => ({ ...d, x: tensor(rng.pick(['fp32', 'int32'] as const), [T, H]) as never })),
        () => broken('x hidden', `${at}.x.shape[1]`, (d) => ({ ...d, x: tensor('bf16', [T, rng.pick([H / 2, H + 8, 1])]) })),
        () => broken('x rank', `${at}.x.shape`, (d) => ({ ...d, x: rng.pick([tensor('bf16', [T * H]), tensor('bf16', [1, T, H])]) })),
        () => broken('x shape not integers', `${at}.x.shape`, (d) => ({ ...d, x: { ...d.x, shape: [rng.pick([T + 0.5, -T, NaN]), H] } })),
        () => broken('too many tokens', `${at}.x.shape[0]`, (d) => ({ ...d, x: bf16(rng, MAX_TOKENS + rng.int(1, 4)) })),
        () => broken('x data class', `${at}.x.data`, (d) => ({ ...d, x: { ...d.x, data: new (rng.pick([Float32Array, Int16Array, Uint8Array]))(T * H) as never } })),
        () => broken('x data length', `${at}.x.data`, (d) => ({ ...d, x: { ...d.x, data: new Uint16Array(T * H + rng.pick([-1, 1, H])) } })),
        () => broken('topkIdx class', `${at}.topkIdx`, (d) => ({ ...d, topkIdx: rng.pick([Uint32Array.from(d.topkIdx!), Float32Array.from(d.topkIdx!), [...d.topkIdx!]]) as never })),
        () => broken('topkIdx length', `${at}.topkIdx`, (d) => ({ ...d, topkIdx: new Int32Array(T * K + rng.pick([-1, 1, K])) })),
        () => broken('topkIdx missing', `${at}.topkIdx`, (d) => ({ ...d, topkIdx: undefined })),
        () => broken('expert id out of range', `${at}.topkIdx[${slot}]`, (d) => {
            const idx = Int32Array.from(d.topkIdx!);
            idx[slot] = rng.pick([E, E + 1, -2, 2 ** 31 - 1, -(2 ** 31)]);
            return { ...d, topkIdx: idx };
        }),
        () => {
            // token t lists one expert twice: the second mention is named
            const t = rng.int(0, T - 1);
            return broken('duplicate expert in a token', `${at}.topkIdx[${t * K + 1}]`, (d) => {
                const idx = Int32Array.from(d.topkIdx!);
                idx[t * K] = rng.int(0, E - 1);
                idx[t * K + 1] = idx[t * K]!;
                return { ...d, topkIdx: idx };
            });
        },
        () => broken('weight not finite', `${at}.topkWeights[${slot}]`, (d) => {
            const w = Float32Array.from(d.topkWeights!);
            w[slot] = rng.pick([NaN, Infinity, -Infinity]);
            return { ...d, topkWeights: w };
        }),
        () => broken('topkWeights class', `${at}.topkWeights`, (d) => ({ ...d, topkWeights: rng.pick([Float64Array.from(d.topkWeights!), Uint16Array.from(d.topkWeights!), [...d.topkWeights!]]) as never })),
        () => broken('topkWeights length', `${at}.topkWeights`, (d) => ({ ...d, topkWeights: new Float32Array(T * K - rng.int(1, K)) })),
        () => broken('topkWeights missing', `${at}.topkWeights`, (d) => ({ ...d, topkWeights: undefined })),
        () => broken('expertAlignment', `${at}.expertAlignment`, (d) => ({ ...d, expertAlignment: rng.pick([0, -4, 1.5, NaN, 2 ** 20, '4']) as never })),
        () => broken('scales with bf16 x', `${at}.scales`, (d) => ({ ...d, scales: tensor('fp32', [T, H / 128]) })),
        () => broken('fp8 x without scales', `${at}.scales`, (d) => ({ ...d, x: tensor('fp8e4m3', [T, H]) })),
        () => broken('fp8 scales shape', `${at}.scales.shape[1]`, (d) => ({ ...d, x: tensor('fp8e4m3', [T, H]), scales: tensor('fp32', [T, rng.pick([2, 4])]) })),
        () => broken('fp8 scales dtype', `${at}.scales.dtype`, (d) => ({ ...d, x: tensor('fp8e4m3', [T, H]), scales: tensor('bf16', [T, H / 128]) as never })),
        () => broken('handle of another rank', `${at}.handle`, (d) => ({ ...d, handle: first[otherRank(r)] })),
        () => broken('handle of another group', `${at}.handle`, (d) => ({ ...d, handle: { ...foreign, rank: r } })),
        () => broken('handle not a handle', `${at}.handle`, (d) => ({ ...d, handle: rng.pick([null, 3, 'h', {}]) as never })),
        () => broken('handle for other token count', `${at}.handle`, (d) => ({ ...d, x: bf16(rng, T - 1), topkIdx: undefined, topkWeights: undefined, handle: first[r] })),
        () => ({
            kind: 'handles of two dispatches', arg: `inputs[${disagreeing(r)}].handle`,
            call: () => group.dispatch(inputs.map((d, q) => ({ x: d.x, handle: (q === r ? second : first)[q] }))),
        }),
        () => ({
            kind: 'a handle on some ranks only', arg: `inputs[${otherRank(r)}].handle`,
            call: () => group.dispatch(inputs.map((d, q) => (q === r ? { x: d.x, handle: first[q] } : d))),
        }),
    ];
    return rng.pick(cases)();
}

function combineCase(rng: Rng): Case {
    const r = rng.int(0, W - 1);
    const inputs = first.map((h) => ({ x: bf16(rng, h.numRecv), handle: h }));
    const R = first[r]!.numRecv;
    const at = `inputs[${r}]`;
    const broken = (kind: string, arg: string, change: (c: (typeof inputs)[number]) => object): Case =>
        ({ kind, arg, call: () => group.combine(withRank(inputs, r, change) as never) });
    const b = rng.int(0, 1);
    const cases: Array<() => Case> = [
        () => broken('handle missing', `${at}.handle`, (c) => ({ ...c, handle: undefined })),
        () => broken('handle of another rank', `${at}.handle`, (c) => ({ ...c, handle: first[otherRank(r)] })),
        () => broken('handle of another group', `${at}.handle`, (c) => ({ ...c, handle: { ...foreign, rank: r } })),
        () => broken('x dtype', `${at}.x.dtype`, () => ({ x: tensor('fp32', [R, H]), handle: first[r] })),
        () => broken('x rows', `${at}.x.shape[0]`, () => ({ x: bf16(rng, R + rng.int(1, 3)), handle: first[r] })),
        () => broken('x hidden', `${at}.x.shape[1]`, () => ({ x: tensor('bf16', [R, H + 8]), handle: first[r] })),
        () => broken('x data class', `${at}.x.data`, (c) => ({ ...c, x: { ...c.x, data: new Float32Array(R * H) } })),
        () => {
            const slot = rng.int(0, R * K - 1);
            return broken('weight not finite', `${at}.topkWeights[${slot}]`, (c) => {
                const w = new Float32Array(R * K);
                w[slot] = rng.pick([NaN, Infinity, -Infinity]);
                return { ...c, topkWeights: w };
            });
        },
        () => broken('topkWeights length', `${at}.topkWeights`, (c) => ({ ...c, topkWeights: new Float32Array(R * K + 1) })),
        () => broken('topkWeights class', `${at}.topkWeights`, (c) => ({ ...c, topkWeights: new Float64Array(R * K) })),
        () => broken('three biases', `${at}.bias`, (c) => ({ ...c, bias: [0, 1, 2].map(() => tensor('bf16', [first[r]!.numTokens, H])) })),
        () => broken('bias rows', `${at}.bias[${b}].shape[0]`, (c) => ({
            ...c, bias: [0, 1].map((i) => tensor('bf16', [first[r]!.numTokens + (i === b ? 1 : 0), H])).slice(0, b + 1),
        })),
        () => broken('bias dtype', `${at}.bias[${b}].dtype`, (c) => ({
            ...c, bias: [0, 1].map((i) => tensor(i === b ? 'fp32' : 'bf16', [first[r]!.numTokens, H])).slice(0, b + 1),
        })),
        () => ({
            kind: 'handles of two dispatches', arg: `inputs[${disagreeing(r)}].handle`,
            call: () => group.combine(first.map((h, q) => { const handle = (q === r ? second : first)[q]!; return { x: bf16(rng, handle.numRecv), handle }; })),
        }),
    ];
    return rng.pick(cases)();
}

/** Broken per-rank tensors for allGather-like calls, checked under `name`. */
function tensorListCase(rng: Rng, call: (ts: Tensor[]) => Promise<unknown>, capacity: number, kind: string): Case {
    const r = rng.int(0, W - 1);
    const rows = rng.int(1, 4);
    const valid = (): Tensor[] => [0, 1].map(() => tensor('fp32', [rows, 3]));
    const replace = (t: unknown): Tensor[] => valid().map((v, q) => (q === r ? t : v)) as Tensor[];
    const cases: Array<() => Case> = [
        () => ({ kind: `${kind}: not an array`, arg: 'tensors', call: () => call(tensor('fp32', [2]) as never) }),
        () => ({ kind: `${kind}: one tensor per rank`, arg: 'tensors', call: () => call([...valid(), ...valid()]) }),
        () => ({ kind: `${kind}: not a tensor`, arg: `tensors[${r}]`, call: () => call(replace(rng.pick([null, 5, 'x']))) }),
        () => ({ kind: `${kind}: dtype`, arg: `tensors[${r}].dtype`, call: () => call(replace({ dtype: rng.pick(['f32', 'float', undefined]), shape: [rows, 3], data: new Float32Array(rows * 3) })) }),
        () => ({ kind: `${kind}: data class`, arg: `tensors[${r}].data`, call: () => call(replace({ dtype: 'fp32', shape: [rows, 3], data: new Int32Array(rows * 3) })) }),
        () => ({ kind: `${kind}: data length`, arg: `tensors[${r}].data`, call: () => call(replace({ dtype: 'fp32', shape: [rows, 3], data: new Float32Array(rows * 3 + 1) })) }),
        () => ({ kind: `${kind}: shape`, arg: `tensors[${r}].shape`, call: () => call(replace({ dtype: 'fp32', shape: [rows + 0.5, 3], data: new Float32Array(rows * 3) })) }),
        () => ({ kind: `${kind}: shapes differ`, arg: `tensors[${disagreeing(r)}].shape`, call: () => call(replace(tensor('fp32', [rows + 1, 3]))) }),
        () => ({ kind: `${kind}: dtypes differ`, arg: `tensors[${disagreeing(r)}].dtype`, call: () => call(replace(tensor('int32', [rows, 3]))) }),
        () => {
            const n = Math.floor(capacity / 4) + 1;
            return { kind: `${kind}: too big`, arg: 'tensors', call: () => call([tensor('fp32', [n]), tensor('fp32', [n])]) };
        },
    ];
    return rng.pick(cases)();
}

function engramCase(rng: Rng): Case {
    const r = rng.int(0, W - 1);
    const total = ENGRAM_ROWS * W;
    const n = rng.int(1, 6);
    const ids = (): Int32Array[] => [0, 1].map(() => Int32Array.from({ length: n }, () => rng.int(0, total - 1)));
    const i = rng.int(0, n - 1);
    const cases: Array<() => Case> = [
        () => {
            const bad = ids();
            bad[r]![i] = rng.pick([-1, total, total + 7, 2 ** 31 - 1]);
            return { kind: 'engram id out of range', arg: `indices[${r}][${i}]`, call: () => group.engramFetch(bad) };
        },
        () => ({
            kind: 'engram ids class', arg: `indices[${r}]`,
            call: () => group.engramFetch(ids().map((x, q) => (q === r ? rng.pick([Uint32Array.from(x), [...x], Float64Array.from(x)]) : x)) as never),
        }),
        () => ({ kind: 'engram ids per rank', arg: 'indices', call: () => group.engramFetch(ids().slice(0, 1)) }),
        () => ({ kind: 'engram table rank', arg: `storages[${r}].shape`, call: () => group.engramWrite([0, 1].map((q) => tensor('fp32', q === r ? [ENGRAM_ROWS * 8] : [ENGRAM_ROWS, 8]))) }),
        () => ({ kind: 'engram table too big', arg: 'buffer.cpuBytes', call: () => group.engramWrite([0, 1].map(() => tensor('fp32', [buffer.cpuBytes / 64 + 1, 16]))) }),
    ];
    return rng.pick(cases)();
}

function otherCase(rng: Rng): Case {
    const cases: Array<() => Case> = [
        () => ({ kind: 'session maxBytes', arg: 'maxBytes', call: () => group.openSession({ maxBytes: rng.pick([0, -64, 1.5, NaN, Infinity, '64']) as never, maxAllGathers: 2 }) }),
        () => ({ kind: 'session maxAllGathers', arg: 'maxAllGathers', call: () => group.openSession({ maxBytes: 64, maxAllGathers: rng.pick([0, -1, 2.5, 1 << 17, null]) as never }) }),
        () => ({ kind: 'session too big for the buffer', arg: 'maxBytes', call: () => group.openSession({ maxBytes: bufferBytes, maxAllGathers: rng.int(1, 8) }) }),
        () => ({ kind: 'session options', arg: 'options', call: () => group.openSession(rng.pick([null, 5, 'x']) as never) }),
        () => ({ kind: 'barrier withCpuSync', arg: 'withCpuSync', call: () => group.barrier({ withCpuSync: rng.pick(['yes', 1, null]) as never }) }),
        () => ({ kind: 'rank program url', arg: 'moduleUrl', call: () => group.run(rng.pick([42, null, {}]) as never) }),
    ];
    return rng.pick(cases)();
}

async function expectRefused(c: Case, seed: number): Promise<void> {
    const outcome = await c.call().then(() => 'resolved', (e: unknown) => e);
    const where = `seed ${seed}, ${c.kind}`;
    expect(outcome, where).toBeInstanceOf(RankflowError);
    const e = outcome as RankflowError;
    expect(e.code, `${where}: ${e.message}`).toBe('EINVAL');
    expect(e.message.startsWith(`${c.arg}: `), `${where}: '${e.message}' should start with '${c.arg}: '`).toBe(true);
}

/** Every rank where it was, with the seq it had: nothing moved. */
function expectUnmoved(before: ReturnType<Group['snapshot']>, state: string): void {
    expect(group.snapshot()).toEqual(before);
    expect(group.snapshot().map((s) => s.state)).toEqual(Array(W).fill(state));
}

async function expectAllGatherWorks(rng: Rng): Promise<void> {
    const inputs = [0, 1].map((r) => tensor('int32', [2, 3], Int32Array.from({ length: 6 }, (_, i) => r * 100 + i + rng.int(0, 9) * 1000)));
    const out = await group.allGather(inputs);
    const expected = [...inputs[0]!.data, ...inputs[1]!.data];
    for (const o of out) expect([...o.data]).toEqual(expected);
}

describe('fuzzed inputs of every collective (seeded)', () => {
    const SEEDS = 400;

    test(`${SEEDS} broken calls are each refused with EINVAL naming the argument; no rank moves`, async () => {
        const before = group.snapshot();
        const kinds = new Set<string>();
        for (let seed = 1; seed <= SEEDS; seed++) {
            const rng = prng(seed);
            const c = rng.pick([
                dispatchCase, dispatchCase, combineCase, engramCase, otherCase,
                (g: Rng) => tensorListCase(g, (ts) => group.allGather(ts), bufferBytes, 'allGather'),
                (g: Rng) => tensorListCase(g, (ts) => group.ppExchange(ts), bufferBytes, 'ppExchange'),
            ])(rng);
            kinds.add(c.kind);
            await expectRefused(c, seed);
            if (seed % 100 === 0) expectUnmoved(before, 'ready');
        }
        expect(kinds.size).toBeGreaterThan(60);
        expectUnmoved(before, 'ready');
    });

    test('after them, a correct dispatch, cached dispatch, combine and allGather still work', async () => {
        const rng = prng(7);
        const inputs = tokens.map((t) => dispatchInput(rng, t));
        const out = await group.dispatch(inputs);
        // each rank receives, from each source rank in order, the tokens routed to one of its experts
        for (let r = 0; r < W; r++) {
            const owns = (e: number): boolean => e >= 0 && Math.floor(e / (E / W)) === r;
            const expected = inputs.flatMap((d, src) => [...Array(tokens[src]).keys()]
                .filter((t) => [...d.topkIdx!.subarray(t * K, t * K + K)].some(owns)).map((t) => [src, t]));
            expect([...out[r]!.srcRank].map((s, i) => [s, out[r]!.srcToken[i]])).toEqual(expected);
        }
        const cached = await group.dispatch(inputs.map((d, r) => ({ x: d.x, handle: out[r]!.handle })));
        expect(cached.map((o) => [...o.srcToken])).toEqual(out.map((o) => [...o.srcToken]));
        const back = await group.combine(out.map((o) => ({ x: o.x, handle: o.handle })));
        expect(back.map((b) => b.x.shape)).toEqual(tokens.map((t) => [t, H]));
        await expectAllGatherWorks(rng);
        expect(group.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
    });

    test('inside an AGRS session: broken session calls are refused, the ranks stay in the session, and it still works', async () => {
        const maxBytes = 256;
        const session = await group.openSession({ maxBytes, maxAllGathers: 8 });
        const before = group.snapshot();
        for (let seed = 1000; seed < 1100; seed++) {
            const rng = prng(seed);
            const r = rng.int(0, W - 1);
            const c: Case = rng.pick<() => Case>([
                () => tensorListCase(rng, (ts) => session.allGather(ts), maxBytes * W, 'session allGather'),
                () => {
                    const n = maxBytes / 4 + rng.int(1, 9);
                    return { kind: 'session allGather over maxBytes', arg: 'tensors', call: () => session.allGather([0, 1].map(() => tensor('fp32', [n]))) };
                },
                () => ({ kind: 'reduceScatter dtype', arg: `tensors[${r}].dtype`, call: () => session.reduceScatter([0, 1].map((q) => tensor(q === r ? rng.pick(['int32', 'fp8e4m3'] as const) : 'fp32', [2 * W]))) }),
                () => ({ kind: 'reduceScatter rows', arg: `tensors[${r}].shape[0]`, call: () => session.reduceScatter([0, 1].map((q) => tensor('fp32', [q === r ? 2 * W + 1 : 2 * W]))) }),
                () => ({ kind: 'reduceScatter over maxBytes', arg: 'tensors', call: () => session.reduceScatter([0, 1].map(() => tensor('fp32', [W * (maxBytes / 4 + 1)]))) }),
            ])();
            await expectRefused(c, seed);
        }
        expect(group.snapshot()).toEqual(before);
        expect(group.snapshot().map((s) => s.state)).toEqual(['session.open', 'session.open']);
        const u = [0, 1].map((r) => tensor('fp32', [W * 2], Float32Array.from({ length: W * 2 }, (_, i) => r * 10 + i)));
        const rs = await session.reduceScatter(u);
        // rs[r] = sum over ranks q of u_q rows [r*2, r*2+2)
        expect(rs.map((t) => [...t.data])).toEqual([[0 + 10, 1 + 11], [2 + 12, 3 + 13]]);
        await session.close();
        expect(group.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
    });
});

describe('createGroup with bad options', () => {
    const good: GroupOptions = { ranks: 2, backend: 'host', buffer: { maxTokensPerRank: 8, hidden: 64, topk: 2, numExperts: 8 } };
    const withBuffer = (b: object): GroupOptions => ({ ...good, buffer: { ...good.buffer, ...b } });
    const cases: Array<[string, unknown, string]> = [
        ['no options', undefined, 'options'],
        ['ranks 0', { ...good, ranks: 0 }, 'ranks'],
        ['ranks 65', { ...good, ranks: 65 }, 'ranks'],
        ['ranks 1.5', { ...good, ranks: 1.5 }, 'ranks'],
        ['ranks as a string', { ...good, ranks: '2' }, 'ranks'],
        ['numExperts not divisible by ranks', { ...good, ranks: 3 }, 'buffer.numExperts'],
        ['no buffer', { ...good, buffer: undefined }, 'buffer'],
        ['maxTokensPerRank 0', withBuffer({ maxTokensPerRank: 0 }), 'buffer.maxTokensPerRank'],
        ['hidden not a multiple of 8', withBuffer({ hidden: 60 }), 'buffer.hidden'],
        ['hidden not a multiple of 128 for fp8', withBuffer({ hidden: 64, fp8Dispatch: true }), 'buffer.hidden'],
        ['topk 0', withBuffer({ topk: 0 }), 'buffer.topk'],
        ['topk above numExperts', withBuffer({ topk: 9 }), 'buffer.topk'],
        ['negative cpuBytes', withBuffer({ cpuBytes: -1 }), 'buffer.cpuBytes'],
        ['fractional cpuBytes', withBuffer({ cpuBytes: 1.5 }), 'buffer.cpuBytes'],
        ['bytes too small for the workspace', withBuffer({ bytes: 4096 }), 'buffer.bytes'],
        ['fp8Dispatch not a boolean', withBuffer({ fp8Dispatch: 'yes' }), 'buffer.fp8Dispatch'],
        ['bad backend string', { ...good, backend: 'gpu' }, 'backend'],
        ['ranksPerNode not dividing ranks', { ...good, ranks: 4, ranksPerNode: 3 }, 'ranksPerNode'],
        ['timeouts not an object', { ...good, timeouts: 5 }, 'timeouts'],
        ['cpuSeconds 0', { ...good, timeouts: { cpuSeconds: 0 } }, 'timeouts.cpuSeconds'],
        ['cpuSeconds negative', { ...good, timeouts: { cpuSeconds: -1 } }, 'timeouts.cpuSeconds'],
        ['cpuSeconds NaN', { ...good, timeouts: { cpuSeconds: NaN } }, 'timeouts.cpuSeconds'],
        // a 32-bit setTimeout fires at once for these: the backstop would fail every op
        ['cpuSeconds Infinity', { ...good, timeouts: { cpuSeconds: Infinity } }, 'timeouts.cpuSeconds'],
        ['gpuSeconds beyond a 32-bit timer', { ...good, timeouts: { gpuSeconds: 3e6 } }, 'timeouts.gpuSeconds'],
        ['gpuSeconds as a string', { ...good, timeouts: { gpuSeconds: '10' } }, 'timeouts.gpuSeconds'],
        ['inspect not a function', { ...good, inspect: 'yes' }, 'inspect'],
    ];

    test.each(cases)('%s: EINVAL naming %j, and no worker, fd or mapping is left', async (_, opts, arg) => {
        const before = resources();
        const outcome = await createGroup(opts as GroupOptions).then(async (g) => { await g.destroy(); return 'created'; }, (e: unknown) => e);
        expect(outcome).toBeInstanceOf(RankflowError);
        expect((outcome as RankflowError).code).toBe('EINVAL');
        expect((outcome as RankflowError).message.startsWith(`${arg}: `), (outcome as RankflowError).message).toBe(true);
        expectReleased(await settledResources(before), before);
    });
});
