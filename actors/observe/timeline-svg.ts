/**
 * Draws a timeline layout (timeline-layout.ts) as one standalone SVG document: a lane per rank, a
 * bar per state, a dashed guide per collective, a mark per failure, a time axis and a legend.
 * Idle stretches (every rank waiting) are drawn shrunk behind a break, so the operations get the
 * width. Labels are placed by an upper bound of their width (timeline-style.ts#textWidth): one
 * that does not fit is shortened or left out, never drawn over another or past the edge.
 *
 * Drawing is a pure function of the recording, so the same run always gives the same bytes.
 */
import { layoutTimeline, type TimelineFailure, type TimelineLayout } from './timeline-layout.js';
import { axisStep, timeScale, visibleTicks, type Span } from './timeline-scale.js';
import type { TimelineRecording } from './timeline-recorder.js';
import {
    FAILURE_COLOR,
    FONT,
    GUIDE_COLOR,
    STATE_COLORS,
    TIMEOUT_COLOR,
    RELEASE_COLOR,
    escapeXml,
    formatMs,
    num,
    stateColor,
    textWidth
} from './timeline-style.js';

export interface TimelineSvgOptions {
    /** Total width in px; default 960. */
    width?: number;
    /** Height of one rank's lane in px; default 26. */
    laneHeight?: number;
    /** Heading drawn above the lanes; default 'rankflow timeline'. */
    title?: string;
    /** Where open bars (a rank's current state) end, epoch ms; default: when recording ended. */
    end?: number;
    /** Shrink the stretches in which every rank is idle; default true. False draws time to scale. */
    compressIdle?: boolean;
}

const LABEL_SIZE = 11;
const GUIDE_LABEL_SIZE = 10;
const LABEL_PAD = 3;

/**
 * Draws a recording as a standalone SVG document: one lane per rank, a bar per state with its
 * duration (hover shows it too), dashed guides joining where each rank entered the same
 * collective, a mark for each failure or timeout labelled with rank and phase, a time axis in ms
 * and a legend. It references nothing outside itself, and the same input gives the same output.
 *
 * Elements carry `data-*` attributes (`data-lane`, `data-state`, `data-collective`,
 * `data-failure`, `data-break`, `data-label`) so the structure can be checked without pixels.
 */
