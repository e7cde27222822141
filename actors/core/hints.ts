// Size hints (DeepEP's get_buffer_size_hint): computed from the layouts the native side defines.
// Each takes the same arguments createGroup takes and refuses what createGroup refuses (EINVAL naming
// the argument): world sizes outside [1, 64], sizes past what a rank can map, unknown dtypes.
import { invalid } from './errors.js';
import { loadAddon } from './addon.js';
import { ELEMENT_BYTES, isDType, type DType } from './tensor.js';
import { MAX_SEGMENT_BYTES, checkBufferConfig, checkPositiveInt, type BufferConfig } from './validate.js';
import { checkKnownKeys } from './option-keys.js';

const ALIGN = 2 * 1024 * 1024;
/** Collectives of a session start at multiples of this (kernels/protocol.hpp kRegionAlignment). */
const REGION_ALIGN = 256;
const alignUp = (n: number, a = ALIGN): number => Math.ceil(n / a) * a;

export interface EpSizes {
  maxTokensPerRank: number;
  hidden: number;
  topk: number;
  numExperts: number;
  fp8Dispatch?: boolean;
  hybrid?: boolean;
}

/** The world size a hint is for: what createGroup accepts (ranks, or world.size). */
export function checkWorldSize(worldSize: unknown): number {
  if (typeof worldSize !== 'number' || !Number.isInteger(worldSize) || worldSize < 1 || worldSize > 64)
    throw invalid('worldSize', `must be an integer in [1, 64] (got ${String(worldSize)})`);
  return worldSize;
}

/** A size in bytes no rank can map is refused rather than returned. */
function checkResult(name: string, bytes: number): number {
  if (!(bytes <= MAX_SEGMENT_BYTES)) throw invalid(name, `needs ${bytes} bytes per rank, more than the ${MAX_SEGMENT_BYTES} a rank can map`);
  return bytes;
}

/** The workspace (signals, per-expert counters) a world of this size has; numExperts default one per rank. */
function workspaceBytes(numExperts: unknown, worldSize: number): number {
  const e = checkPositiveInt('numExperts', numExperts ?? worldSize, 1 << 16);
  if (e % worldSize !== 0) throw invalid('numExperts', `(${String(e)}) must be a multiple of the world size (${worldSize})`);
  return loadAddon().layout({ maxTokensPerRank: 1, hidden: 8, topk: 1, numExperts: e }, worldSize).workspace.bytes;
}

/** Bytes of symmetric memory (workspace + buffer) a rank needs for dispatch/combine; 2 MiB aligned. A group's whole `buffer` may be given. */
export function sizeHint(cfg: EpSizes & Pick<BufferConfig, 'cpuBytes' | 'bytes'>, worldSize: number): number {
  const w = checkWorldSize(worldSize);
  if (cfg === null || typeof cfg !== 'object' || Array.isArray(cfg)) throw invalid('config', 'must be { maxTokensPerRank, hidden, topk, numExperts, fp8Dispatch?, hybrid? }');
  checkBufferConfig(cfg, w, '');
  return checkResult('config', loadAddon().layout(cfg, w).sizeHint);
}

/** Bytes of host segment (buffer.cpuBytes) an engram table of this size needs; 2 MiB aligned. */
export function engramSizeHint(t: { entriesPerRank: number; hidden: number; dtype?: DType }): number {
  if (t === null || typeof t !== 'object' || Array.isArray(t)) throw invalid('table', 'must be { entriesPerRank, hidden, dtype? }');
  checkKnownKeys('table', t, ['entriesPerRank', 'hidden', 'dtype']);
  checkPositiveInt('entriesPerRank', t.entriesPerRank);
  checkPositiveInt('hidden', t.hidden);
  const dtype = t.dtype ?? 'bf16';
  if (!isDType(dtype)) throw invalid('dtype', `must be one of bf16, fp32, fp8e4m3, int32 (got ${String(dtype)})`);
  return checkResult('entriesPerRank', alignUp(t.entriesPerRank * t.hidden * ELEMENT_BYTES[dtype]));
}

/**
 * Bytes of buffer (buffer.bytes) a pipeline exchange of `maxBytes` per rank needs, workspace included.
 * `numExperts`: the group's buffer.numExperts (its per-expert counters live in the workspace); default one per rank.
 */
export function ppSizeHint(t: { maxBytes: number; numExperts?: number }, worldSize: number): number {
  const w = checkWorldSize(worldSize);
  if (t === null || typeof t !== 'object' || Array.isArray(t)) throw invalid('exchange', 'must be { maxBytes, numExperts? }');
  checkKnownKeys('exchange', t, ['maxBytes', 'numExperts']);
  checkPositiveInt('maxBytes', t.maxBytes, MAX_SEGMENT_BYTES);
  return checkResult('maxBytes', workspaceBytes(t.numExperts, w) + alignUp(t.maxBytes));
}

/** Bytes of buffer an AGRS session's collectives take: maxAllGathers regions of maxBytes from every rank. */
export function sessionBytes(maxBytes: number, maxAllGathers: number, worldSize: number): number {
  return maxAllGathers * alignUp(maxBytes * worldSize, REGION_ALIGN);
}

/**
 * The buffer.bytes a group needs to open a session of `maxBytes` per rank and `maxAllGathers`
 * collectives (what openSession checks), workspace included; 2 MiB aligned. `numExperts`: the group's
 * buffer.numExperts (default one per rank). A group also needs sizeHint(...) for dispatch/combine:
 * give it the larger of the two.
 */
export function sessionSizeHint(t: { maxBytes: number; maxAllGathers: number; numExperts?: number }, worldSize: number): number {
  const w = checkWorldSize(worldSize);
  if (t === null || typeof t !== 'object' || Array.isArray(t)) throw invalid('session', 'must be { maxBytes, maxAllGathers, numExperts? }');
  checkKnownKeys('session', t, ['maxBytes', 'maxAllGathers', 'numExperts']);
  checkPositiveInt('maxBytes', t.maxBytes, MAX_SEGMENT_BYTES);
  checkPositiveInt('maxAllGathers', t.maxAllGathers, 1 << 16);
  return checkResult('maxBytes', alignUp(workspaceBytes(t.numExperts, w) + sessionBytes(t.maxBytes, t.maxAllGathers, w)));
}
