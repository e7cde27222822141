/**
 * The inspector's one page, as strings: HTML, an inline style sheet and an inline script. It
 * loads nothing from anywhere but the inspector server that serves it (no CDN, no fonts, no
 * framework), so it works with the network closed; the server pins the script and style by hash
 * in its Content-Security-Policy, which is also what keeps the page from reaching anywhere else.
 *
 * What it shows: one card per rank with that rank's machine drawn as boxes (the active state
 * highlighted, visited ones marked), the live timeline (the server's own SVG rendering, fetched
 * again as events arrive, so page and `rankflow demo --timeline` draw the same picture), the
 * event log and the machine's transition table.
 *
 * Stable hooks for tests and scripts: `[data-rank="N"] [data-role="state"]` holds rank N's state
 * path as its text; `[data-role="failure"]` in the same card says how it failed;
 * `[data-role="connection"]` is 'connecting', 'live', 'ended' or 'reconnecting'; the timeline
 * sits in `[data-role="timeline"]`; `[data-role="log"] li[data-at]` are the log's lines, in time order
 * (`data-at`: epoch ms).
 */
import { STATE_COLORS, escapeXml } from './timeline-style.js';

export const PAGE_STYLE = `
:root { color-scheme: light; --fg: #0f172a; --muted: #64748b; --line: #e2e8f0; --bg: #f8fafc; }
* { box-sizing: border-box; }
body { margin: 0; font: 13px/1.4 ui-sans-serif, system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
  color: var(--fg); background: var(--bg); }
body > header { display: flex; gap: 16px; align-items: baseline; padding: 12px 20px; background: #fff;
  border-bottom: 1px solid var(--line); position: sticky; top: 0; z-index: 1; }
h1 { font-size: 16px; margin: 0; }
h2 { font-size: 13px; margin: 0 0 8px; color: var(--muted); text-transform: uppercase; letter-spacing: .04em; }
#meta { color: var(--muted); }
[data-role="connection"] { margin-left: auto; padding: 2px 8px; border-radius: 10px; background: #e2e8f0; }
[data-role="connection"][data-value="live"] { background: #dcfce7; color: #166534; }
[data-role="connection"][data-value="ended"] { background: #e0e7ff; color: #3730a3; }
[data-role="connection"][data-value="reconnecting"] { background: #fef3c7; color: #92400e; }
main { padding: 16px 20px; display: grid; gap: 16px; }
section.panel { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 12px; }
#ranks { display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr)); gap: 12px; }
article.rank { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 10px; }
article.rank[data-status="failed"] { border-color: #ef4444; box-shadow: 0 0 0 1px #ef4444 inset; }
article.rank > header { display: flex; gap: 8px; align-items: baseline; margin-bottom: 8px; }
article.rank > header .name { font-weight: 600; }
[data-role="state"] { font: 12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; padding: 1px 6px;
  border-radius: 4px; background: #f1f5f9; }
.machine { display: flex; flex-wrap: wrap; gap: 4px; }
.box { border: 1px solid #cbd5e1; border-radius: 5px; padding: 2px 6px; font-size: 11px; color: var(--muted);
  background: #fff; }
.box.compound { display: flex; flex-direction: column; gap: 3px; }
.box.compound > .children { display: flex; flex-wrap: wrap; gap: 3px; }
.box.visited { color: var(--fg); border-color: #94a3b8; }
.box.active { color: #0f172a; font-weight: 600; border: 2px solid #0f172a; background: var(--state-color, #e2e8f0); }
.box.active-parent { border-color: #0f172a; }
[data-role="failure"] { margin: 8px 0 0; color: #b91c1c; font-weight: 600; }
[data-role="failure"][data-timeout] { color: #b45309; }
[data-role="timeline"] { overflow-x: auto; min-height: 40px; }
[data-role="timeline"] svg { display: block; width: 100%; height: auto; }
.columns { display: grid; grid-template-columns: 3fr 2fr; gap: 16px; }
@media (max-width: 900px) { .columns { grid-template-columns: 1fr; } }
ol[data-role="log"] { list-style: none; margin: 0; padding: 0; max-height: 320px; overflow: auto;
  font: 12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
ol[data-role="log"] li { padding: 1px 0; border-bottom: 1px solid #f1f5f9; white-space: pre; }
ol[data-role="log"] li.failure { color: #b91c1c; font-weight: 600; }
table { border-collapse: collapse; font: 12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
td { padding: 1px 8px 1px 0; }
.empty { color: var(--muted); }
`;