export function renderTimelineSvg(recording: TimelineRecording, options: TimelineSvgOptions = {}): string {
    const layout = layoutTimeline(recording, {
        ...(options.end !== undefined ? { end: options.end } : {}),
        compressIdle: options.compressIdle ?? true
    });
    const width = options.width ?? 960;
    const laneHeight = options.laneHeight ?? 26;
    const laneGap = 8;
    const title = options.title ?? 'rankflow timeline';

    const left = 64;
    const right = 24;
    const plotWidth = Math.max(width - left - right, 100);
    const titleHeight = 30;
    const labelRows = 3;
    const labelRowHeight = 13;
    const lanesTop = titleHeight + labelRows * labelRowHeight + 6;
    const lanesHeight = layout.size * (laneHeight + laneGap) - laneGap;
    const axisTop = lanesTop + lanesHeight + 8;
    const legendTop = axisTop + 30;

    const scale = timeScale(layout, left, plotWidth);
    const x = scale.x;
    const laneY = (rank: number) => lanesTop + rank * (laneHeight + laneGap);

    const legend = layoutLegend(legendItems(layout), left, legendTop, width - right);
    const height = legend.bottom + 14;

    // Failure marks are placed first: a bar label keeps clear of them as of a break.
    const marks = layout.failures.map((failure) => {
        const fx = x(failure.at);
        const cy = laneY(failure.rank) + laneHeight / 2;
        const text = `rank ${failure.rank} · ${failure.code} in ${failure.phase}`;
        // The label sits on a white pill so it stays legible over the bars; near the right edge
        // it goes to the mark's left rather than off the page.
        const pillWidth = textWidth(text, LABEL_SIZE, true) + 10;
        const toLeft = fx + 10 + pillWidth > width - 4;
        const pillX = toLeft ? Math.max(fx - 9 - pillWidth, 2) : fx + 9;
        return { failure, fx, cy, pillX, pillWidth, text };
    });
    const obstacles = (rank: number): Span[] => [
        ...scale.breaks,
        ...marks
            .filter((m) => m.failure.rank === rank)
            .map((m) => ({ x0: Math.min(m.pillX, m.fx - 7), x1: Math.max(m.pillX + m.pillWidth, m.fx + 7) }))
    ];

    const out: string[] = [];
    out.push(
        `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${num(height)}" ` +
            `viewBox="0 0 ${width} ${num(height)}" font-family="${FONT}" font-size="${LABEL_SIZE}" data-timeline="">`
    );
    out.push(`<rect x="0" y="0" width="${width}" height="${num(height)}" fill="#ffffff"/>`);
    const summary = `${layout.size} rank${layout.size === 1 ? '' : 's'} · ${formatMs(layout.duration)}`;
    // The title gives way to the summary on its right: cut short rather than run into it.
    const titleRoom = width - right - textWidth(summary, LABEL_SIZE) - 12 - left;
    let heading = title;
    while (heading.length > 1 && textWidth(heading, 14, true) > titleRoom) heading = `${heading.slice(0, -2)}…`;
    out.push(
        `<text x="${left}" y="20" font-size="14" font-weight="600" fill="#0f172a" data-label="title">${escapeXml(heading)}` +
            `${heading === title ? '' : `<title>${escapeXml(title)}</title>`}</text>`,
        `<text x="${width - right}" y="20" text-anchor="end" fill="#475569" data-label="summary">${escapeXml(summary)}</text>`
    );

    // Axis grid first, so everything else draws over it. A tick inside a break is left out, and
    // so is a tick label that would touch the previous one or run off the edge.
    out.push('<g data-axis="">');
    let lastTickEnd = -Infinity;
    for (const tick of visibleTicks(layout.duration, scale.breaks, axisStep(scale.visible))) {
        const tx = x(tick);
        const text = formatMs(tick);
        const half = textWidth(text, LABEL_SIZE) / 2;
        const fits = tx - half > lastTickEnd + 6 && tx + half <= width - 2;
        out.push(`<line x1="${num(tx)}" y1="${lanesTop - 4}" x2="${num(tx)}" y2="${axisTop}" stroke="#e2e8f0" stroke-width="1"/>`);
        if (fits) {
            lastTickEnd = tx + half;
            out.push(
                `<text x="${num(tx)}" y="${axisTop + 14}" text-anchor="middle" fill="#475569" data-tick="${num(tick)}">` +
                    `${escapeXml(text)}</text>`
            );
        }
    }
    out.push(`<line x1="${left}" y1="${axisTop}" x2="${num(left + plotWidth)}" y2="${axisTop}" stroke="#64748b" stroke-width="1"/>`, '</g>');

    for (const lane of layout.lanes) {
        const y = laneY(lane.rank);
        out.push(`<g data-lane="${lane.rank}">`);
        const blocked = obstacles(lane.rank);
        out.push(
            `<text x="${left - 8}" y="${num(y + laneHeight / 2 + 4)}" text-anchor="end" fill="#0f172a">rank ${lane.rank}</text>`,
            `<rect x="${left}" y="${y}" width="${num(plotWidth)}" height="${laneHeight}" fill="#f8fafc"/>`
        );
        for (const bar of lane.bars) {
            const bx = x(bar.start);
            const bw = Math.max(x(bar.end) - bx, 1);
            const duration = bar.end - bar.start;
            out.push(
                `<g data-state="${escapeXml(bar.state)}" data-start="${num(bar.start)}" data-duration="${num(duration)}"` +
                    `${bar.closed ? '' : ' data-open=""'}>`,
                `<title>rank ${lane.rank} · ${escapeXml(bar.state)} · ${escapeXml(formatMs(duration))}` +
                    `${bar.closed ? '' : ' (still in it)'}</title>`,
                `<rect x="${num(bx)}" y="${y + 2}" width="${num(bw)}" height="${laneHeight - 4}" rx="2" ` +
                    `fill="${stateColor(bar.state)}" stroke="#ffffff" stroke-width="0.5"/>`
            );
            // A bar that runs through a break or under a failure's pill is labelled in its widest free part.
            const room = widestOutside(bx, bx + bw, blocked);
            const label = fitLabel(barLabels(bar.state, duration), room.width - 2 * LABEL_PAD, LABEL_SIZE);
            if (label) {
                out.push(
                    `<text x="${num(room.x + LABEL_PAD)}" y="${num(y + laneHeight / 2 + 4)}" fill="#0f172a" data-label="state">` +
                        `${escapeXml(label)}</text>`
                );
            }
            out.push('</g>');
        }
        out.push('</g>');
    }

    // Breaks over the bars: a pale band with a zigzag on each side, and a gap in the axis.
    for (const b of scale.breaks) {
        const mid = (b.x0 + b.x1) / 2;
        out.push(
            `<g data-break="" data-start="${num(b.start)}" data-duration="${num(b.end - b.start)}">`,
            `<title>${escapeXml(`every rank idle for ${formatMs(b.end - b.start)}, drawn shrunk`)}</title>`,
            `<rect x="${num(b.x0 + 3)}" y="${lanesTop - 2}" width="${num(Math.max(b.x1 - b.x0 - 6, 1))}" ` +
                `height="${lanesHeight + 4}" fill="#ffffff" fill-opacity="0.55"/>`,
            `<path d="${zigzag(b.x0 + 3, lanesTop - 2, axisTop)} ${zigzag(b.x1 - 3, lanesTop - 2, axisTop)}" ` +
                `fill="none" stroke="#94a3b8" stroke-width="1"/>`,
            `<rect x="${num(mid - 4)}" y="${axisTop - 3}" width="8" height="6" fill="#ffffff"/>`,
            `<path d="M${num(mid - 6)} ${axisTop + 4} L${num(mid - 2)} ${axisTop - 4} M${num(mid + 2)} ${axisTop + 4} ` +
                `L${num(mid + 6)} ${axisTop - 4}" stroke="#64748b" stroke-width="1"/>`,
            '</g>'
        );
    }

    // Collective guides: a dashed line through each rank's way into the collective. When the
    // ranks entered together it is vertical; a slanted guide shows who arrived late. Each label
    // takes the first row with room; one that has none anywhere is left to the guide's tooltip.
    const labelRowEnds = new Array<number>(labelRows).fill(-Infinity);
    for (const collective of layout.collectives) {
        const name = `${collective.op} #${collective.seq}`;
        const points = collective.entries.map(({ rank, at }) => ({ px: x(at), top: laneY(rank), bottom: laneY(rank) + laneHeight }));
        const path = points
            .map((p, i) => `${i === 0 ? 'M' : 'L'}${num(p.px)} ${num(p.top)} L${num(p.px)} ${num(p.bottom)}`)
            .join(' ');
        const first = points[0]!;
        const times = collective.entries.map((e) => e.at);
        const spread = Math.max(...times) - Math.min(...times);
        const count = collective.entries.length;
        out.push(
            `<g data-collective="${escapeXml(`${collective.op}#${collective.seq}`)}" data-ranks="${count}">`,
            `<title>${escapeXml(`${name} · ${count} rank${count === 1 ? '' : 's'} · entry spread ${formatMs(spread)}`)}</title>`,
            `<path d="M${num(first.px)} ${num(lanesTop - 4)} L${num(first.px)} ${num(first.top)} ${path}" fill="none" ` +
                `stroke="${GUIDE_COLOR}" stroke-width="1" stroke-dasharray="3 2"/>`
        );
        const labelWidth = textWidth(name, GUIDE_LABEL_SIZE);
        // Beside the guide, or ending at the edge when the guide is too close to it.
        const labelX = Math.min(first.px + 2, width - 2 - labelWidth);
        const row = labelRowEnds.findIndex((end) => end + 4 <= labelX);
        if (row >= 0 && labelX >= 0) {
            labelRowEnds[row] = labelX + labelWidth;
            out.push(
                `<text x="${num(labelX)}" y="${titleHeight + (row + 1) * labelRowHeight - 2}" font-size="${GUIDE_LABEL_SIZE}" ` +
                    `fill="${GUIDE_COLOR}" data-label="collective">${escapeXml(name)}</text>`
            );
        }
        out.push('</g>');
    }

    for (const { failure, fx, cy, pillX, pillWidth, text } of marks) {
        const kind = markKind(failure);
        const color = MARK_COLORS[kind];
        out.push(
            `<g data-failure="${kind}" data-failed-rank="${failure.rank}" ` +
                `data-phase="${escapeXml(failure.phase)}" data-code="${escapeXml(failure.code)}">`,
            `<title>${escapeXml(`${text} at ${formatMs(failure.at)}: ${failure.message}`)}</title>`,
            `<rect x="${num(pillX)}" y="${num(cy - 8)}" width="${num(pillWidth)}" height="16" rx="3" fill="#ffffff" ` +
                `fill-opacity="0.94" stroke="${color}" stroke-width="1"/>`,
            `<text x="${num(pillX + 5)}" y="${num(cy + 4)}" font-weight="600" fill="${color}">${escapeXml(text)}</text>`,
            failureMark(fx, cy, 6, kind),
            '</g>'
        );
    }

    out.push('<g data-legend="">');
    for (const item of legend.items) {
        out.push(`<g data-legend-item="${escapeXml(item.key)}">`);
        if (item.kind === 'state') {
            out.push(`<rect x="${num(item.x)}" y="${num(item.y)}" width="12" height="10" rx="2" fill="${stateColor(item.key)}"/>`);
        } else if (item.kind === 'collective') {
            out.push(
                `<path d="M${num(item.x + 6)} ${num(item.y - 1)} L${num(item.x + 6)} ${num(item.y + 11)}" ` +
                    `stroke="${GUIDE_COLOR}" stroke-width="1" stroke-dasharray="3 2"/>`
            );
        } else if (item.kind === 'break') {
            out.push(`<path d="${zigzag(item.x + 6, item.y - 1, item.y + 11)}" fill="none" stroke="#94a3b8" stroke-width="1"/>`);
        } else {
            out.push(failureMark(item.x + 6, item.y + 5, 5.5, item.key === 'failure' ? 'error' : (item.key as MarkKind)));
        }
        out.push(`<text x="${num(item.x + 16)}" y="${num(item.y + 9)}" fill="#334155">${escapeXml(item.label)}</text>`, '</g>');
    }
    out.push('</g>', '</svg>');
    return out.join('\n') + '\n';
}

