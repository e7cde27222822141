#!/usr/bin/env node
// The prebuilt addons the tarball carries, built by `npm pack` (prepack) and never committed:
// prebuilds/<platform>-<arch>/rankflow-host.node (the host backend) and rankflow-cuda.node (host and
// CUDA backends, the kernels' fatbins for sm_80/90/100 and PTX; libcuda and NCCL are dlopen'ed at run
// time, so it also loads, and runs host groups, where there is no GPU). Both carry their C++ runtime
// (RF_STATIC_RUNTIME). RANKFLOW_PREBUILDS=host makes only the host one (the CUDA one takes minutes).
// Each variant builds in its own folder under build/prebuild/, so packing again is incremental.
import { copyFileSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import path from 'node:path';

import { PACKAGE_ROOT, PREBUILDS_DIR, buildConfig, findCudaHeaders, findNvcc, prebuiltPath } from './build-config.mjs';
import { compile, progressLog, verifyBuild } from './build.mjs';

const log = progressLog();

async function prebuild() {
  const wanted = buildConfig.prebuilds;
  if (wanted.includes('cuda') && (!findNvcc() || !findCudaHeaders())) {
    throw new Error(`the cuda prebuilt addon needs nvcc and cuda.h (${findNvcc() ? 'no cuda.h' : 'no nvcc'} found; set CUDA_HOME), ` +
      'or pack without it: RANKFLOW_PREBUILDS=host npm pack');
  }
  // Only what this pack built may ship: a variant left from an earlier pack would not match the tree.
  rmSync(path.join(PACKAGE_ROOT, 'prebuilds'), { recursive: true, force: true });
  mkdirSync(PREBUILDS_DIR, { recursive: true });
  for (const variant of wanted) {
    const t0 = Date.now();
    const cuda = variant === 'cuda';
    log.say(`rankflow: prebuilding the ${variant} addon for ${process.platform}-${process.arch}`);
    const built = await compile({ out: path.join(PACKAGE_ROOT, 'build', 'prebuild', variant), cuda, staticRuntime: true, log, label: `the ${variant} prebuilt` });
    const dest = prebuiltPath(variant);
    copyFileSync(built, dest);
    log.say(`rankflow: ${path.relative(PACKAGE_ROOT, dest)}: ${verifyBuild(dest, cuda)} (${Math.round((Date.now() - t0) / 1000)} s)`);
  }
  log.say(`rankflow: prebuilds/${path.basename(PREBUILDS_DIR)}: ${readdirSync(PREBUILDS_DIR).join(', ')}`);
}

prebuild().then(
  () => log.close(),
  (e) => {
    log.say(`rankflow: prebuild failed: ${e.message}`);
    log.close();
    process.exitCode = 1;
  },
);
