// createGroup({ inspect: 'http://127.0.0.1:PORT' }) serves the live inspector page for that group.
import { describe, expect, it, vi } from 'vitest';

import { createGroup } from '../actors/index.js';
import { freePort } from './helpers/children.js';

describe("createGroup's inspect URL", () => {
  it('serves the page, the machine and live rank states on loopback while the group lives', async () => {
    const port = await freePort();
    const group = await createGroup({ ranks: 2, backend: 'host', buffer: { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 8 }, inspect: `http://127.0.0.1:${port}` });
    try {
      const page = await fetch(`http://127.0.0.1:${port}/`);
      expect(page.status).toBe(200);
      expect(await page.text()).toContain('data-rank');
      const machine = (await (await fetch(`http://127.0.0.1:${port}/machine`)).json()) as { states: string[] };
      expect(machine.states).toEqual(expect.arrayContaining(['ready', 'dispatching.cpuSync', 'session.open', 'failed']));
      await group.barrier();
      const snapshot = JSON.stringify(await (await fetch(`http://127.0.0.1:${port}/snapshot`)).json());
      expect(snapshot).toContain('ready');
    } finally {
      await group.destroy();
    }
    await expect(fetch(`http://127.0.0.1:${port}/`)).rejects.toThrow();  // closed with the group
  });

  it("with port 0 serves on a free port, and says which in group.inspectorUrl and on stderr", async () => {
    const printed: string[] = [];
    const spy = vi.spyOn(process.stderr, 'write').mockImplementation((chunk: string | Uint8Array) => {
      printed.push(String(chunk));
      return true;
    });
    let group;
    try {
      group = await createGroup({ ranks: 2, backend: 'host', buffer: { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 8 }, inspect: 'http://127.0.0.1:0' });
    } finally {
      spy.mockRestore();
    }
    try {
      const url = group.inspectorUrl!;
      expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/$/);
      expect(new URL(url).port).not.toBe('0');
      expect(printed).toContain(`rankflow: inspector at ${url}\n`);
      const snapshot = (await (await fetch(new URL('snapshot', url))).json()) as { size: number };
      expect(snapshot.size).toBe(2);
    } finally {
      await group.destroy();
    }
  });

  it('group.inspectorUrl is undefined without an inspect URL', async () => {
    const group = await createGroup({ ranks: 2, backend: 'host', buffer: { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 8 } });
    try {
      expect(group.inspectorUrl).toBeUndefined();
    } finally {
      await group.destroy();
    }
  });

  it('refuses an address that is not loopback with EINVAL naming inspect, before any rank starts', async () => {
    await expect(createGroup({ ranks: 2, backend: 'host', buffer: { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 8 }, inspect: 'http://10.1.2.3:9230' }))
      .rejects.toMatchObject({ code: 'EINVAL', message: expect.stringMatching(/^inspect/) });
  });
});
