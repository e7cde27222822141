// Every environment variable rankflow reads, with its default, in one place.
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import path from 'node:path';

const env = process.env;
const num = (v: string | undefined, fallback: number): number => (v !== undefined && v !== '' && Number.isFinite(Number(v)) ? Number(v) : fallback);

/** Root of the package: the nearest folder above this file with a package.json (from dist/ or from the sources). */
export const PACKAGE_ROOT = ((): string => {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  while (!existsSync(path.join(dir, 'package.json')) && path.dirname(dir) !== dir) dir = path.dirname(dir);
  return dir;
})();

export const config = {
  /** RANKFLOW_BACKEND: overrides `backend: 'auto'` ('host' | 'cuda'). */
  backend: env.RANKFLOW_BACKEND as 'host' | 'cuda' | undefined,
  /**
   * RANKFLOW_ADDON: path of the native addon to load, and no other; default: the source build
   * (build/native/Release/rankflow.node) if there is one, else the prebuilt addon for this machine
   * (prebuilds/<platform>-<arch>/rankflow-{cuda,host}.node; actors/core/addon-select.ts).
   * The build's own switches (RANKFLOW_BUILD_CUDA, ...) are read in native/build-config.mjs.
   */
  addonOverride: env.RANKFLOW_ADDON === '' ? undefined : env.RANKFLOW_ADDON,
  /** RANKFLOW_CPU_TIMEOUT / RANKFLOW_GPU_TIMEOUT: default timeouts in seconds (API: 300 and 100). */
  cpuSeconds: num(env.RANKFLOW_CPU_TIMEOUT, 300),
  gpuSeconds: num(env.RANKFLOW_GPU_TIMEOUT, 100),
  /** RANKFLOW_HOST_RANKS: default rank count of the host backend (API: 2). */
  hostRanks: num(env.RANKFLOW_HOST_RANKS, 2),
  /** RANKFLOW_RENDEZVOUS_TIMEOUT: seconds a process waits for the others of its world, unless timeouts.cpuSeconds is given. */
  rendezvousSeconds: num(env.RANKFLOW_RENDEZVOUS_TIMEOUT, 60),
  /** RANKFLOW_WORLD_TOKEN: the world's shared secret when world.token is not given (required off loopback). */
  worldToken: env.RANKFLOW_WORLD_TOKEN !== undefined && env.RANKFLOW_WORLD_TOKEN !== '' ? env.RANKFLOW_WORLD_TOKEN : undefined,
  /** NCCL_HOME: where the cuda backend looks for libnccl.so.2 first. */
  ncclHome: env.NCCL_HOME,
  /**
   * NCCL_HOSTID (NCCL's own): the host identity NCCL hashes once per process. Where it is unset, a cuda
   * process of a world sets it to one per rankflow node (actors/world/nccl.ts); read at each createGroup.
   */
  get ncclHostId(): string | undefined { return env.NCCL_HOSTID === '' ? undefined : env.NCCL_HOSTID; },
  /** HOME and VIRTUAL_ENV: python environments whose nvidia-nccl package the cuda backend also tries. */
  pythonPrefixes: [env.VIRTUAL_ENV, env.HOME ? path.join(env.HOME, '.local') : undefined].filter((p): p is string => !!p),
  /** RANKFLOW_CE_MIN_BYTES: cuda AGRS puts of at least this many bytes per peer use copy engines (default 48 MiB); read at each createGroup. */
  get ceMinBytes(): number { return num(env.RANKFLOW_CE_MIN_BYTES, 48 * 1024 * 1024); },
  /** DEBUG: the switch most JavaScript tools read; `rankflow` in it turns on the debug log (actors/observe/debug.ts; NODE_DEBUG works through node itself). */
  debug: env.DEBUG,
  /**
   * RANKFLOW_TEST_FIRST_SEQ (tests only): the sequence number a group's collectives start after,
   * e.g. 4294967294 to run across 2^32; read at each createGroup and checked there (checkTestFirstSeq in validate.ts: at most 2^53 - 2^32).
   */
  get testFirstSeq(): string | undefined { return env.RANKFLOW_TEST_FIRST_SEQ === '' ? undefined : env.RANKFLOW_TEST_FIRST_SEQ; },
  /** RANKFLOW_COOPERATIVE=0: launch the cuda kernels that wait on each other without the cooperative attribute; read at each createGroup. */
  get cooperative(): boolean { return env.RANKFLOW_COOPERATIVE !== '0'; },
  /**
   * RANKFLOW_GRAPH_LAUNCH=0: launch the cuda kernels with cuLaunchKernelEx instead of as the one node of a graph kept per
   * kernel (native/src/backends/cuda/launch.hpp: ~1.5 µs less CPU per launch on the one-H200 machine); read at each createGroup.
   */
  get graphLaunch(): boolean { return env.RANKFLOW_GRAPH_LAUNCH !== '0'; },
  /**
   * RANKFLOW_FUSED_DISPATCH=0: run a cuda dispatch without a CPU sync as its two kernels (notify, then data) instead of as
   * one (rf_dispatch_fused, kernels/dispatch.cu); read at each createGroup.
   */
  get fusedDispatch(): boolean { return env.RANKFLOW_FUSED_DISPATCH !== '0'; },
} as const;
