#!/usr/bin/env node
// Builds the native addon from source with cmake-js (offline: the Node-API headers come with it): the
// fallback where no prebuilt addon fits, what `npm rebuild rankflow` runs, and the build of a checkout
// (`npm run build`). It says what it builds and why (the CUDA backend only where nvcc and cuda.h are
// found and it is wanted: RANKFLOW_BUILD_CUDA, native/build-config.mjs), shows its progress, and
// installed as a dependency it builds outside the package and keeps only the addon.
//   node native/build.mjs                       the source build, into build/native/Release/rankflow.node
import { spawn } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, openSync, rmSync, writeSync, closeSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { AS_DEPENDENCY, PACKAGE_ROOT, SOURCE_ADDON, buildConfig, findCudaHeaders, findNvcc, hasNvidiaDriver } from './build-config.mjs';

const require = createRequire(import.meta.url);

/**
 * Where a line of progress goes: stderr always (npm shows it with --foreground-scripts, and when the
 * build fails); also the terminal, when there is one and stderr is not it: npm runs a dependency's
 * install script with its output captured, so a build of a minute would otherwise be silent.
 */
export function progressLog() {
  let tty = -1;
  if (!process.stderr.isTTY && !buildConfig.ci) {
    try {
      tty = openSync('/dev/tty', 'w');
    } catch {
      tty = -1;  // no controlling terminal (CI, a service): stderr only
    }
  }
  return {
    /** a line for both */
    say(line) {
      process.stderr.write(`${line}\n`);
      // From the line's start, cleared: npm may be drawing its spinner there.
      if (tty >= 0) writeSync(tty, `\r\x1b[K${line}\n`);
    },
    /** the build tools' own lines: stderr only */
    detail(line) {
      process.stderr.write(`${line}\n`);
    },
    close() {
      if (tty >= 0) closeSync(tty);
      tty = -1;
    },
  };
}

/**
 * Whether to build the CUDA backend, and why: RANKFLOW_BUILD_CUDA, else where nvcc and cuda.h are found
 * and it is wanted: installed as a dependency, where the machine has an NVIDIA driver (kernels for three
 * architectures take minutes, for nothing on a machine without a GPU); in a checkout, always (the
 * kernels are part of what is worked on: CI compile-checks them so).
 */
export function cudaChoice() {
  const nvcc = findNvcc();
  const headers = findCudaHeaders();
  if (buildConfig.cuda === false) return { cuda: false, why: 'RANKFLOW_BUILD_CUDA=0' };
  if (buildConfig.cuda === true) {
    if (!nvcc || !headers) {
      throw new Error(`RANKFLOW_BUILD_CUDA=1, but ${!nvcc ? 'nvcc' : 'cuda.h'} was not found (looked in CUDA_HOME, CUDA_PATH, PATH and /usr/local/cuda): ` +
        'install the CUDA toolkit or set CUDA_HOME, or build without CUDA (RANKFLOW_BUILD_CUDA=0)');
    }
    return { cuda: true, why: `RANKFLOW_BUILD_CUDA=1 (nvcc at ${nvcc})` };
  }
  if (!nvcc) return { cuda: false, why: 'no nvcc found (RANKFLOW_BUILD_CUDA=1 and CUDA_HOME to build it)' };
  if (!headers) return { cuda: false, why: `nvcc at ${nvcc} but no cuda.h beside it (set CUDA_HOME)` };
  if (hasNvidiaDriver()) return { cuda: true, why: `nvcc at ${nvcc} and an NVIDIA driver (RANKFLOW_BUILD_CUDA=0 skips it)` };
  if (!AS_DEPENDENCY) return { cuda: true, why: `nvcc at ${nvcc}, in a checkout of rankflow (RANKFLOW_BUILD_CUDA=0 skips it)` };
  return { cuda: false, why: `nvcc at ${nvcc} but no NVIDIA driver on this machine (RANKFLOW_BUILD_CUDA=1 builds it anyway)` };
}

/** A build tool's line as progress: ninja's "[7/35] ..." and make's "[ 45%] ...", as a fraction. */
export function progressOf(line) {
  const ninja = /^\[(\d+)\/(\d+)\]/.exec(line);
  if (ninja) return Number(ninja[1]) / Number(ninja[2]);
  const make = /^\[\s*(\d+)%\]/.exec(line);
  return make ? Number(make[1]) / 100 : undefined;
}

/**
 * cmake-js configure, then build, of native/ into `out`, every cmake variable the build depends on given:
 * a build folder keeps what it was configured with, and `cmake-js compile` would not configure again (a
 * switch changed since would be ignored). Resolves with the addon's path in `out`.
 */
