// What a call costs on the CPU (node --cpu-prof --cpu-prof-dir=DIR dist/bench/call-profile.js
// [--op dispatch|dispatch-nosync|combine|barrier] [--iters 20000] [--tokens 128]): a cuda group of 1 rank runs one op back to back
// in a rank program; the rank's worker thread writes its own profile. Prints µs per call.
import { parseArgs } from 'node:util';

import { createGroup, sizeHint } from '../actors/index.js';
import type { CallLoopArgs } from './programs/call-loop.js';

const { values: flags } = parseArgs({ options: { op: { type: 'string', default: 'dispatch' }, iters: { type: 'string', default: '20000' }, tokens: { type: 'string', default: '128' } } });
const ep = { maxTokensPerRank: Number(flags.tokens), hidden: 7168, topk: 8, numExperts: 256 };
const g = await createGroup({ backend: 'cuda', ranks: 1, devices: [0], buffer: { ...ep, bytes: sizeHint(ep, 1) } });
try {
  for (const op of flags.op!.split(',')) {
    const args: CallLoopArgs = { hidden: ep.hidden, topk: ep.topk, experts: ep.numExperts, tokens: ep.maxTokensPerRank, iters: Number(flags.iters), op: op as CallLoopArgs['op'] };
    const [us] = await g.run<number>(new URL('./programs/call-loop.js', import.meta.url), args);
    console.log(`${op}: ${us!.toFixed(2)} µs per call (${args.iters} back to back, a sync every 64)`);
  }
} finally {
  await g.destroy();
}
