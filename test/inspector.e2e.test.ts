/**
 * The inspector page in a real headless browser (Debian's chromium through playwright-core): a
 * fake group of four ranks goes init -> registerWindow -> ready, runs a barrier, and is destroyed,
 * and the page shows each rank reach `ready` and then `destroyed`, draws the timeline, and loads
 * nothing but what the inspector serves. Its event log is in time order whatever order events
 * arrive in, and the timeline's labels, measured by the browser, never overlap or leave the
 * drawing. .ci/install-chromium.sh installs the browser.
 */
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { attachInspector, startInspectorServer, type InspectorHandle } from '../actors/observe/inspector.js';
import type { MachineDescription } from '../actors/observe/machine-graph.js';
import { epochNow } from '../actors/observe/observer.js';
import { renderTimelineSvg, type TimelineRecording } from '../actors/observe/timeline.js';
import { FakeGroup } from './fixtures/fake-group.js';
import { recordedRun } from './fixtures/recorded-run.js';

/** A real recording of `rankflow demo --quiet --rounds 3` (4 host ranks): 290 ms of start-up, then short ops. */
const demoRun = JSON.parse(readFileSync(new URL('./fixtures/demo-run.json', import.meta.url), 'utf8')) as TimelineRecording;

const CHROMIUM = '/usr/bin/chromium';
const RANKS = 4;

const machine: MachineDescription = {
    states: [
        'init', 'registerWindow', 'ready', 'barrier', 'session', 'session.opening', 'session.open',
        'destroying', 'destroyed', 'failed'
    ],
    transitions: [
        { from: 'init', to: 'registerWindow', event: 'xstate.done.actor.init' },
        { from: 'registerWindow', to: 'ready', event: 'xstate.done.actor.registerWindow' },
        { from: 'ready', to: 'barrier', event: 'BARRIER' },
        { from: 'barrier', to: 'ready', event: 'xstate.done.actor.barrier' },
        { from: 'ready', to: 'destroying', event: 'DESTROY' },
        { from: 'destroying', to: 'destroyed', event: 'xstate.done.actor.destroy' }
    ]
};

if (!existsSync(CHROMIUM)) {
    console.warn(`inspector.e2e: skipped, ${CHROMIUM} is missing; run .ci/install-chromium.sh (apt-get install chromium)`);
}