export async function compile({ out, cuda, staticRuntime = false, archs = buildConfig.cudaArchs, log, label }) {
  const common = ['--directory', path.join(PACKAGE_ROOT, 'native'), '--out', out];
  await cmakeJs(['configure', ...common, `--CDRF_WITH_CUDA=${cuda ? 'ON' : 'OFF'}`, `--CDRF_STATIC_RUNTIME=${staticRuntime ? 'ON' : 'OFF'}`,
    `--CDRF_CUDA_ARCHS=${archs ?? ''}`], log, label);
  await cmakeJs(['build', ...common], log, label);
  return path.join(out, 'Release', 'rankflow.node');
}

/** Runs cmake-js with `args`: its lines to stderr, the build's progress (ninja's or make's) as a line per tenth. */
function cmakeJs(args, log, label) {
  const bin = require.resolve('cmake-js/bin/cmake-js');
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [bin, ...args], { cwd: PACKAGE_ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let shown = -1;
    let last = 0;
    const onLine = (line) => {
      log.detail(line);
      const f = progressOf(line);
      // On the terminal: a line per tenth done, at most one each 5 s (but the last).
      if (f === undefined || f === 0) return;
      const tenth = Math.floor(f * 10);
      if (tenth > shown && (Date.now() - last > 5000 || f === 1)) {
        shown = tenth;
        last = Date.now();
        log.say(`rankflow: compiling ${label}: ${Math.round(f * 100)}%`);
      }
    };
    for (const stream of [child.stdout, child.stderr]) {
      let rest = '';
      stream.setEncoding('utf8');
      stream.on('data', (chunk) => {
        const lines = (rest + chunk).split('\n');
        rest = lines.pop();
        lines.forEach(onLine);
      });
      stream.on('end', () => rest && onLine(rest));
    }
    child.on('error', reject);
    child.on('close', (code, signal) => {
      if (code === 0) resolve();
      else reject(new Error(`cmake-js ${args[0]} ${signal ? `was killed (${signal})` : `failed (exit code ${code})`}: the lines above say why`));
    });
  });
}

/** Loads a freshly built addon and checks it holds what was asked (the CUDA backend and its kernels). */
export function verifyBuild(file, cuda) {
  const addon = require(file);
  if (typeof addon.Context !== 'function' || typeof addon.layout !== 'function') throw new Error(`${file} is not a rankflow addon (no Context, no layout)`);
  if (!cuda) return 'host backend';
  if (typeof addon.cudaProbe !== 'function') throw new Error(`${file} was built without the CUDA backend although it was asked for (was cuda.h found?)`);
  const kernels = addon.cudaProbe().kernels;
  if (!(kernels?.images > 0)) throw new Error(`${file} has no CUDA kernels: ${kernels?.note ?? 'no note'}`);
  return `host and CUDA backends, ${kernels.images} kernels ${kernels.note}`;
}

/** The source build: build/native/Release/rankflow.node (a checkout builds in build/native, incrementally). */
export async function buildFromSource(reason, log = progressLog()) {
  const t0 = Date.now();
  const { cuda, why } = cudaChoice();
  log.say(`rankflow: building the native addon from source (${reason}): the host backend${cuda ? ' and the CUDA backend' : ''}; ` +
    `CUDA ${cuda ? 'built' : 'skipped'}: ${why}`);
  if (cuda) log.say('rankflow: the CUDA kernels take several minutes on a few cores (RANKFLOW_CUDA_ARCHS=90 builds one architecture)');
  // A dependency's build leaves nothing behind but the addon: it builds in a temporary folder.
  const out = AS_DEPENDENCY ? mkdtempSync(path.join(os.tmpdir(), 'rankflow-build-')) : path.join(PACKAGE_ROOT, 'build', 'native');
  try {
    const built = await compile({ out, cuda, log, label: cuda ? 'host + CUDA' : 'host' });
    if (AS_DEPENDENCY) {
      mkdirSync(path.dirname(SOURCE_ADDON), { recursive: true });
      copyFileSync(built, SOURCE_ADDON);
    }
    const what = verifyBuild(SOURCE_ADDON, cuda);
    log.say(`rankflow: built ${path.relative(PACKAGE_ROOT, SOURCE_ADDON)} (${what}) in ${Math.round((Date.now() - t0) / 1000)} s`);
  } finally {
    if (AS_DEPENDENCY) rmSync(out, { recursive: true, force: true });
  }
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const log = progressLog();
  buildFromSource(process.argv[2] ?? 'npm run build', log).then(
    () => log.close(),
    (e) => {
      log.say(`rankflow: the source build failed: ${e.message}`);
      log.close();
      process.exitCode = 1;
    },
  );
}
