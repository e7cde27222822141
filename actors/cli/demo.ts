/**
 * `rankflow demo`: a group of ranks on the backend found (host without GPUs) lives, synchronises,
 * moves tokens and dies, printing every transition as it happens and what it measured, with a
 * progress line on stderr for each phase so a large run is never silent. `--timeline out.svg`
 * and `--trace out.json` write the run's timeline (SVG, Chrome trace for Perfetto), also when
 * the demo fails, which is when they are most wanted.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { createGroup } from '../group.js';
import { RankflowError } from '../core/errors.js';
import { tensor, toBf16 } from '../core/tensor.js';
import { checkBufferConfig, type BufferConfig } from '../core/validate.js';
import { debug } from '../observe/debug.js';
import type { GroupObserver } from '../observe/observer.js';
import { TimelineRecorder } from '../observe/timeline-recorder.js';
import { UsageError, choiceFlag, intFlag, pathFlag, type CliIo, type Command, type DemoRun, type OptionSpec, type OptionValues } from './command.js';

export interface DemoSettings {
    ranks: number;
    backend: 'auto' | 'host' | 'cuda';
    tokens: number;
    hidden: number;
    rounds: number;
    quiet: boolean;
}

/** The demo's own flags; `inspect` takes them too and hands them on. */
export const DEMO_OPTIONS: OptionSpec = {
    ranks: { type: 'string', short: 'r' },
    backend: { type: 'string', short: 'b' },
    tokens: { type: 'string', short: 't' },
    hidden: { type: 'string' },
    rounds: { type: 'string', short: 'n' },
    quiet: { type: 'boolean', short: 'q' }
};

export const DEMO_DETAILS = `  -r, --ranks N       ranks in the group (default 4)
  -b, --backend B     auto, host or cuda (default auto: cuda where GPUs are usable)
  -t, --tokens N      tokens per rank for dispatch/combine (default 256)
  --hidden N          hidden size, a multiple of 8 (default 1024)
  -n, --rounds N      barriers timed (default 100)
  -q, --quiet         do not print each transition`;

const TOPK = 8;

/** The buffer the demo's group is made with: top-8 of 8 experts per rank. */
export function demoBuffer(o: Pick<DemoSettings, 'ranks' | 'tokens' | 'hidden'>): BufferConfig {
    return { maxTokensPerRank: o.tokens, hidden: o.hidden, topk: TOPK, numExperts: TOPK * o.ranks };
}

/** The buffer fields the demo's flags set. */
const FLAG_OF: Record<string, string> = { maxTokensPerRank: 'tokens', hidden: 'hidden' };

/**
 * Checks the demo's flags; throws UsageError naming the first one that is wrong, also where only the
 * group would refuse it (--hidden 100: not a multiple of 8), so a bad command line is a usage error
 * (exit 2) before anything starts, not a failed demo (exit 1).
 */
export function demoSettings(values: OptionValues): DemoSettings {
    const settings: DemoSettings = {
        ranks: intFlag(values, 'ranks', 4, 1, 64),
        backend: choiceFlag(values, 'backend', ['auto', 'host', 'cuda'] as const, 'auto'),
        tokens: intFlag(values, 'tokens', 256),
        hidden: intFlag(values, 'hidden', 1024),
        rounds: intFlag(values, 'rounds', 100),
        quiet: values.quiet === true
    };
    try {
        checkBufferConfig(demoBuffer(settings), settings.ranks);
    } catch (error) {
        const m = /^buffer\.(\w+): (.*)$/s.exec((error as Error).message);
        if (!m) throw error;
        throw new UsageError(`--${FLAG_OF[m[1]!] ?? m[1]} ${m[2]}`);
    }
    return settings;
}

