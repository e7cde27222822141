/**
 * The timeline of a group's ranks, in one import: the recorder that keeps a group's transitions
 * and failures as plain data (timeline-recorder.ts), the layout of that data as lanes and bars in
 * milliseconds (timeline-layout.ts), its drawing as a standalone SVG (timeline-svg.ts, styled by
 * timeline-style.ts) and its export as Chrome trace JSON for Perfetto (chrome-trace.ts).
 */
export { epochNow } from './observer.js';
export type { GroupObserver, ObservableGroup, RankFailureError, TransitionEvent } from './observer.js';
export { TimelineRecorder } from './timeline-recorder.js';
export type { FailureRecord, TimelineEntry, TimelineRecorderOptions, TimelineRecording } from './timeline-recorder.js';
export { IDLE_STATES, layoutTimeline } from './timeline-layout.js';
export type {
    TimelineBar,
    TimelineBreak,
    TimelineCollective,
    TimelineFailure,
    TimelineLayout,
    TimelineLayoutOptions
} from './timeline-layout.js';
export { renderTimelineSvg } from './timeline-svg.js';
export { axisStep, axisTicks } from './timeline-scale.js';
export type { TimelineSvgOptions } from './timeline-svg.js';
export { STATE_COLORS, escapeXml, formatMs, stateColor, textWidth } from './timeline-style.js';
export { toChromeTrace } from './chrome-trace.js';
export type { ChromeTrace, ChromeTraceEvent, ChromeTraceOptions } from './chrome-trace.js';
