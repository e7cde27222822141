// Every environment variable the addon's build reads (npm's install hook native/install.mjs, the
// source build native/build.mjs, the prebuilt addons native/prebuild.mjs), with its default, in one
// place: the run-time ones are in actors/core/config.ts. docs/install.md documents the switches.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const env = process.env;

/** The package's root (native/..). */
export const PACKAGE_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

/** A build switch: '1' on, '0' off, unset or '' the default; anything else is refused, naming it. */
function onOff(name) {
  const v = env[name];
  if (v === undefined || v === '' || v === 'auto') return 'auto';
  if (v === '1' || v === 'on' || v === 'true') return true;
  if (v === '0' || v === 'off' || v === 'false') return false;
  throw new Error(`${name} must be 1 (on), 0 (off) or unset (auto); got '${v}'`);
}

/** The variants a prebuilt addon comes in (prebuilds/<platform>-<arch>/rankflow-<variant>.node). */
export const VARIANTS = ['host', 'cuda'];

function variants(name) {
  const v = env[name];
  if (v === undefined || v === '') return [...VARIANTS];
  const list = v.split(/[\s,]+/).filter(Boolean);
  const bad = list.find((x) => !VARIANTS.includes(x));
  if (bad !== undefined || list.length === 0) throw new Error(`${name} must list variants among ${VARIANTS.join(', ')} (e.g. 'host' or 'host,cuda'); got '${v}'`);
  return VARIANTS.filter((x) => list.includes(x));
}

export const buildConfig = {
  /**
   * RANKFLOW_BUILD_CUDA: 1 builds the CUDA backend and its kernels (an error without nvcc and cuda.h),
   * 0 never; unset: where nvcc and cuda.h are found and, installed as a dependency, this machine has an
   * NVIDIA driver (a checkout builds it without one: native/build.mjs cudaChoice).
   */
  cuda: onOff('RANKFLOW_BUILD_CUDA'),
  /** RANKFLOW_CUDA_ARCHS: the kernels' GPU architectures, e.g. '90' or '80;90;100' (default: kernels/kernels.cmake's 80;90;100). */
  cudaArchs: env.RANKFLOW_CUDA_ARCHS === '' ? undefined : env.RANKFLOW_CUDA_ARCHS,
  /** RANKFLOW_BUILD_FROM_SOURCE=1: `npm install` compiles even where a prebuilt addon fits (`npm rebuild` always compiles). */
  fromSource: onOff('RANKFLOW_BUILD_FROM_SOURCE') === true,
  /** RANKFLOW_PREBUILDS: the prebuilt addons `npm pack` makes (prepack): 'host,cuda' (default) or 'host'. */
  prebuilds: variants('RANKFLOW_PREBUILDS'),
  /** npm_command (npm's own): 'rebuild' when `npm rebuild` runs the install hook. */
  npmCommand: env.npm_command,
  /** CUDA_HOME, then CUDA_PATH: where nvcc and cuda.h are looked for (as native/src/backends/cuda/sources.cmake does), then PATH and /usr/local/cuda. */
  cudaHome: env.CUDA_HOME || env.CUDA_PATH || undefined,
  /** PATH: where nvcc is looked for. */
  searchPath: (env.PATH ?? '').split(path.delimiter).filter(Boolean),
  /** CI: set by CI services; the progress lines then go to stderr only, not to the terminal. */
  ci: env.CI !== undefined && env.CI !== '' && env.CI !== 'false',
};

/** nvcc as the build would find it, or undefined. */
export function findNvcc() {
  const dirs = [...(buildConfig.cudaHome ? [path.join(buildConfig.cudaHome, 'bin')] : []), ...buildConfig.searchPath, '/usr/local/cuda/bin'];
  return dirs.map((d) => path.join(d, 'nvcc')).find((p) => existsSync(p));
}

/** The folder holding cuda.h, or undefined (native/src/backends/cuda/sources.cmake looks in the same places). */
export function findCudaHeaders() {
  const roots = [...(buildConfig.cudaHome ? [buildConfig.cudaHome] : []), '/usr/local/cuda'];
  const dirs = roots.flatMap((r) => [path.join(r, 'include'), path.join(r, 'targets', 'x86_64-linux', 'include')]);
  return dirs.find((d) => existsSync(path.join(d, 'cuda.h')));
}

/**
 * Whether this machine has an NVIDIA driver: its kernel module or device nodes, or libcuda.so.1 where
 * the addon's loader looks (native/src/backends/cuda/driver.cc). The run-time loader asks the same
 * (actors/core/addon-select.ts hasNvidiaDriver); keep the two lists alike.
 */
export function hasNvidiaDriver() {
  return ['/proc/driver/nvidia/version', '/dev/nvidiactl', '/dev/dxg', '/usr/local/nvidia/lib64/libcuda.so.1',
    '/usr/lib/x86_64-linux-gnu/libcuda.so.1', '/usr/lib64/libcuda.so.1', '/usr/lib/wsl/lib/libcuda.so.1'].some((p) => existsSync(p));
}

/** The addon a source build leaves, where the loader looks first. */
export const SOURCE_ADDON = path.join(PACKAGE_ROOT, 'build', 'native', 'Release', 'rankflow.node');

/** Where the prebuilt addons of this platform live in the package. */
export const PREBUILDS_DIR = path.join(PACKAGE_ROOT, 'prebuilds', `${process.platform}-${process.arch}`);
export const prebuiltPath = (variant) => path.join(PREBUILDS_DIR, `rankflow-${variant}.node`);

/** Installed as a dependency (under node_modules), not a checkout of rankflow: the build then leaves nothing but the addon. */
export const AS_DEPENDENCY = PACKAGE_ROOT.split(path.sep).includes('node_modules');