export const demoCommand: Command = {
    name: 'demo',
    summary: 'run a group: transitions, barrier, allGather, dispatch/combine',
    usage:
        'usage: rankflow demo [-r|--ranks N] [-b|--backend auto|host|cuda] [-t|--tokens N] [--hidden N] [-n|--rounds N] [-q|--quiet] ' +
        '[--timeline out.svg] [--trace out.json]',
    details: `${DEMO_DETAILS}
  --timeline FILE     write the run's timeline as SVG when the demo ends
  --trace FILE        write the run as Chrome trace JSON (open it in ui.perfetto.dev)`,
    options: { ...DEMO_OPTIONS, timeline: { type: 'string' }, trace: { type: 'string' } },
    async run(values, context) {
        const settings = demoSettings(values);
        const files = { timeline: pathFlag(values, 'timeline'), trace: pathFlag(values, 'trace') };
        const recorder = files.timeline || files.trace ? new TimelineRecorder() : undefined;
        let code = 0;
        try {
            await (context.runDemo ?? runDemo)({ settings, observers: recorder ? [recorder] : [], io: context });
        } catch (error) {
            code = 1;
            context.err(`demo failed: ${(error as Error)?.message ?? String(error)}`);
        }
        if (recorder) await writeRunFiles(recorder, files, context);
        return code;
    }
};

/** Writes what `--timeline` and `--trace` ask for and says where. */
export async function writeRunFiles(recorder: TimelineRecorder, files: { timeline?: string; trace?: string }, io: CliIo): Promise<void> {
    if (files.timeline) io.out(`timeline written to ${await writeTimeline(files.timeline, recorder)}`);
    if (files.trace) io.out(`trace written to ${await writeTrace(files.trace, recorder)} (open it in ui.perfetto.dev)`);
}

/** Writes a recorder's timeline as SVG to `path` (directories created); returns the full path. */
export async function writeTimeline(path: string, recorder: TimelineRecorder, title = 'rankflow demo'): Promise<string> {
    return writeCreating(path, recorder.toSvg({ title }));
}

/** Writes a recorder's run as Chrome trace JSON to `path`, this process as the trace's process. */
export async function writeTrace(path: string, recorder: TimelineRecorder, title = 'rankflow demo'): Promise<string> {
    return writeCreating(path, `${JSON.stringify(recorder.toChromeTrace({ pid: process.pid, processName: title }))}\n`);
}

async function writeCreating(path: string, text: string): Promise<string> {
    const full = resolve(path);
    await mkdir(dirname(full), { recursive: true });
    await writeFile(full, text);
    return full;
}

const us = (ms: number): string => `${(ms * 1000).toFixed(1)} µs`;

/** Phase lines on stderr; within a long phase, at most one "n%" line a second. */
function progressLog(io: CliIo) {
    let last = performance.now();
    return {
        phase(text: string) {
            io.err(`rankflow demo: ${text}`);
            last = performance.now();
        },
        tick(text: string, done: number, total: number) {
            const now = performance.now();
            if (now - last < 1000) return;
            last = now;
            io.err(`rankflow demo:   ${text} ${Math.floor((100 * done) / total)}%`);
        }
    };
}