/** The widest stretch of [x0, x1] that none of `blocked` covers. */
function widestOutside(x0: number, x1: number, blocked: readonly Span[]): { x: number; width: number } {
    let best = { x: x0, width: 0 };
    let from = x0;
    for (const b of [...blocked].sort((p, q) => p.x0 - q.x0)) {
        const to = Math.min(b.x0, x1);
        if (to - from > best.width) best = { x: from, width: to - from };
        from = Math.max(from, b.x1);
        if (from >= x1) return best;
    }
    if (x1 - from > best.width) best = { x: from, width: x1 - from };
    return best;
}

/** A vertical zigzag from y0 to y1 at x: how a break in a bar is usually drawn. */
function zigzag(x: number, y0: number, y1: number): string {
    const parts = [`M${num(x)} ${num(y0)}`];
    const step = 6;
    for (let y = y0 + step, i = 0; y <= y1; y += step, i++) parts.push(`L${num(x + (i % 2 === 0 ? 2 : -2))} ${num(y)}`);
    return parts.join(' ');
}

type MarkKind = 'error' | 'timeout' | 'release';
const MARK_COLORS: Record<MarkKind, string> = { error: FAILURE_COLOR, timeout: TIMEOUT_COLOR, release: RELEASE_COLOR };
const markKind = (f: TimelineFailure): MarkKind => (f.release ? 'release' : f.timeout ? 'timeout' : 'error');

