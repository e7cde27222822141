/**
 * The timeline's time axis: milliseconds to px, linear except across idle breaks (each drawn at
 * a fixed width), and the ticks to label it with (a 1, 2 or 5 step, none inside a break).
 */
import type { TimelineBreak, TimelineLayout } from './timeline-layout.js';

/** Width a shrunk idle stretch is drawn with, at most: enough to see the bars go through it. */
const BREAK_WIDTH = 26;

/** A stretch of px, [x0, x1]. */
export interface Span {
    x0: number;
    x1: number;
}

export interface PlacedBreak extends TimelineBreak, Span {}

/**
 * Milliseconds to px: linear, except that each break takes a fixed width (less when there are
 * many, so breaks never take more than a third of the plot). `visible` is the time drawn to
 * scale, which is what the tick step is chosen for.
 */
export function timeScale(layout: TimelineLayout, left: number, plotWidth: number) {
    const total = layout.duration > 0 ? layout.duration : 1;
    const idle = layout.breaks.reduce((sum, b) => sum + (b.end - b.start), 0);
    const breaks = total - idle > 0 ? layout.breaks : [];
    const visible = breaks.length > 0 ? total - idle : total;
    const breakWidth = breaks.length > 0 ? Math.min(BREAK_WIDTH, plotWidth / 3 / breaks.length) : 0;
    const perMs = (plotWidth - breakWidth * breaks.length) / visible;

    const placed: PlacedBreak[] = [];
    let shrunk = 0;
    for (const b of breaks) {
        const x0 = left + (b.start - shrunk) * perMs + placed.length * breakWidth;
        placed.push({ ...b, x0, x1: x0 + breakWidth });
        shrunk += b.end - b.start;
    }
    const x = (ms: number): number => {
        let idleBefore = 0;
        let passed = 0;
        for (const b of placed) {
            if (ms <= b.start) break;
            // Inside a break, time moves across its fixed width.
            if (ms < b.end) return b.x0 + ((ms - b.start) / (b.end - b.start)) * breakWidth;
            idleBefore += b.end - b.start;
            passed++;
        }
        return left + (ms - idleBefore) * perMs + passed * breakWidth;
    };
    return { x, breaks: placed, visible };
}

/**
 * The ticks `step` apart that fall outside every break, found segment by segment, so a long idle
 * stretch costs nothing however many steps it spans.
 */
export function visibleTicks(duration: number, breaks: readonly TimelineBreak[], step: number): number[] {
    if (breaks.length === 0) return axisTicks(duration, step);
    const ticks: number[] = [];
    let from = 0;
    for (const segment of [...breaks, { start: duration, end: duration }]) {
        for (let i = Math.ceil(from / step - 1e-9); i * step <= segment.start + step * 1e-9; i++) {
            ticks.push(Number((i * step).toPrecision(12)));
        }
        from = segment.end;
    }
    return ticks;
}

/** The axis step for `span` ms: 1, 2 or 5 times a power of ten, giving five to ten ticks. */
export function axisStep(span: number): number {
    if (!(span > 0)) return 1;
    const rough = span / 8;
    const magnitude = 10 ** Math.floor(Math.log10(rough));
    return [1, 2, 5, 10].map((m) => m * magnitude).find((s) => s >= rough)!;
}

/** Tick positions in ms over `duration`, `step` apart (default: {@link axisStep} of the duration). */
export function axisTicks(duration: number, step = axisStep(duration)): number[] {
    if (!(duration > 0)) return [0];
    const ticks: number[] = [];
    // Counted in integer steps so float error never adds or drops a tick.
    for (let i = 0; i * step <= duration + step * 1e-9; i++) ticks.push(Number((i * step).toPrecision(12)));
    return ticks;
}
