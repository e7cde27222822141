// Redraws the pictures of README.md and docs/inspector.md, in Debian's chromium (.ci/install-chromium.sh)
// through playwright-core, from the built tree (npm run build first):
//   docs/timeline-sample.png   docs/timeline-sample.svg (the test fixture's run, kept by test/timeline.test.ts)
//   docs/demo-timeline.svg/png a fresh `rankflow demo --quiet --rounds 3 --backend host --timeline`
//   docs/inspector-sample.png  the inspector page after the fixture's run, replayed into a stand-in group
// Run: node docs/pictures.mjs
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const docs = join(root, 'docs');
const { startInspectorServer } = await import(join(root, 'dist/actors/observe/inspector.js'));
const { describeMachine } = await import(join(root, 'dist/actors/observe/machine-graph.js'));
const { epochNow } = await import(join(root, 'dist/actors/observe/observer.js'));
const { rankMachine } = await import(join(root, 'dist/machines/index.js'));
const { recordedRun } = await import(join(root, 'dist/test/fixtures/recorded-run.js'));
const { FakeGroup } = await import(join(root, 'dist/test/fixtures/fake-group.js'));

// The same flags as test/inspector.e2e.test.ts: the network is closed, chromium must not try it.
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});

/** An SVG file as a PNG at twice its size. */
async function svgToPng(svgFile, pngFile) {
  const svg = readFileSync(svgFile, 'utf8');
  const width = Number(/width="([\d.]+)"/.exec(svg)[1]);
  const height = Math.ceil(Number(/height="([\d.]+)"/.exec(svg)[1]));
  const page = await browser.newPage({ viewport: { width, height }, deviceScaleFactor: 2 });
  await page.setContent(`<!doctype html><body style="margin:0">${svg}</body>`);
  await page.screenshot({ path: pngFile });
  await page.close();
  console.log(`wrote ${pngFile}`);
}

try {
  await svgToPng(join(docs, 'timeline-sample.svg'), join(docs, 'timeline-sample.png'));

  execFileSync(process.execPath, [join(root, 'bin/rankflow.js'), 'demo', '--quiet', '--rounds', '3', '--backend', 'host', '--timeline', join(docs, 'demo-timeline.svg')], { stdio: 'inherit' });
  await svgToPng(join(docs, 'demo-timeline.svg'), join(docs, 'demo-timeline.png'));

  const server = await startInspectorServer({ port: 0, machine: describeMachine(rankMachine), title: 'rankflow inspector: recorded 4-rank run (test fixture)' });
  const group = new FakeGroup(recordedRun.size);
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await page.goto(server.url);
  // Replayed in one go on a stand-in clock that reads the fixture's times, so the failures, which
  // the recorder stamps when they are reported, land where they happened; the page, open since
  // before the group came, follows it live.
  const now = performance.now;
  const offset = epochNow() - recordedRun.startedAt;
  let clock = recordedRun.startedAt;
  performance.now = () => clock + offset - performance.timeOrigin;
  try {
    const detach = server.attach(group);
    const events = [
      ...recordedRun.transitions.map((t) => ({ at: t.at, apply: () => group.move(t.rank, t.to, t.event, { ...(t.op ? { op: t.op, seq: t.seq } : {}), ...(t.phase ? { phase: t.phase } : {}) }) })),
      ...recordedRun.failures.map((f) => ({ at: f.at, apply: () => group.fail(f.rank, { code: f.code, message: f.message, rank: f.rank, state: f.state }) })),
    ].sort((a, b) => a.at - b.at);
    for (const event of events) {
      clock = event.at;
      event.apply();
    }
    clock = recordedRun.endedAt;
    detach();
  } finally {
    performance.now = now;
  }
  await page.locator('[data-role="timeline"] [data-lane]').first().waitFor();
  await page.waitForTimeout(500);  // the timeline is fetched 200 ms after the last event
  await page.screenshot({ path: join(docs, 'inspector-sample.png'), fullPage: true });
  console.log(`wrote ${join(docs, 'inspector-sample.png')}`);
  await page.close();
  await server.close();
} finally {
  await browser.close();
}
