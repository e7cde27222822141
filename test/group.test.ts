// A group of host ranks lives, synchronises and dies correctly: lifecycle, barrier, allGather,
// symmetric memory kinds and peer translation, domains, input checks and clean teardown.
import { readdirSync, readFileSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';

import { createGroup, RankflowError, sizeHint, tensor, type Group, type TransitionEvent } from '../actors/index.js';
import { loadAddon } from '../actors/core/addon.js';

const buffer = { maxTokensPerRank: 32, hidden: 128, topk: 2, numExperts: 24 };
const MiB2 = 2 * 1024 * 1024;
const openFds = (): number => readdirSync('/proc/self/fd').length;
const rankflowMappings = (): number => readFileSync('/proc/self/maps', 'utf8').split('\n').filter((l) => l.includes('rankflow-r')).length;

let live: Group[] = [];
async function group(opts: Partial<Parameters<typeof createGroup>[0]> & { ranks: number }): Promise<Group> {
  const g = await createGroup({ backend: 'host', buffer, ...opts });
  live.push(g);
  return g;
}
afterEach(async () => {
  await Promise.all(live.map((g) => g.destroy()));
  live = [];
});

describe.each([1, 2, 3, 4, 8])('a group of %i host ranks', (ranks) => {
  it('goes init -> registerWindow -> ready, synchronises, gathers exactly, and ends destroyed', async () => {
    const seen: TransitionEvent[] = [];
    const g = await createGroup({ ranks, backend: 'host', buffer, observers: [{ attach: (grp) => { grp.on('transition', (t) => seen.push(t)); return () => {}; } }] });
    live.push(g);
    expect(g.size).toBe(ranks);
    expect(g.backend).toBe('host');
    expect(g.snapshot().map((s) => s.state)).toEqual(Array(ranks).fill('ready'));
    for (let r = 0; r < ranks; r++) {
      expect(seen.filter((t) => t.rank === r).map((t) => t.to)).toEqual(['registerWindow', 'ready']);
    }

    await g.barrier();
    await g.barrier({ withCpuSync: true });
    // one state per barrier; the record of its end names the rounds it went through
    const cpuSync = seen.filter((t) => t.from === 'barrier' && t.phases?.includes('cpuSync'));
    expect(cpuSync).toHaveLength(ranks);

    const inputs = Array.from({ length: ranks }, (_, r) => tensor('int32', [3, 2], Int32Array.from({ length: 6 }, (_, i) => r * 100 + i)));
    const out = await g.allGather(inputs);
    const expected = Int32Array.from({ length: ranks * 6 }, (_, i) => Math.floor(i / 6) * 100 + (i % 6));
    for (const o of out) {
      expect(o.shape).toEqual([ranks * 3, 2]);
      expect(Array.from(o.data)).toEqual(Array.from(expected));
    }

    await g.destroy();
    expect(g.snapshot().map((s) => s.state)).toEqual(Array(ranks).fill('destroyed'));
  });
});

describe('symmetric memory', () => {
  it('picks the memory kind by the seed rule: no host bytes -> gpu, hybrid -> hybrid, else elastic', async () => {
    const gpu = await group({ ranks: 2 });
    const hybrid = await group({ ranks: 2, buffer: { ...buffer, cpuBytes: 1 << 20 } });
    const elastic = await group({ ranks: 2, buffer: { ...buffer, cpuBytes: 1 << 20, hybrid: false } });
    expect((await gpu.info(0)).memoryKind).toBe('gpu');
    expect((await hybrid.info(1)).memoryKind).toBe('hybrid');
    expect((await elastic.info(0)).memoryKind).toBe('elastic');
    expect((await hybrid.info(0)).cpuBytes).toBe(MiB2);  // 1 MiB rounded up to the 2 MiB alignment
  });

  it('aligns windows and sizes to 2 MiB and places rank p at base + p * stride', async () => {
    const g = await group({ ranks: 4 });
    for (let r = 0; r < 4; r++) {
      const info = await g.info(r);
      expect(info.symmetricBytes % MiB2).toBe(0);
      expect(info.workspaceBytes % MiB2).toBe(0);
      expect(Number(info.window % BigInt(MiB2))).toBe(0);
      expect(info.window).toBe(info.peerWindows[r]);
      const base = info.peerWindows[0]!;
      info.peerWindows.forEach((w, p) => expect(w).toBe(base + BigInt(p * info.stride)));
    }
  });

  it("translates a pointer to a peer's window: bytes written through it land in the peer's memory", async () => {
    const g = await group({ ranks: 3 });
    const info0 = await g.info(0);
    const offset = info0.workspaceBytes + 4096;
    const payload = Uint8Array.from({ length: 64 }, (_, i) => i * 3);
    const addr = await g.writePeer(0, 2, offset, payload);
    expect(addr).toBe(info0.peerWindows[2]! + BigInt(offset));
    expect(Array.from(await g.readWindow(2, offset, 64))).toEqual(Array.from(payload));
    expect(Array.from(await g.readWindow(1, offset, 64))).toEqual(Array(64).fill(0));
  });

  it('maps a hybrid rank\'s scale-up peers\' host segments into its own window', async () => {
    const g = await group({ ranks: 4, ranksPerNode: 2, buffer: { ...buffer, cpuBytes: MiB2 } });
    const info = await g.info(1);
    // own window: [device segment][host segment of scale-up rank 0][of rank 1]
    expect(info.stride).toBe(info.symmetricBytes + 2 * MiB2);
  });
});

describe('domains', () => {
  it('hybrid: scale-up is the NVLink domain and scale-out the nodes', async () => {
    const g = await group({ ranks: 4, ranksPerNode: 2 });
    expect((await g.info(3)).domains).toEqual({
      numNvlRanks: 2, numRdmaRanks: 2, nvlRankIdx: 1, rdmaRankIdx: 1,
      numScaleupRanks: 2, numScaleoutRanks: 2, scaleupRankIdx: 1, scaleoutRankIdx: 1, isScaleupNvlink: true,
    });
  });

  it('without hybrid the whole group is one logical scale-up domain', async () => {
    const g = await group({ ranks: 4, ranksPerNode: 2, buffer: { ...buffer, hybrid: false } });
    expect((await g.info(3)).domains).toMatchObject({ numNvlRanks: 2, numScaleupRanks: 4, numScaleoutRanks: 1, scaleupRankIdx: 3, isScaleupNvlink: false });
  });
});

describe('input checks', () => {
  it('rejects mismatched allGather inputs with EINVAL naming the argument, before any rank moves', async () => {
    const g = await group({ ranks: 2 });
    let moves = 0;
    g.on('transition', () => moves++);
    const err = await g.allGather([tensor('fp32', [4]), tensor('fp32', [5])]).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RankflowError);
    expect(err).toMatchObject({ code: 'EINVAL' });
    expect((err as Error).message).toMatch(/^tensors\[1\]\.shape/);
    expect(moves).toBe(0);
    expect(g.snapshot().map((s) => s.state)).toEqual(['ready', 'ready']);
    await expect(g.allGather([tensor('fp32', [2]), tensor('fp32', [2])])).resolves.toHaveLength(2);
  });

  it('rejects an allGather larger than the buffer with EINVAL that says how many bytes', async () => {
    const g = await group({ ranks: 2 });
    const { bufferBytes } = await g.info(0);
    const big = bufferBytes / 4;  // fp32 elements: W * bytes = 2 * bufferBytes
    await expect(g.allGather([tensor('fp32', [big]), tensor('fp32', [big])])).rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/buffer bytes/) });
  });

  it.each([
    [{ ranks: 0 }, /^ranks/],
    [{ ranks: 2, buffer: { ...buffer, numExperts: 7 } }, /^buffer\.numExperts/],
    [{ ranks: 5 }, /^buffer\.numExperts/],
    [{ ranks: 2, buffer: { ...buffer, hidden: 100 } }, /^buffer\.hidden/],
    [{ ranks: 2, backend: 'tpu' }, /^backend/],
    [{ ranks: 2, timeouts: { cpuSeconds: -1 } }, /^timeouts\.cpuSeconds/],
    [{ ranks: 4, ranksPerNode: 3 }, /^ranksPerNode/],
    [{ ranks: 2, buffer: { ...buffer, cpuBytes: 2 ** 46 } }, /^buffer\.bytes \/ buffer\.cpuBytes: cannot reserve/],
  ])('createGroup(%o) is EINVAL naming the argument and leaves nothing behind', async (opts, message) => {
    const fds = openFds();
    const err = await createGroup({ backend: 'host', buffer, ...(opts as object) } as never).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'EINVAL', message: expect.stringMatching(message) });
    expect(openFds()).toBe(fds);
  });

  it('answers STATE once the group is destroyed', async () => {
    const g = await group({ ranks: 2 });
    await g.destroy();
    await expect(g.barrier()).rejects.toMatchObject({ code: 'STATE' });
    await g.destroy();  // twice is fine
  });
});