describe.skipIf(!existsSync(CHROMIUM))('inspector page in chromium', () => {
    let browser: BrowserContext;
    let profile: string;

    beforeAll(async () => {
        profile = await mkdtemp(join(tmpdir(), 'rankflow-chromium-'));
        // The network here is closed: every flag below keeps chromium from trying to reach out
        // (and from stalling on it). A fresh profile (--user-data-dir, which playwright takes as
        // the persistent context's directory) keeps runs independent.
        browser = await chromium.launchPersistentContext(profile, {
            headless: true,
            viewport: { width: 1280, height: 900 },
            executablePath: CHROMIUM,
            args: [
                '--no-sandbox',
                '--disable-gpu',
                '--disable-quic',
                '--no-first-run',
                '--disable-background-networking',
                '--disable-component-update',
                '--disable-sync'
            ]
        });
    }, 60_000);

    afterAll(async () => {
        await browser?.close();
        if (profile) await rm(profile, { recursive: true, force: true });
    });

    async function openPage(url: string): Promise<{ page: Page; requests: string[]; errors: string[] }> {
        const page = await browser.newPage();
        const requests: string[] = [];
        const errors: string[] = [];
        page.on('request', (request) => requests.push(request.url()));
        page.on('pageerror', (error) => errors.push(error.message));
        page.on('console', (message) => {
            if (message.type() === 'error') errors.push(message.text());
        });
        await page.goto(url);
        return { page, requests, errors };
    }

    async function statesOf(page: Page): Promise<string[]> {
        const states: string[] = [];
        for (let rank = 0; rank < RANKS; rank++) {
            states.push((await page.locator(`[data-rank="${rank}"] [data-role="state"]`).textContent()) ?? '');
        }
        return states;
    }

    async function waitForAll(page: Page, state: string): Promise<void> {
        for (let rank = 0; rank < RANKS; rank++) {
            await expect
                .poll(() => page.locator(`[data-rank="${rank}"] [data-role="state"]`).textContent(), { timeout: 10_000 })
                .toBe(state);
        }
    }

    test('follows a live run: every rank reaches ready, then destroyed', async () => {
        const group = new FakeGroup(RANKS);
        let inspector: InspectorHandle | undefined;
        let page: Page | undefined;
        try {
            inspector = await attachInspector(group, { port: 0, machine, title: 'e2e run' });
            const opened = await openPage(inspector.url);
            page = opened.page;
            await expect.poll(() => page!.locator('[data-role="connection"]').textContent()).toBe('live');
            await waitForAll(page, 'init');

            group.moveAll('registerWindow', 'xstate.done.actor.init');
            await waitForAll(page, 'registerWindow');
            group.moveAll('ready', 'xstate.done.actor.registerWindow');
            await waitForAll(page, 'ready');
            expect(await statesOf(page)).toEqual(['ready', 'ready', 'ready', 'ready']);

            // The machine drawing follows: `ready` is the highlighted box of every rank.
            for (let rank = 0; rank < RANKS; rank++) {
                await expect
                    .poll(() => page!.locator(`[data-rank="${rank}"] .box.active`).getAttribute('data-path'))
                    .toBe('ready');
            }

            group.moveAll('barrier', 'BARRIER', { op: 'barrier', seq: 1 });
            group.moveAll('ready', 'xstate.done.actor.barrier', { op: 'barrier', seq: 1 });
            group.moveAll('destroying', 'DESTROY');
            group.moveAll('destroyed', 'xstate.done.actor.destroy');
            await waitForAll(page, 'destroyed');

            // The timeline is drawn on the page: a lane per rank, the barrier lined up across all four.
            await expect.poll(() => page!.locator('[data-role="timeline"] [data-lane]').count()).toBe(RANKS);
            await expect
                .poll(() => page!.locator('[data-role="timeline"] [data-collective="barrier#1"]').getAttribute('data-ranks'))
                .toBe(String(RANKS));
            await expect
                .poll(() => page!.locator('[data-role="timeline"] [data-lane="0"] [data-state]').count())
                .toBe(7); // init, registerWindow, ready, barrier, ready, destroying, destroyed

            const origin = new URL(inspector.url).origin;
            expect(opened.requests.filter((url) => !url.startsWith(origin))).toEqual([]);
            expect(opened.errors).toEqual([]);
        } finally {
            await page?.close();
            await inspector?.close();
        }
    }, 60_000);

    test('a page opened after the run replays it, failures included', async () => {
        const group = new FakeGroup(RANKS);
        const inspector = await attachInspector(group, { port: 0, machine });
        let page: Page | undefined;
        try {
            group.moveAll('registerWindow', 'xstate.done.actor.init');
            group.moveAll('ready', 'xstate.done.actor.registerWindow');
            group.moveAll('barrier', 'BARRIER', { op: 'barrier', seq: 1 });
            group.move(3, 'failed', 'TIMEOUT_CPU', { op: 'barrier', seq: 1, phase: 'barrier.wait' });
            group.fail(3, { code: 'TIMEOUT_CPU', message: 'barrier #1 waited 300 s', rank: 3, state: 'barrier' });

            const opened = await openPage(inspector.url);
            page = opened.page;
            await expect.poll(() => statesOf(page!)).toEqual(['barrier', 'barrier', 'barrier', 'failed']);
            await expect
                .poll(() => page!.locator('[data-rank="3"] [data-role="failure"]').textContent())
                .toBe('TIMEOUT_CPU in barrier.wait: barrier #1 waited 300 s');
            await expect
                .poll(() => page!.locator('[data-role="timeline"] [data-failure="timeout"]').getAttribute('data-phase'))
                .toBe('barrier.wait');
            expect(opened.errors).toEqual([]);
        } finally {
            await page?.close();
            await inspector.close();
        }
    }, 60_000);
    /**
     * Every problem with the labels of the timeline SVG under `selector`, as the browser lays them
     * out: two labels whose boxes overlap (op labels, state labels, the title and the summary), a
     * label past the drawing's left or right edge, a state label that leaves its bar. Also how
     * many labels of each kind there are.
     */
    async function labelProblems(page: Page, selector: string) {
        return page.locator(selector).first().evaluate((svg) => {
            const edge = svg.getBoundingClientRect();
            const labels = [...svg.querySelectorAll('text[data-label]')].map((t) => ({
                kind: t.getAttribute('data-label')!,
                text: t.textContent!,
                box: t.getBoundingClientRect(),
                bar: t.getAttribute('data-label') === 'state' ? t.parentElement!.querySelector('rect')!.getBoundingClientRect() : null
            }));
            const problems: string[] = [];
            const slack = 0.5;
            for (const a of labels) {
                if (a.box.left < edge.left - slack || a.box.right > edge.right + slack) problems.push(`'${a.text}' leaves the drawing`);
                if (a.bar && (a.box.left < a.bar.left - slack || a.box.right > a.bar.right + slack)) problems.push(`'${a.text}' leaves its bar`);
            }
            labels.forEach((a, i) => {
                for (const b of labels.slice(i + 1)) {
                    const apart = a.box.right <= b.box.left + slack || b.box.right <= a.box.left + slack ||
                        a.box.bottom <= b.box.top + slack || b.box.bottom <= a.box.top + slack;
                    if (!apart) problems.push(`'${a.text}' overlaps '${b.text}'`);
                }
            });
            const count = (kind: string) => labels.filter((l) => l.kind === kind).length;
            return { problems, collective: count('collective'), state: count('state') };
        });
    }

    test('timeline labels never overlap and stay inside the drawing, at any width', async () => {
        const page = await browser.newPage();
        try {
            for (const [name, recording] of [['demo', demoRun], ['recorded run', recordedRun]] as const) {
                for (const width of [480, 960, 1400]) {
                    const title = `rankflow timeline: the ${name}, drawn ${width} px wide to see what gives way`;
                    await page.setContent(`<!doctype html><body style="margin:0">${renderTimelineSvg(recording, { width, title })}</body>`);
                    const found = await labelProblems(page, 'svg[data-timeline]');
                    expect({ name, width, problems: found.problems }).toEqual({ name, width, problems: [] });
                    expect(found.collective).toBeGreaterThan(2);
                    expect(found.state).toBeGreaterThan(2);
                }
            }
        } finally {
            await page.close();
        }
    }, 60_000);

    test('the page draws a run like the demo with its start-up shrunk and its op labels apart', async () => {
        const group = new FakeGroup(demoRun.size);
        const server = await startInspectorServer({ port: 0, machine });
        let page: Page | undefined;
        try {
            const detach = server.attach(group);
            // The demo's transitions again, moved to now so they come after the inspector started.
            const shift = epochNow() - demoRun.startedAt;
            for (const t of demoRun.transitions) {
                group.move(t.rank, t.to, t.event, { at: t.at + shift, ...(t.op ? { op: t.op } : {}), ...(t.seq !== undefined ? { seq: t.seq } : {}) });
            }
            detach();
            const opened = await openPage(server.url);
            page = opened.page;
            await expect.poll(() => page!.locator('[data-role="timeline"] [data-lane]').count()).toBe(demoRun.size);
            expect(await page.locator('[data-role="timeline"] [data-break]').count()).toBeGreaterThan(0);
            const found = await labelProblems(page, '[data-role="timeline"] svg');
            expect(found.problems).toEqual([]);
            expect(found.collective).toBeGreaterThan(2);
            expect(opened.errors).toEqual([]);
        } finally {
            await page?.close();
            await server.close();
        }
    }, 60_000);

    test('keeps the event log in time order, whatever order the events arrive in', async () => {
        const group = new FakeGroup(2);
        const inspector = await attachInspector(group, { port: 0, machine });
        let page: Page | undefined;
        try {
            const opened = await openPage(inspector.url);
            page = opened.page;
            await expect.poll(() => page!.locator('[data-role="connection"]').textContent()).toBe('live');
            // Rank 1's report comes first though rank 0 moved earlier (workers report in batches),
            // and a failure, stamped when reported, is older than both (they are a minute ahead).
            const later = epochNow() + 60_000;
            group.move(1, 'registerWindow', 'xstate.done.actor.init', { at: later + 20 });
            group.move(0, 'registerWindow', 'xstate.done.actor.init', { at: later + 10 });
            group.fail(0, { code: 'TIMEOUT_CPU', message: 'registerWindow waited too long', rank: 0 });
            await expect.poll(() => page!.locator('[data-role="log"] li').count()).toBe(3);
            const read = () => page!.locator('[data-role="log"] li').evaluateAll((items) =>
                items.map((li) => ({ at: Number(li.getAttribute('data-at')), text: li.textContent! })));
            const lines = await read();
            expect(lines.map((l) => l.at)).toEqual([...lines.map((l) => l.at)].sort((a, b) => a - b));
            expect(lines.map((l) => /rank (\d)/.exec(l.text)![1])).toEqual(['0', '0', '1']);
            expect(lines[0]!.text).toContain('TIMEOUT_CPU');

            // A page that joins later replays the history into the same order.
            const late = await openPage(inspector.url);
            await expect.poll(() => late.page.locator('[data-role="log"] li').count()).toBe(3);
            expect(await late.page.locator('[data-role="log"] li').evaluateAll((items) => items.map((li) => li.textContent))).toEqual(
                lines.map((l) => l.text)
            );
            await late.page.close();
            expect(opened.errors).toEqual([]);
        } finally {
            await page?.close();
            await inspector.close();
        }
    }, 60_000);
});
