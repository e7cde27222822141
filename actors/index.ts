// rankflow's public API (API.md): groups of ranks, host tensors, errors and size hints.
import './core/disposable.js';  // the Symbol.asyncDispose / Symbol.dispose globals the declarations below use
export { createGroup, Group, RankHandle, Session } from './group.js';
export type { GroupOptions, GroupEvents, RankSnapshot, TrafficReport, TransitionEvent } from './group.js';
export { RankflowError } from './core/errors.js';
export type { RankflowErrorCode } from './core/errors.js';
export { sizeHint, sessionSizeHint, engramSizeHint, ppSizeHint } from './core/hints.js';
export { tensor, toBf16, fromBf16, floatToBf16, bf16ToFloat, bytesOf, numel, ELEMENT_BYTES } from './core/tensor.js';
export type { Tensor, DType, TensorData } from './core/tensor.js';
export type { BufferConfig, DispatchInput, DispatchDType, CombineInput, DispatchHandle } from './core/validate.js';
export type {
  DispatchResult, CombineResult, DeviceDispatchResult, DeviceDispatchInput, DeviceCombineInput, DeviceCombineResult, DeviceOptions,
  AsyncOptions, InFlightCollective, PendingFetch,
} from './core/types.js';
export type { RankProgramHandle, RankBackend, RankTensor, CapturedGraph } from '../workers/program.js';
export type { RankSession, SessionTensor } from '../workers/session-views.js';
export { probeCuda } from './core/backend.js';
export { DeviceTensor } from './core/device-tensor.js';
// Watching the ranks (docs/inspector.md): the live inspector, the timeline and its exports.
export { attachInspector, startInspectorServer } from './observe/inspector.js';
export type { InspectorOptions, InspectorHandle, InspectorServer } from './observe/inspector.js';
export { TimelineRecorder } from './observe/timeline-recorder.js';
export type { TimelineRecording, TimelineRecorderOptions, FailureRecord, TimelineEntry } from './observe/timeline-recorder.js';
export { renderTimelineSvg } from './observe/timeline-svg.js';
export type { TimelineSvgOptions } from './observe/timeline-svg.js';
export { layoutTimeline } from './observe/timeline-layout.js';
export type { TimelineLayout, TimelineLayoutOptions, TimelineBar, TimelineBreak, TimelineCollective, TimelineFailure } from './observe/timeline-layout.js';
export { toChromeTrace } from './observe/chrome-trace.js';
export type { ChromeTrace, ChromeTraceEvent, ChromeTraceOptions } from './observe/chrome-trace.js';
export type { GroupObserver, ObservableGroup, RankFailureError } from './observe/observer.js';
export { describeMachine } from './observe/machine-graph.js';
export type { MachineDescription } from './observe/machine-graph.js';
