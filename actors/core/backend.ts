// Picks the backend: `auto` is cuda where GPUs, the driver and a CUDA-enabled build are found,
// else host, and the fallback is said out loud (once) rather than hidden.
import { config } from './config.js';
import { RankflowError } from './errors.js';
import { loadAddon } from './addon.js';

export type Backend = 'host' | 'cuda';

export interface CudaProbe {
  available: boolean;
  reason?: string;
  devices?: number;
  [key: string]: unknown;
}

export function probeCuda(): CudaProbe {
  const addon = loadAddon();
  if (!addon.cudaProbe) return { available: false, reason: 'this build of the addon has no CUDA backend (no CUDA headers at build time)' };
  try {
    return addon.cudaProbe({ ...(config.ncclHome ? { ncclHome: config.ncclHome } : {}), pythonPrefixes: config.pythonPrefixes }) as CudaProbe;
  } catch (e) {
    return { available: false, reason: (e as Error).message };
  }
}

let saidFallback = false;

/** GPUs the driver sees (0 without a usable CUDA backend). */
export function cudaDeviceCount(): number {
  const probe = probeCuda();
  return probe.available && typeof probe.devices === 'number' ? probe.devices : 0;
}

export function resolveBackend(requested: 'auto' | Backend | undefined): Backend {
  const want = requested === undefined || requested === 'auto' ? config.backend ?? 'auto' : requested;
  if (want === 'host') return 'host';
  const probe = want === 'cuda' || want === 'auto' ? probeCuda() : { available: false };
  if (want === 'cuda') {
    if (!probe.available) throw new RankflowError('BACKEND_UNAVAILABLE', `backend 'cuda' is unavailable: ${probe.reason ?? 'no GPU found'}`);
    return 'cuda';
  }
  if (probe.available) return 'cuda';
  if (!saidFallback && (probe.devices ?? 0) > 0) {
    saidFallback = true;
    process.emitWarning(`rankflow: GPUs found but the cuda backend is unavailable (${probe.reason}); falling back to the host backend`);
  }
  return 'host';
}
