// rankflow's public API (API.md): groups of ranks, host tensors, errors and size hints.
export { createGroup, Group, RankHandle, Session } from './group.js';
export type { GroupOptions, GroupEvents, RankSnapshot, TransitionEvent } from './group.js';
export { RankflowError } from './core/errors.js';
export type { RankflowErrorCode } from './core/errors.js';
export { sizeHint, engramSizeHint, ppSizeHint } from './core/hints.js';
export { tensor, toBf16, fromBf16, floatToBf16, bf16ToFloat, bytesOf, numel, ELEMENT_BYTES } from './core/tensor.js';
export type { Tensor, DType, TensorData } from './core/tensor.js';
export type { BufferConfig, DispatchInput, CombineInput, DispatchHandle } from './core/validate.js';
export type { DispatchResult, CombineResult, DeviceDispatchResult, DeviceDispatchInput, DeviceCombineInput, DeviceCombineResult, DeviceOptions } from './core/types.js';
export type { RankProgramHandle, CapturedGraph } from '../workers/program.js';
export { probeCuda } from './core/backend.js';
export { DeviceTensor } from './core/device-tensor.js';