/**
 * A failure is a cross in a disc; a timeout a clock face; a release (a program's error: the rank
 * lives on) a bar in a disc, so the three read apart without colour.
 */
function failureMark(cx: number, cy: number, r: number, kind: MarkKind): string {
    const color = MARK_COLORS[kind];
    const k = r / 2;
    const glyph = kind === 'timeout'
        ? `M${num(cx)} ${num(cy)} L${num(cx)} ${num(cy - r * 0.65)} M${num(cx)} ${num(cy)} L${num(cx + r * 0.5)} ${num(cy)}`
        : kind === 'release'
            ? `M${num(cx - k)} ${num(cy)} L${num(cx + k)} ${num(cy)}`
            : `M${num(cx - k)} ${num(cy - k)} L${num(cx + k)} ${num(cy + k)} M${num(cx + k)} ${num(cy - k)} L${num(cx - k)} ${num(cy + k)}`;
    return (
        `<circle cx="${num(cx)}" cy="${num(cy)}" r="${num(r)}" fill="${color}" stroke="#ffffff" stroke-width="1.5"/>` +
        `<path d="${glyph}" stroke="#ffffff" stroke-width="1.5" stroke-linecap="round" fill="none"/>`
    );
}

/**
 * What a bar may say, longest first: state and duration, the state, its last part
 * ('session.gathering' -> 'gathering'), then that cut short with an ellipsis (3 letters at least).
 */
