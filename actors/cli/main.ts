// The `rankflow` command: demo, doctor, inspect.
import { runDemo } from './demo.js';
import { runDemoWithTimeline, runInspect, type RunDemo } from './inspect.js';
import { describeMachine } from '../observe/machine-graph.js';
import { rankMachine } from '../../machines/index.js';
import { probeCuda, resolveBackend } from '../core/backend.js';
import { config } from '../core/config.js';
import { loadAddon } from '../core/addon.js';

const USAGE = `usage: rankflow <command>
  demo [--ranks N] [--backend auto|host|cuda] [--timeline out.svg]   run a group: transitions, barrier, allGather, dispatch/combine
  inspect [--port N] [--exit]                                       the demo with the live inspector page on loopback
  doctor                                                            what this machine has: GPUs, driver, NCCL, kernels, what 'auto' picks`;

const demo: RunDemo = ({ argv, observers }) => runDemo({ argv, observers });

function doctor(): number {
  const lines: string[] = [];
  try {
    loadAddon();
    lines.push(`addon: ${config.addonPath} (loaded)`);
  } catch (e) {
    lines.push(`addon: ${(e as Error).message}`);
    console.log(lines.join('\n'));
    return 1;
  }
  const probe = probeCuda();
  lines.push(`cuda: ${probe.available ? 'available' : `unavailable (${probe.reason ?? 'unknown'})`}`);
  for (const [k, v] of Object.entries(probe)) if (k !== 'available' && k !== 'reason') lines.push(`  ${k}: ${typeof v === 'object' ? JSON.stringify(v) : String(v)}`);
  let picked: string;
  try { picked = resolveBackend('auto'); } catch (e) { picked = `none (${(e as Error).message})`; }
  lines.push(`backend 'auto' picks: ${picked}`);
  console.log(lines.join('\n'));
  return 0;
}

export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  switch (command) {
    case 'demo':
      return runDemoWithTimeline(rest, { runDemo: demo });
    case 'inspect':
      return runInspect(rest, { runDemo: demo, machine: describeMachine(rankMachine) });
    case 'doctor':
      return doctor();
    case undefined: case 'help': case '--help': case '-h':
      console.log(USAGE);
      return command === undefined ? 2 : 0;
    default:
      console.error(`rankflow: unknown command '${command}'\n${USAGE}`);
      return 2;
  }
}
