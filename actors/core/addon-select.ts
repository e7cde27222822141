// Which build of the native addon a process loads, picked by what the machine has (as node-llama-cpp,
// sharp and onnxruntime-node pick theirs): RANKFLOW_ADDON when it is set, and nothing else; otherwise
// the source build (build/native/Release: `npm rebuild`, the install's fallback, a checkout), then the
// prebuilt addons the package carries for this platform (prebuilds/<platform>-<arch>/, made by
// native/prebuild.mjs): the cuda build first where the machine has an NVIDIA driver, the host build
// first elsewhere (the cuda build also runs host groups: libcuda is dlopen'ed only when cuda is asked
// for). Every candidate is loaded and probed before use; one passed over is said out loud.
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

import { config, PACKAGE_ROOT } from './config.js';

export type AddonOrigin = 'RANKFLOW_ADDON' | 'source' | 'prebuilt-cuda' | 'prebuilt-host';

export interface AddonCandidate {
  origin: AddonOrigin;
  path: string;
  /** as messages name it: 'source build', 'prebuilt cuda addon', ... */
  description: string;
}

export interface PassedOver extends AddonCandidate {
  error: string;
}

export interface AddonChoice<A> {
  /** the addon in use, undefined when none could be loaded (`error` says why) */
  loaded?: AddonCandidate & { addon: A };
  /** candidates that were there but failed to load or their probe, in the order tried */
  passedOver: PassedOver[];
  error?: string;
}

/** The source build's addon (native/build.mjs writes it there). */
export const SOURCE_ADDON = path.join(PACKAGE_ROOT, 'build', 'native', 'Release', 'rankflow.node');
/** The prebuilt addons of this platform (native/build-config.mjs names them alike). */
export const PREBUILDS_DIR = path.join(PACKAGE_ROOT, 'prebuilds', `${process.platform}-${process.arch}`);
const prebuilt = (variant: 'host' | 'cuda'): AddonCandidate => ({
  origin: `prebuilt-${variant}`, path: path.join(PREBUILDS_DIR, `rankflow-${variant}.node`), description: `prebuilt ${variant} addon`,
});

/**
 * Whether this machine has an NVIDIA driver: its kernel module or device nodes, or libcuda.so.1 where
 * the addon's driver loader looks (native/src/backends/cuda/driver.cc). The build asks the same
 * (native/build-config.mjs hasNvidiaDriver); keep the two lists alike.
 */
export function hasNvidiaDriver(): boolean {
  return ['/proc/driver/nvidia/version', '/dev/nvidiactl', '/dev/dxg', '/usr/local/nvidia/lib64/libcuda.so.1',
    '/usr/lib/x86_64-linux-gnu/libcuda.so.1', '/usr/lib64/libcuda.so.1', '/usr/lib/wsl/lib/libcuda.so.1'].some((p) => existsSync(p));
}

/** Whether the cuda build is preferred: RANKFLOW_BACKEND says so, or the machine has a driver (and RANKFLOW_BACKEND is not host). */
export const cudaWanted = (): boolean => config.backend === 'cuda' || (config.backend !== 'host' && hasNvidiaDriver());

/** The candidates in the order they are tried (files that are not there are skipped when choosing). */
export function addonCandidates(opts: { cuda?: boolean; prebuiltOnly?: boolean } = {}): AddonCandidate[] {
  if (config.addonOverride !== undefined) return [{ origin: 'RANKFLOW_ADDON', path: path.resolve(config.addonOverride), description: 'addon RANKFLOW_ADDON names' }];
  const cuda = opts.cuda ?? cudaWanted();
  return [
    ...(opts.prebuiltOnly ? [] : [{ origin: 'source' as const, path: SOURCE_ADDON, description: 'source build' }]),
    ...(cuda ? [prebuilt('cuda'), prebuilt('host')] : [prebuilt('host'), prebuilt('cuda')]),
  ];
}

