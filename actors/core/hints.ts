// Size hints (DeepEP's get_buffer_size_hint): computed from the layouts the native side defines.
import { invalid } from './errors.js';
import { loadAddon } from './addon.js';
import { ELEMENT_BYTES, type DType } from './tensor.js';

const ALIGN = 2 * 1024 * 1024;
const alignUp = (n: number): number => Math.ceil(n / ALIGN) * ALIGN;
/** Every session collective starts its region at this alignment (kernels/protocol.hpp kRegionAlignment). */
const REGION = 256;

export interface EpSizes {
  maxTokensPerRank: number;
  hidden: number;
  topk: number;
  numExperts: number;
  fp8Dispatch?: boolean;
  hybrid?: boolean;
}

/** Bytes of symmetric memory (workspace + buffer) a rank needs for dispatch/combine; 2 MiB aligned. */
export function sizeHint(cfg: EpSizes, worldSize: number): number {
  if (!Number.isInteger(worldSize) || worldSize < 1 || worldSize > 64) throw invalid('worldSize', `must be an integer in [1, 64] (got ${worldSize})`);
  for (const k of ['maxTokensPerRank', 'hidden', 'topk', 'numExperts'] as const) {
    if (!Number.isInteger(cfg?.[k]) || cfg[k] <= 0) throw invalid(k, `must be a positive integer (got ${String(cfg?.[k])})`);
  }
  return loadAddon().layout(cfg, worldSize).sizeHint;
}

/** Bytes of host segment (buffer.cpuBytes) an engram table of this size needs; 2 MiB aligned. */
export function engramSizeHint(t: { entriesPerRank: number; hidden: number; dtype?: DType }): number {
  if (!Number.isInteger(t?.entriesPerRank) || t.entriesPerRank <= 0) throw invalid('entriesPerRank', 'must be a positive integer');
  if (!Number.isInteger(t.hidden) || t.hidden <= 0) throw invalid('hidden', 'must be a positive integer');
  return alignUp(t.entriesPerRank * t.hidden * ELEMENT_BYTES[t.dtype ?? 'bf16']);
}

/** Bytes of buffer a pipeline exchange of `maxBytes` per rank needs (plus the workspace). */
/** `numExperts`: the group's buffer.numExperts (its per-expert counters live in the workspace); default one per rank. */
export function ppSizeHint(t: { maxBytes: number; numExperts?: number }, worldSize: number): number {
  if (!Number.isInteger(t?.maxBytes) || t.maxBytes <= 0) throw invalid('maxBytes', 'must be a positive integer');
  const numExperts = t.numExperts ?? worldSize;
  if (!Number.isInteger(numExperts) || numExperts <= 0 || numExperts % worldSize !== 0)
    throw invalid('numExperts', `must be a positive multiple of the world size (got ${String(t.numExperts)})`);
  const ws = loadAddon().layout({ maxTokensPerRank: 1, hidden: 8, topk: 1, numExperts }, worldSize).workspace.bytes;
  return ws + alignUp(t.maxBytes);
}

/**
 * Bytes of symmetric memory (buffer.bytes) for AGRS sessions of up to `maxAllGathers` collectives of
 * `maxBytes` per rank each (what openSession({ maxBytes, maxAllGathers }) needs), 2 MiB aligned.
 * Sessions and dispatch/combine use the same buffer, one at a time: a group that does both needs
 * the larger of this and sizeHint. `numExperts`: the group's buffer.numExperts, as for ppSizeHint.
 */
export function sessionSizeHint(t: { maxBytes: number; maxAllGathers: number; numExperts?: number }, worldSize: number): number {
  if (!Number.isInteger(worldSize) || worldSize < 1 || worldSize > 64) throw invalid('worldSize', `must be an integer in [1, 64] (got ${worldSize})`);
  if (!Number.isInteger(t?.maxBytes) || t.maxBytes <= 0) throw invalid('maxBytes', 'must be a positive integer');
  if (!Number.isInteger(t.maxAllGathers) || t.maxAllGathers <= 0) throw invalid('maxAllGathers', 'must be a positive integer');
  const perCollective = Math.ceil((t.maxBytes * worldSize) / REGION) * REGION;
  return ppSizeHint({ maxBytes: t.maxAllGathers * perCollective, ...(t.numExperts !== undefined ? { numExperts: t.numExperts } : {}) }, worldSize);
}
