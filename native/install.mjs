#!/usr/bin/env node
// npm's install hook. Installed from the tarball, the package carries prebuilt addons for its platforms
// (prebuilds/<platform>-<arch>/): when one loads here, there is nothing to compile and the install
// takes seconds; the addon is picked again at load time (actors/core/addon-select.ts), so
// `npm install --ignore-scripts` works as well. Otherwise, and for `npm rebuild` (or
// RANKFLOW_BUILD_FROM_SOURCE=1), it builds from source (native/build.mjs). A checkout of rankflow
// always builds: its sources are what is being worked on.
import { existsSync } from 'node:fs';
import path from 'node:path';

import { AS_DEPENDENCY, PACKAGE_ROOT, buildConfig } from './build-config.mjs';
import { buildFromSource, progressLog } from './build.mjs';

const log = progressLog();

/** Why this install compiles, or undefined when a prebuilt addon is used. */
async function reasonToBuild() {
  if (!AS_DEPENDENCY) return 'a checkout of rankflow';
  if (buildConfig.npmCommand === 'rebuild') return 'npm rebuild';
  if (buildConfig.fromSource) return 'RANKFLOW_BUILD_FROM_SOURCE=1';
  const loader = path.join(PACKAGE_ROOT, 'dist', 'actors', 'core', 'addon-select.js');
  if (!existsSync(loader)) return 'this copy of the package has no compiled loader (dist/)';
  const { findPrebuilt } = await import(loader);
  const found = findPrebuilt();
  for (const p of found.passedOver) log.say(`rankflow: ${p.description} failed its probe: ${p.error}`);
  if (!found.loaded) return found.error;
  log.detail(`rankflow: using the ${found.loaded.description} (${path.relative(PACKAGE_ROOT, found.loaded.path)}): nothing to compile`);
  return undefined;
}

try {
  const reason = await reasonToBuild();
  if (reason !== undefined) await buildFromSource(reason, log);
} catch (e) {
  log.say(`rankflow: install failed: ${e.message}`);
  log.say('rankflow: docs/install.md says how to build from source and which switches there are');
  process.exitCode = 1;
} finally {
  log.close();
}