/** The demo itself: one group, created with `observers` attached, destroyed at the end. */
export async function runDemo({ settings: o, observers, io }: DemoRun): Promise<void> {
    const progress = progressLog(io);
    const buffer = demoBuffer(o);
    const { topk, numExperts } = buffer;
    let printTransitions = !o.quiet;
    const printer: GroupObserver = {
        attach: (g) => {
            const f = (t: { rank: number; from: string; to: string; event: string }) => {
                if (printTransitions) io.out(`  rank ${t.rank}: ${t.from} -> ${t.to}  (${t.event})`);
            };
            g.on('transition', f);
            return () => g.off('transition', f);
        }
    };
    progress.phase(`starting ${o.ranks} rank${o.ranks === 1 ? '' : 's'} (backend ${o.backend})`);
    debug('demo: settings %j', o);
    const t0 = performance.now();
    const group = await createGroup({
        ranks: o.ranks, backend: o.backend,
        buffer,
        observers: [...observers, printer],
    });
    const created = performance.now() - t0;
    io.out(`group of ${group.size} rank${group.size === 1 ? '' : 's'} on '${group.backend}' ready in ${created.toFixed(1)} ms`);
    try {
        progress.phase(`${o.rounds} barrier${o.rounds === 1 ? '' : 's'}`);
        const b0 = performance.now();
        printTransitions = false;  // a line per rank per barrier would drown the rest
        for (let i = 0; i < o.rounds; i++) await group.barrier();
        const barrier = (performance.now() - b0) / o.rounds;
        printTransitions = !o.quiet;
        await group.barrier({ withCpuSync: true });

        const rows = 64;
        const gatherBytes = group.size * rows * o.hidden * 4;
        progress.phase(`allGather of ${(gatherBytes / 2 ** 20).toFixed(1)} MiB`);
        const inputs = group.ranks.map((r) => tensor('fp32', [rows, o.hidden], Float32Array.from({ length: rows * o.hidden }, (_, i) => r.rank * 1e6 + i)));
        const g0 = performance.now();
        const gathered = await group.allGather(inputs);
        const gatherMs = performance.now() - g0;
        // Every rank must hold every rank's input, in rank order: compared element by element.
        const ok = gathered.every((g) => g.data.length === group.size * rows * o.hidden &&
            inputs.every((input, r) => input.data.every((v, i) => g.data[r * rows * o.hidden + i] === v)));

        // Route every token to top-8 experts with a fixed pattern, dispatch, and combine back.
        const T = o.tokens;
        progress.phase(`building dispatch inputs: ${T} tokens x ${o.hidden} hidden per rank, top-${topk} of ${numExperts} experts`);
        const inputsMoe = group.ranks.map(({ rank }, index) => {
            const x = toBf16(Float32Array.from({ length: T * o.hidden }, (_, i) => ((i * 7 + rank) % 97) / 97));
            const topkIdx = Int32Array.from({ length: T * topk }, (_, i) => (Math.floor(i / topk) * 5 + (i % topk) * 3 + rank) % numExperts);
            for (let t = 0; t < T; t++) {
                const seen = new Set<number>();
                for (let k = 0; k < topk; k++) { let e = topkIdx[t * topk + k]!; while (seen.has(e)) e = (e + 1) % numExperts; seen.add(e); topkIdx[t * topk + k] = e; }
            }
            progress.tick('inputs', index + 1, group.size);
            return { x: tensor('bf16', [T, o.hidden], x), topkIdx, topkWeights: new Float32Array(T * topk).fill(1 / topk) };
        });
        progress.phase('dispatch');
        const d0 = performance.now();
        const dispatched = await group.dispatch(inputsMoe);
        const dispatchMs = performance.now() - d0;
        const received = dispatched.reduce((a, d) => a + d.x.data.byteLength, 0);
        progress.phase('combine');
        const c0 = performance.now();
        await group.combine(dispatched.map((d) => ({ x: d.x, handle: d.handle })));
        const combineMs = performance.now() - c0;

        io.out('');
        io.out(`measured on ${group.size} '${group.backend}' ranks:`);
        io.out(`  create -> ready          ${created.toFixed(1)} ms`);
        io.out(`  barrier                  ${us(barrier)} per call (mean of ${o.rounds}, driver mode)`);
        io.out(`  allGather ${(gatherBytes / 2 ** 20).toFixed(1)} MiB       ${gatherMs.toFixed(2)} ms, ${ok ? 'checked' : 'WRONG'}`);
        io.out(`  dispatch ${T} tokens/rank  ${dispatchMs.toFixed(2)} ms, ${(received / 2 ** 20).toFixed(1)} MiB received, ${(received / dispatchMs / 1e6).toFixed(2)} GB/s (driver mode, incl. thread hops)`);
        io.out(`  combine                  ${combineMs.toFixed(2)} ms`);
        if (!ok) throw new RankflowError('EINVAL', 'allGather returned wrong data');
    } finally {
        progress.phase('destroying the group');
        const x0 = performance.now();
        await group.destroy();
        io.out(`  destroy                  ${(performance.now() - x0).toFixed(1)} ms; states: ${group.snapshot().map((s) => s.state).join(', ')}`);
    }
}
