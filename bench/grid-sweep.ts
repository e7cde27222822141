// Grid-size sweep (node dist/bench/grid-sweep.js [--ranks 1] [--tokens 128] [--grids 1,2,4,...]): the
// device time of a cached dispatch and of a combine for each grid (numSms), on a cuda group whose
// ranks share GPU 0, with the cooperative launch attribute and without (RANKFLOW_COOPERATIVE=0 is
// read at each createGroup). What grows with the grid is what each block costs, not the data.
// Prints a table; writes bench/results/grid-sweep-<date>.json with date, commit, machine and command.
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { createGroup, sizeHint } from '../actors/index.js';
import { PACKAGE_ROOT } from '../actors/core/config.js';
import type { GridFigure, GridSweepArgs } from './programs/grid-sweep.js';
import { provenance } from './provenance.js';

const { values: flags } = parseArgs({
  options: {
    ranks: { type: 'string', default: '1' },
    tokens: { type: 'string', default: '128' },
    grids: { type: 'string', default: '1,2,4,8,16,32,66,132' },
    iters: { type: 'string', default: '200' },
    label: { type: 'string', default: '' },
    out: { type: 'string', default: path.join(PACKAGE_ROOT, 'bench', 'results') },
  },
});
const ranks = Number(flags.ranks);
const ep = { maxTokensPerRank: Number(flags.tokens), hidden: 7168, topk: 8, numExperts: 256 };
const args: GridSweepArgs = { hidden: ep.hidden, topk: ep.topk, experts: ep.numExperts, tokens: ep.maxTokensPerRank, grids: flags.grids!.split(',').map(Number), iters: Number(flags.iters) };

const runs: Record<string, GridFigure[]> = {};
for (const cooperative of [true, false]) {
  if (!cooperative) process.env.RANKFLOW_COOPERATIVE = '0';
  const g = await createGroup({ backend: 'cuda', ranks, devices: Array(ranks).fill(0), buffer: { ...ep, bytes: sizeHint(ep, ranks) } });
  try {
    const per = await g.run<GridFigure[]>(new URL('./programs/grid-sweep.js', import.meta.url), args);
    runs[cooperative ? 'cooperative' : 'plain launch'] = per[0]!.map((f, i) => ({ ...f, device_us: Math.max(...per.map((r) => r[i]!.device_us)) }));
  } finally {
    await g.destroy();
  }
}
delete process.env.RANKFLOW_COOPERATIVE;

const label = flags.label ? ` [${flags.label}]` : '';
console.log(`grid sweep${label}: ${ranks} rank(s) sharing GPU 0, ${args.tokens} tokens x ${args.hidden} bf16, top-${args.topk} of ${args.experts}; device µs (median of ${args.iters})`);
for (const [name, figs] of Object.entries(runs)) {
  console.log(`\n${name}`);
  console.log(`${'op'.padEnd(40)} ${args.grids.map((g) => String(g).padStart(7)).join('')}`);
  for (const op of [...new Set(figs.map((f) => f.op))]) {
    const row = figs.filter((f) => f.op === op);
    console.log(`${op.padEnd(40)} ${row.map((f) => f.device_us.toFixed(1).padStart(7)).join('')}`);
  }
}
const result = { ...provenance(), label: flags.label, ranks, config: args, runs };
mkdirSync(flags.out!, { recursive: true });
const file = path.join(flags.out!, `grid-sweep-${result.date.slice(0, 19).replace(/:/g, '-')}${flags.label ? `-${flags.label}` : ''}.json`);
writeFileSync(file, JSON.stringify(result, null, 2) + '\n');
console.log(`wrote ${file}`);
