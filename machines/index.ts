// The machines of rankflow (pure xstate definitions, no native code).
export { rankMachine, BACKSTOP_MARGIN_SECONDS } from './rank.js';
export { PHASE_NAMES } from './rank.js';
export type { RankContext, RankEvent, RankInput, FailureInfo, OpName, PhaseInput, PhaseName } from './rank.js';
export { statePath } from './state-path.js';
