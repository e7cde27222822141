// How a GPU benchmark places its ranks: one process hosting every rank (createGroup({ ranks: W })),
// or one process per GPU (`--world`: the bench forks itself once per GPU, child k hosts global rank
// k on GPU k with createGroup({ ranks: 1, devices: [k], world })). Either way the same rank program
// runs and the launcher gets every rank's result, in rank order, to report as one group's.
import { fork, type ChildProcess } from 'node:child_process';

import { createGroup, type BufferConfig } from '../actors/index.js';
import { freePort } from './free-port.js';

export interface Layout {
  name: string;
  processes: number;
  ranksPerProcess: number;
}

export interface RunOptions {
  /** the bench's own compiled file (import.meta.url's path): forked for --world */
  self: string;
  /** the bench's command line, passed on to the children */
  argv: string[];
  world: boolean;
  /** set in a child: which rank it hosts and where to meet */
  child?: { rank: number; rendezvous: string };
  ranks: number;
  buffer: BufferConfig;
  program: URL;
  args: unknown;
}

/** GPU names and the program's results in rank order; undefined in a child (it has sent its part). */
export async function runOnGpus<R>(o: RunOptions): Promise<{ results: R[]; gpus: string[]; layout: Layout } | undefined> {
  if (o.child) {
    const { rank, rendezvous } = o.child;
    const group = await createGroup({ backend: 'cuda', ranks: 1, devices: [rank], buffer: o.buffer, world: { size: o.ranks, rankOffset: rank, rendezvous } });
    try {
      const gpu = (await group.info(0)).device?.name ?? 'unknown';
      const [result] = await group.run<R>(o.program, o.args);
      await new Promise<void>((resolve) => process.send!({ kind: 'result', rank, gpu, result }, () => resolve()));
    } finally {
      await group.destroy();
    }
    process.disconnect();
    return undefined;
  }
  if (!o.world) {
    const group = await createGroup({ backend: 'cuda', ranks: o.ranks, buffer: o.buffer });
    try {
      const gpus: string[] = [];
      for (let r = 0; r < group.size; r++) gpus.push((await group.info(r)).device?.name ?? 'unknown');
      const results = await group.run<R>(o.program, o.args);
      return { results, gpus, layout: { name: `1 process x ${o.ranks} GPUs`, processes: 1, ranksPerProcess: o.ranks } };
    } finally {
      await group.destroy();
    }
  }
  const rendezvous = `tcp://127.0.0.1:${await freePort()}`;
  const procs: ChildProcess[] = [];
  const parts = await Promise.all(Array.from({ length: o.ranks }, (_, k) => new Promise<{ gpu: string; result: R }>((resolve, reject) => {
    const proc = fork(o.self, [...o.argv, '--child', String(k), '--rendezvous', rendezvous], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    procs.push(proc);
    let got: { gpu: string; result: R } | undefined;
    proc.on('message', (m: { kind: string; gpu: string; result: R }) => { if (m.kind === 'result') got = m; });
    proc.on('exit', (code, signal) => (got && code === 0 ? resolve(got) : reject(new Error(`bench child ${k} exited (${signal ?? code}) without a result`))));
  }))).catch((e: unknown) => {
    // A child that failed leaves its peer waiting in a collective: end it too.
    for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
    throw e;
  });
  return {
    results: parts.map((p) => p.result), gpus: parts.map((p) => p.gpu),
    layout: { name: `${o.ranks} processes x 1 GPU (world)`, processes: o.ranks, ranksPerProcess: 1 },
  };
}
