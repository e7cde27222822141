// Shared by the GPU tests (node:test on the compiled package: `npm run test:gpu`, on a machine with
// 2 GPUs). They import the built JS in dist/, as an installed package would.
import { readdirSync } from 'node:fs';

export * from '../../dist/actors/index.js';
import { createGroup, probeCuda, tensor } from '../../dist/actors/index.js';

export const MiB = 1 << 20;
/** A small MoE buffer with room for a 1.8 MB allGather (2 parts plus the cuda staging area). */
export const BUFFER = { maxTokensPerRank: 8, hidden: 128, topk: 2, numExperts: 4, bytes: 16 * MiB };

/** Fails the whole file up front, with the probe's reason, where the GPUs are not usable. */
export function requireTwoGpus() {
  const probe = probeCuda();
  if (!probe.available) throw new Error(`the CUDA backend is unavailable: ${probe.reason}`);
  if (probe.devices < 2) throw new Error(`these tests need 2 GPUs; the driver sees ${probe.devices}`);
  return probe;
}

export const cudaGroup = (opts = {}) => createGroup({ backend: 'cuda', ranks: 2, buffer: BUFFER, ...opts });
export const hostGroup = (opts = {}) => createGroup({ backend: 'host', ranks: 2, buffer: BUFFER, ...opts });

export const openFds = () => readdirSync('/proc/self/fd').length;

/** Deterministic data per (rank, round): a tensor of `dtype` and `shape` whose bytes all differ. */
export function pattern(dtype, shape, rank, round) {
  const t = tensor(dtype, shape);
  const bytes = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 131 + rank * 17 + round * 29 + 1) & 0xff;
  // Keep bf16/fp32 values finite and non-NaN so that nothing could canonicalise them on the way.
  if (dtype === 'bf16') for (let i = 0; i < t.data.length; i++) t.data[i] &= 0x3fff;
  if (dtype === 'fp32') for (let i = 0; i < t.data.length; i++) t.data[i] = (i % 1000) * 0.5 + rank - round;
  return t;
}

export const bytesOfTensor = (t) => new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
