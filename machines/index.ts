// The machines of rankflow (pure xstate definitions, no native code).
export { isRefusal, rankMachine } from './rank.js';
export type { RankContext, RankEvent, RankInput, FailureInfo, OpName, InFlightKind } from './rank.js';
export { HOT_EVENTS, OP_TABLE, opOfState, type CollectiveName, type OpDescriptor } from './ops.js';
export { statePath } from './state-path.js';
