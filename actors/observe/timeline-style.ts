/**
 * How the timeline looks, shared by the SVG and the inspector page: the colour of each rank
 * state, the font, how wide a label will be, and how numbers and names are written into XML.
 */

/**
 * Colours of the rank machine's top-level states (machines/rank.ts), in its lifecycle order,
 * which is also the legend's order. Children share their parent's colour ('session.open' is a
 * session). A state not listed gets a colour from its name, so it is stable across runs.
 */
export const STATE_COLORS: Readonly<Record<string, string>> = {
    init: '#9ca3af',
    registerWindow: '#a78bfa',
    ready: '#4ade80',
    barrier: '#facc15',
    allGathering: '#60a5fa',
    dispatching: '#fb923c',
    combining: '#2dd4bf',
    session: '#818cf8',
    engram: '#f472b6',
    pipeline: '#22d3ee',
    released: '#c084fc',
    recovering: '#a3e635',
    destroying: '#94a3b8',
    destroyed: '#cbd5e1',
    failed: '#ef4444'
};

const EXTRA_COLORS = ['#fca5a5', '#fdba74', '#bef264', '#86efac', '#67e8f9', '#93c5fd', '#c4b5fd', '#f9a8d4'];

export function stateColor(state: string): string {
    const top = state.split('.')[0]!;
    const known = STATE_COLORS[top];
    if (known) return known;
    let hash = 0;
    for (const char of top) hash = (hash * 31 + char.charCodeAt(0)) >>> 0;
    return EXTRA_COLORS[hash % EXTRA_COLORS.length]!;
}

export const FONT = 'ui-sans-serif, system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif';
export const FAILURE_COLOR = '#b91c1c';
export const TIMEOUT_COLOR = '#b45309';
/** A run's release (a rank program threw or ended early): the rank lives on, unlike a failure. */
export const RELEASE_COLOR = '#7e22ce';
export const GUIDE_COLOR = '#475569';

/**
 * Advance widths in em of DejaVu Sans, the widest of the fonts above and the one a Linux browser
 * falls back to; the others are narrower, so a label that fits by this table fits everywhere.
 * Characters not listed count as the widest lowercase letter.
 */
const ADVANCE: Record<string, number> = {
    ' ': 0.318, '.': 0.318, ',': 0.318, ':': 0.337, ';': 0.337, '·': 0.318, '…': 1.0, '#': 0.838, '-': 0.361,
    '_': 0.5, '(': 0.39, ')': 0.39, '/': 0.337, '<': 0.838, '>': 0.838, '&': 0.78, '"': 0.46, "'": 0.275,
    µ: 0.636, '%': 0.95, '+': 0.838, '=': 0.838,
    a: 0.613, b: 0.635, c: 0.55, d: 0.635, e: 0.615, f: 0.352, g: 0.635, h: 0.634, i: 0.278, j: 0.278,
    k: 0.579, l: 0.278, m: 0.974, n: 0.634, o: 0.612, p: 0.635, q: 0.635, r: 0.411, s: 0.521, t: 0.392,
    u: 0.634, v: 0.592, w: 0.818, x: 0.592, y: 0.592, z: 0.525,
    A: 0.684, B: 0.686, C: 0.698, D: 0.77, E: 0.632, F: 0.575, G: 0.775, H: 0.752, I: 0.295, J: 0.295,
    K: 0.656, L: 0.557, M: 0.863, N: 0.748, O: 0.787, P: 0.603, Q: 0.787, R: 0.695, S: 0.635, T: 0.611,
    U: 0.732, V: 0.684, W: 0.989, X: 0.685, Y: 0.611, Z: 0.685
};
const DIGIT_ADVANCE = 0.636;
const OTHER_ADVANCE = 0.974;
/** Bold runs about 10% wider; a little slack on top covers hinting at small sizes. */
const BOLD = 1.1;
const SLACK = 1.04;

/** The width in px `text` takes at `size` px: an upper bound, used to decide what fits. */
export function textWidth(text: string, size: number, bold = false): number {
    let em = 0;
    for (const char of text) em += ADVANCE[char] ?? (char >= '0' && char <= '9' ? DIGIT_ADVANCE : OTHER_ADVANCE);
    return em * size * SLACK * (bold ? BOLD : 1);
}

/** Milliseconds as people read them on an axis: '0 ms', '2.5 ms', '1200 ms'. */
export function formatMs(ms: number): string {
    const rounded = ms >= 100 ? Math.round(ms) : ms >= 10 ? Math.round(ms * 10) / 10 : Math.round(ms * 100) / 100;
    return `${rounded} ms`;
}

/** Coordinates to two decimals, without trailing zeros, so output is stable and small. */
export function num(value: number): string {
    return String(Math.round(value * 100) / 100);
}

export function escapeXml(text: string): string {
    return text.replace(/[&<>"']/g, (char) => `&#${char.charCodeAt(0)};`);
}