/**
 * The page's behaviour. Plain ES2019 in one string: no template literals inside, so it can sit
 * in this TypeScript template unescaped. State colours come from timeline.ts so the boxes and
 * the bars agree.
 */
export const PAGE_SCRIPT = `
'use strict';
var STATE_COLORS = ${JSON.stringify(STATE_COLORS)};
var TERMINAL = { destroyed: true, failed: true };
var LOG_LIMIT = 400;

var ranksEl = document.getElementById('ranks');
var timelineEl = document.querySelector('[data-role="timeline"]');
var logEl = document.querySelector('[data-role="log"]');
var connEl = document.querySelector('[data-role="connection"]');
var metaEl = document.getElementById('meta');
var transitionsEl = document.getElementById('transitions');
var transitionsCountEl = document.getElementById('transitions-count');

var run = { size: 0, startedAt: 0, attached: false, machine: { states: [], transitions: [] } };
var knownStates = [];
var cards = [];

function el(tag, attrs, text) {
  var node = document.createElement(tag);
  if (attrs) for (var key in attrs) node.setAttribute(key, attrs[key]);
  if (text !== undefined) node.textContent = text;
  return node;
}
function topOf(path) { return String(path).split('.')[0]; }
function parentOf(path) { var i = path.lastIndexOf('.'); return i < 0 ? '' : path.slice(0, i); }
function colorOf(path) { return STATE_COLORS[topOf(path)] || '#e2e8f0'; }
function setConnection(value) { connEl.textContent = value; connEl.setAttribute('data-value', value); }
function ms(value) { return (Math.round(value * 10) / 10).toFixed(1) + ' ms'; }

// Every ancestor of a known state is a state too (a compound one), even if only its children
// were ever seen.
function learnState(path) {
  if (!path || knownStates.indexOf(path) >= 0) return false;
  var parent = parentOf(path);
  if (parent) learnState(parent);
  knownStates.push(path);
  return true;
}

function drawMachine(container) {
  container.textContent = '';
  var boxes = {};
  var make = function (path) {
    var children = knownStates.filter(function (s) { return parentOf(s) === path; });
    var name = path.slice(path.lastIndexOf('.') + 1);
    var box = el('div', { 'class': children.length ? 'box compound' : 'box', 'data-path': path });
    box.style.setProperty('--state-color', colorOf(path));
    if (children.length) {
      box.appendChild(el('span', null, name));
      var inner = el('div', { 'class': 'children' });
      children.forEach(function (child) { inner.appendChild(make(child)); });
      box.appendChild(inner);
    } else {
      box.textContent = name;
    }
    boxes[path] = box;
    return box;
  };
  knownStates.filter(function (s) { return parentOf(s) === ''; }).forEach(function (s) { container.appendChild(make(s)); });
  return boxes;
}

function makeCard(rank) {
  var card = el('article', { 'class': 'rank', 'data-rank': String(rank) });
  var header = el('header');
  header.appendChild(el('span', { 'class': 'name' }, 'rank ' + rank));
  var stateEl = el('code', { 'data-role': 'state' }, '');
  header.appendChild(stateEl);
  card.appendChild(header);
  var machineEl = el('div', { 'class': 'machine', 'data-role': 'machine' });
  card.appendChild(machineEl);
  var failureEl = el('p', { 'data-role': 'failure' });
  failureEl.hidden = true;
  card.appendChild(failureEl);
  return { rank: rank, el: card, stateEl: stateEl, machineEl: machineEl, failureEl: failureEl,
           boxes: {}, state: '', visited: {}, failedPhase: '', failure: null };
}

function paint(card) {
  for (var path in card.boxes) {
    var box = card.boxes[path];
    box.classList.toggle('visited', !!card.visited[path]);
    box.classList.toggle('active', path === card.state);
    box.classList.toggle('active-parent', card.state.indexOf(path + '.') === 0);
  }
}

function redrawMachines() {
  cards.forEach(function (card) { card.boxes = drawMachine(card.machineEl); paint(card); });
}

function setState(rank, path) {
  var card = cards[rank];
  if (!card) return;
  if (learnState(path)) redrawMachines();
  card.state = path;
  for (var p = path; p; p = parentOf(p)) card.visited[p] = true;
  card.stateEl.textContent = path;
  card.el.setAttribute('data-status', topOf(path));
  paint(card);
}

function showFailure(rank, text, timeout) {
  var card = cards[rank];
  if (!card) return;
  card.failureEl.hidden = text === '';
  card.failureEl.textContent = text;
  if (timeout) card.failureEl.setAttribute('data-timeout', '');
}

// The log is kept in time order. Events do not arrive in it: each rank's worker reports in
// batches, so one rank's transitions can come after a later one of another rank, and a failure
// is stamped when the group reports it. Most land at the end, so the search starts there.
function log(at, text, failure) {
  var attrs = { 'data-at': String(at) };
  if (failure) attrs['class'] = 'failure';
  var item = el('li', attrs, text);
  var next = null;
  for (var node = logEl.lastChild; node && Number(node.getAttribute('data-at')) > at; node = node.previousSibling) next = node;
  logEl.insertBefore(item, next);
  while (logEl.childNodes.length > LOG_LIMIT) logEl.removeChild(logEl.firstChild);
  if (!next) logEl.scrollTop = logEl.scrollHeight;
}

function drawTransitionTable() {
  var list = run.machine.transitions;
  transitionsEl.textContent = '';
  transitionsCountEl.textContent = String(list.length);
  list.forEach(function (t) {
    var row = el('tr');
    row.appendChild(el('td', null, t.from));
    row.appendChild(el('td', null, '\\u2014 ' + (t.event || '(always)') + ' \\u2192'));
    row.appendChild(el('td', null, t.to));
    transitionsEl.appendChild(row);
  });
}

// A hello starts (or restarts, after a reconnect or a new run) the whole view: everything after
// it is replayed history, then live events.
function onHello(hello) {
  run = hello;
  knownStates = [];
  run.machine.states.forEach(learnState);
  hello.initial.forEach(function (entry) { learnState(entry.state); });
  ranksEl.textContent = '';
  logEl.textContent = '';
  cards = [];
  for (var rank = 0; rank < hello.size; rank++) {
    var card = makeCard(rank);
    cards.push(card);
    ranksEl.appendChild(card.el);
  }
  redrawMachines();
  hello.initial.forEach(function (entry) { setState(entry.rank, entry.state); });
  metaEl.textContent = hello.size + ' ranks' + (hello.backend ? ' \\u00b7 ' + hello.backend + ' backend' : '');
  drawTransitionTable();
  setConnection(hello.attached ? 'live' : (hello.size ? 'ended' : 'connecting'));
  scheduleTimeline();
}

function onTransition(t) {
  setState(t.rank, t.to);
  var what = t.op !== undefined ? '  ' + t.op + (t.seq !== undefined ? ' #' + t.seq : '') : '';
  var failed = topOf(t.to) === 'failed';
  var released = t.to === 'released';
  log(t.at, '+' + ms(t.at - run.startedAt) + '  rank ' + t.rank + '  ' + t.from + ' \\u2192 ' + t.to + '  ' + t.event + what +
      (t.phase ? '  phase ' + t.phase : '') + (released && t.error ? '  ' + t.error.message : ''), failed || released);
  // A release is a program's error: the rank lives on (recovering, then ready), so the card says so and clears.
  if (released && cards[t.rank]) showFailure(t.rank, 'released: ' + (t.error ? t.error.message : 'a program ended the run'), false);
  if (t.from === 'recovering' && t.to === 'ready' && cards[t.rank]) showFailure(t.rank, '', false);
  if (failed && cards[t.rank]) {
    // The phase comes with the transition; the group's failed event, which may come before or
    // after it, brings the code and message. The card shows both, whichever order they arrive in.
    cards[t.rank].failedPhase = t.phase || t.from;
    var report = cards[t.rank].failure;
    if (report) describeFailure(t.rank, report);
    else showFailure(t.rank, 'failed in ' + cards[t.rank].failedPhase + ' (' + t.event + ')', /TIMEOUT/i.test(t.event));
  }
  scheduleTimeline();
}

function phaseOf(f) {
  var card = cards[f.rank];
  return f.phase || (card && card.failedPhase) || f.state || (card && card.state) || 'unknown';
}

function describeFailure(rank, f) {
  showFailure(rank, f.code + ' in ' + phaseOf(f) + ': ' + f.message, /TIMEOUT/i.test(f.code));
}

function onFailure(f) {
  if (cards[f.rank]) cards[f.rank].failure = f;
  describeFailure(f.rank, f);
  log(f.at, '+' + ms(f.at - run.startedAt) + '  rank ' + f.rank + '  ' + f.code + ' in ' + phaseOf(f) + ': ' + f.message, true);
  scheduleTimeline();
}

// The timeline is the server's SVG: fetched at most every 200 ms while events arrive, and once a
// second while some rank is still busy, so its open bars grow.
var timelineQueued = false;
var timelineBusy = false;
function scheduleTimeline() {
  if (timelineQueued) return;
  timelineQueued = true;
  setTimeout(refreshTimeline, 200);
}
function refreshTimeline() {
  timelineQueued = false;
  if (timelineBusy) { scheduleTimeline(); return; }
  timelineBusy = true;
  var width = Math.max(480, Math.round(timelineEl.clientWidth || 960));
  fetch('timeline.svg?width=' + width, { cache: 'no-store' })
    .then(function (response) { return response.ok ? response.text() : Promise.reject(new Error(String(response.status))); })
    .then(function (svg) { timelineEl.innerHTML = svg; })
    .catch(function () { /* the next event or tick tries again */ })
    .then(function () { timelineBusy = false; });
}
setInterval(function () {
  var busy = cards.some(function (card) { return !TERMINAL[topOf(card.state)]; });
  if (run.attached && busy) scheduleTimeline();
}, 1000);

var source = new EventSource('events');
source.addEventListener('hello', function (e) { onHello(JSON.parse(e.data)); });
source.addEventListener('transition', function (e) { onTransition(JSON.parse(e.data)); });
source.addEventListener('failure', function (e) { onFailure(JSON.parse(e.data)); });
source.addEventListener('detached', function () { run.attached = false; setConnection('ended'); scheduleTimeline(); });
source.addEventListener('open', function () { if (connEl.getAttribute('data-value') === 'reconnecting') setConnection('connecting'); });
source.addEventListener('error', function () {
  setConnection(source.readyState === EventSource.CLOSED ? 'ended' : 'reconnecting');
});
`;

export interface InspectorPageOptions {
    /** Shown as the page's heading and title; default 'rankflow inspector'. */
    title?: string;
}

/** The complete HTML document. The script and style are embedded exactly as exported above. */
export function renderInspectorPage(options: InspectorPageOptions = {}): string {
    const title = escapeXml(options.title ?? 'rankflow inspector');
    return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${title}</title>
<style>${PAGE_STYLE}</style>
</head>
<body>
<header>
<h1>${title}</h1>
<span id="meta"></span>
<span data-role="connection" data-value="connecting">connecting</span>
</header>
<main>
<section class="panel"><h2>Ranks</h2><div id="ranks"><p class="empty">waiting for the group…</p></div></section>
<section class="panel"><h2>Timeline</h2><div data-role="timeline"></div></section>
<div class="columns">
<section class="panel"><h2>Events</h2><ol data-role="log"></ol></section>
<section class="panel"><h2>Machine</h2>
<details><summary><span id="transitions-count">0</span> transitions</summary><table><tbody id="transitions"></tbody></table></details>
</section>
</div>
</main>
<script>${PAGE_SCRIPT}</script>
</body>
</html>
`;
}
