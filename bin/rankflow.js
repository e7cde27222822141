#!/usr/bin/env node
// Entry of the `rankflow` command (compiled code in dist/).
import { main } from '../dist/actors/cli/main.js';

main(process.argv.slice(2)).then(
  (code) => { process.exitCode = code; },
  (e) => { console.error(`rankflow: ${e?.code ? `${e.code}: ` : ''}${e?.message ?? e}`); process.exitCode = 1; },
);
