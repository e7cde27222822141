/**
 * The inspector page in a real headless browser (Debian's chromium through playwright-core): a
 * fake group of four ranks goes init -> registerWindow -> ready, runs a barrier, and is destroyed,
 * and the page shows each rank reach `ready` and then `destroyed`, draws the timeline, and loads
 * nothing but what the inspector serves. .ci/install-chromium.sh installs the browser.
 */
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext, type Page } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { attachInspector, type InspectorHandle } from '../actors/observe/inspector.js';
import type { MachineDescription } from '../actors/observe/machine-graph.js';
import { FakeGroup } from './fixtures/fake-group.js';

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
});