describe('teardown', () => {
  it('destroy() releases every fd and mapping', async () => {
    const fds = openFds();
    const maps = rankflowMappings();
    const g = await createGroup({ ranks: 4, backend: 'host', buffer: { ...buffer, cpuBytes: MiB2 } });
    expect(openFds()).toBeGreaterThan(fds);
    expect(rankflowMappings()).toBeGreaterThan(maps);
    await g.barrier();
    await g.destroy();
    expect(openFds()).toBe(fds);
    expect(rankflowMappings()).toBe(maps);
  });
});

describe('observation', () => {
  it('hands every xstate inspection record to `inspect`, tagged with its rank', async () => {
    const records: Array<Record<string, unknown>> = [];
    const g = await group({ ranks: 2, inspect: (r) => records.push(r) });
    await g.barrier();
    const ranks = new Set(records.map((r) => r.rank));
    expect(ranks).toEqual(new Set([0, 1]));
    expect(records.some((r) => r.type === '@xstate.event' && (r.event as { type: string }).type === 'BARRIER')).toBe(true);
    expect(records.every((r) => JSON.stringify(r) !== undefined)).toBe(true);  // plain data
  });
});

describe('layouts and size hints', () => {
  it('sizeHint is 2 MiB aligned, covers workspace + receive regions, and grows with tokens', () => {
    const cfg = { maxTokensPerRank: 4096, hidden: 7168, topk: 8, numExperts: 256 };
    const h = sizeHint(cfg, 8);
    expect(h % MiB2).toBe(0);
    const l = loadAddon().layout(cfg, 8);
    expect(h).toBe(l.workspace.bytes + l.buffer.bytes);
    expect(l.buffer.bytes).toBeGreaterThanOrEqual(8 * 4096 * 7168 * 2);  // every source's worst case, bf16
    expect(sizeHint({ ...cfg, maxTokensPerRank: 8192 }, 8)).toBeGreaterThan(h);
    expect(() => sizeHint(cfg, 0)).toThrow(/^worldSize/);
  });

  it('a signal slot is a cache line: the 64-bit sequence number of the op that wrote it, then its payload and tag', async () => {
    const l = loadAddon().layout({ maxTokensPerRank: 4096, hidden: 7168, topk: 8, numExperts: 256 }, 4);
    expect(l.workspace.slotBytes).toBe(64);
    expect([l.workspace.seqWord, l.workspace.payloadWord, l.workspace.tagWord]).toEqual([0, 1, 2]);
    const group = await createGroup({ backend: 'host', ranks: 2, buffer: { maxTokensPerRank: 4, hidden: 8, topk: 1, numExperts: 2 } });
    try {
      for (let i = 0; i < 3; i++) await group.barrier();
      // Rank 1's barrier slot in rank 0's workspace holds the sequence number of the last barrier.
      const small = loadAddon().layout({ maxTokensPerRank: 4, hidden: 8, topk: 1, numExperts: 2 }, 2).workspace;
      const slot = await group.readWindow(0, small.barrier + 1 * small.slotBytes, 8);
      const seq = new BigUint64Array(slot.buffer, slot.byteOffset, 1)[0]!;
      expect(Number(seq)).toBe((await group.info(0)).seq);
    } finally {
      await group.destroy();
    }
  });
});
