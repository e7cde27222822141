#!/usr/bin/env node
// Entry of the `rankflow` command (compiled code in dist/).
import { main } from '../dist/actors/cli/main.js';

// A reader that stops early (`rankflow doctor | head`): stop writing, as a pipe's writer does, quietly.
process.stdout.on('error', (e) => {
  if (e.code !== 'EPIPE') throw e;
  process.exit(process.exitCode ?? 0);
});

main(process.argv.slice(2)).then(
  (code) => { process.exitCode = code; },
  (e) => { console.error(`rankflow: ${e?.code ? `${e.code}: ` : ''}${e?.message ?? e}`); process.exitCode = 1; },
);