function barLabels(state: string, duration: number): string[] {
    const short = state.slice(state.lastIndexOf('.') + 1);
    const labels = [`${state} ${formatMs(duration)}`, state];
    if (short !== state) labels.push(`${short} ${formatMs(duration)}`, short);
    for (let n = short.length - 1; n >= 3; n--) labels.push(`${short.slice(0, n)}…`);
    return labels;
}

function fitLabel(candidates: string[], room: number, size: number): string | undefined {
    return candidates.find((label) => textWidth(label, size) <= room);
}

type LegendItem = { kind: 'state' | 'collective' | 'failure' | 'break'; key: string; label: string };

/** The legend lists what the drawing uses: its states in lifecycle order, then the marks. */
function legendItems(layout: TimelineLayout): LegendItem[] {
    const used = new Set(layout.lanes.flatMap((lane) => lane.bars.map((bar) => bar.state.split('.')[0]!)));
    const known = Object.keys(STATE_COLORS).filter((state) => used.has(state));
    const others = [...used].filter((state) => !(state in STATE_COLORS)).sort();
    const items: LegendItem[] = [...known, ...others].map((state) => ({ kind: 'state', key: state, label: state }));
    if (layout.collectives.length > 0) items.push({ kind: 'collective', key: 'collective', label: 'collective (op #seq)' });
    if (layout.failures.some((f) => markKind(f) === 'error')) items.push({ kind: 'failure', key: 'failure', label: 'failure' });
    if (layout.failures.some((f) => markKind(f) === 'timeout')) items.push({ kind: 'failure', key: 'timeout', label: 'timeout' });
    if (layout.failures.some((f) => markKind(f) === 'release')) items.push({ kind: 'failure', key: 'release', label: "released (a program's error)" });
    if (layout.breaks.length > 0) items.push({ kind: 'break', key: 'break', label: 'all ranks idle (shrunk)' });
    return items;
}

function layoutLegend(items: LegendItem[], left: number, top: number, right: number) {
    const placed: Array<LegendItem & { x: number; y: number }> = [];
    let cx = left;
    let cy = top;
    for (const item of items) {
        const itemWidth = 16 + textWidth(item.label, LABEL_SIZE) + 14;
        if (cx + itemWidth > right && cx > left) {
            cx = left;
            cy += 18;
        }
        placed.push({ ...item, x: cx, y: cy });
        cx += itemWidth;
    }
    return { items: placed, bottom: cy + 12 };
}