/** What is wrong with a loaded module as a rankflow addon (it must make contexts and lay out buffers), or undefined. */
export function probeAddon(addon: unknown): string | undefined {
  const a = addon as { Context?: unknown; layout?: (ep: object, w: number) => { sizeHint?: unknown } } | null;
  if (a === null || typeof a !== 'object' || typeof a.Context !== 'function' || typeof a.layout !== 'function')
    return 'it is not a rankflow addon (no Context, no layout)';
  try {
    const l = a.layout({ maxTokensPerRank: 1, hidden: 8, topk: 1, numExperts: 1 }, 1);
    if (typeof l?.sizeHint !== 'number' || !(l.sizeHint > 0)) return `its layout() answered ${JSON.stringify(l)}`;
  } catch (e) {
    return `its layout() threw: ${(e as Error).message}`;
  }
  return undefined;
}

/**
 * Loads the first candidate that is there and passes its probe. A source build without the CUDA
 * backend is passed over (kept as the last resort) where the cuda build is wanted and shipped: an
 * `npm rebuild` on a GPU machine without nvcc must not hide the prebuilt cuda addon.
 */
export function chooseAddon<A>(candidates: AddonCandidate[], load: (file: string) => unknown = createRequire(import.meta.url), wantCuda = cudaWanted()): AddonChoice<A> {
  const passedOver: PassedOver[] = [];
  const cuda = wantCuda && candidates.some((c) => c.origin === 'prebuilt-cuda' && existsSync(c.path));
  let reserve: (AddonCandidate & { addon: A }) | undefined;
  for (const c of candidates) {
    if (reserve && c.origin !== 'prebuilt-cuda') continue;  // only a build with the CUDA backend beats the reserve
    if (!existsSync(c.path)) {
      if (c.origin === 'RANKFLOW_ADDON') return { passedOver, error: `RANKFLOW_ADDON names ${c.path}, which does not exist` };
      continue;
    }
    let addon: unknown;
    try {
      addon = load(c.path);
    } catch (e) {
      passedOver.push({ ...c, error: (e as Error).message.split('\n')[0]! });
      continue;
    }
    const problem = probeAddon(addon);
    if (problem !== undefined) {
      passedOver.push({ ...c, error: problem });
      continue;
    }
    if (c.origin === 'source' && cuda && typeof (addon as { cudaProbe?: unknown }).cudaProbe !== 'function') {
      reserve = { ...c, addon: addon as A };
      passedOver.push({ ...c, error: 'it has no CUDA backend (built without nvcc) and this machine has an NVIDIA driver' });
      continue;
    }
    return { loaded: { ...c, addon: addon as A }, passedOver };
  }
  if (reserve) return { loaded: reserve, passedOver: passedOver.filter((p) => p.origin !== 'source') };
  const looked = candidates.map((c) => c.path).join(', ');
  const failed = passedOver.map((p) => `\n  ${p.path} (${p.description}): ${p.error}`).join('');
  return {
    passedOver,
    error: failed
      ? `no build of the native addon could be loaded:${failed}\nBuild it from source: \`npm rebuild rankflow\` (docs/install.md)`
      : `the native addon is not built and no prebuilt addon ships for ${process.platform}-${process.arch} (looked for ${looked}): ` +
        'its install script did not run; run `npm rebuild rankflow` (pnpm: `pnpm approve-builds`), or `npm run build` in a checkout of rankflow',
  };
}

/** The install hook's question (native/install.mjs): does a prebuilt addon load here? */
export function findPrebuilt(): AddonChoice<unknown> {
  return chooseAddon(addonCandidates({ prebuiltOnly: true }));
}

/** The sentence said when candidates were passed over: "... failed ...; falling back to ...". */
export function fallbackMessage(choice: AddonChoice<unknown>): string | undefined {
  if (choice.passedOver.length === 0 || !choice.loaded) return undefined;
  const why = choice.passedOver.map((p) => `the ${p.description} at ${p.path} was passed over: ${p.error}`).join('; ');
  return `rankflow: ${why}; falling back to the ${choice.loaded.description} at ${choice.loaded.path}`;
}
