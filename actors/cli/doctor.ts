/**
 * `rankflow doctor`: what this machine offers rankflow. The addon, the kernels built into it, the
 * CUDA driver and GPUs, NCCL, and what `backend: 'auto'` picks, from the addon's own probe
 * (actors/core/backend.ts#probeCuda). As text for people, or with `--json` as one JSON object on
 * stdout for scripts. The probe's messages carry the loader's "(tried: ...)" lists; they are
 * taken apart here into one line per library tried, each path written once.
 */
import { loadAddon, loadedAddon } from '../core/addon.js';
import { addonCandidates } from '../core/addon-select.js';
import { probeCuda, resolveBackend, type CudaProbe } from '../core/backend.js';
import { debug } from '../observe/debug.js';
import type { Command } from './command.js';
import { packageVersion } from './version.js';

/** A failure to load a library, as the probe words it, in parts. */
export interface LoadFailure {
    /** The first sentence: what was not found. */
    reason: string;
    /** Each place looked, with the loader's error for it. */
    tried: Array<{ path: string; error: string }>;
    /** What to do about it. */
    advice?: string;
}

export interface DoctorReport {
    rankflow: string;
    node: string;
    platform: string;
    /** The build in use ('source', 'prebuilt-cuda', ...: actors/core/addon-select.ts), and the ones passed over on the way. */
    addon: { path: string; loaded: boolean; origin?: string; error?: string; passedOver?: Array<{ path: string; origin: string; error: string }> };
    kernels?: { images: number; note: string };
    cuda: {
        available: boolean;
        /** Why cuda cannot be used, when it cannot. */
        unavailable?: LoadFailure;
        driver?: { path: string; version?: string };
        gpus: Array<Record<string, unknown>>;
    };
    /** commShrink / commGrow: whether the NCCL found exports ncclCommShrink / ncclCommGrow (issue 35; elastic groups of one process use neither). */
    nccl?: { path?: string; version?: string; origin?: string; commShrink?: boolean; commGrow?: boolean; unavailable?: LoadFailure };
    /** What carries the bytes between nodes of a world that spans them (world.nodeId), per backend. */
    scaleOut: {
        host: { transport: string };
        cuda: {
            transport: string;
            /** Whether the NCCL found has the calls the transport needs (false without NCCL). */
            available: boolean;
            unavailable?: string;
            /** Whether createGroup runs cuda worlds that span nodes (it does, with the ops `runs` names). */
            enabled: boolean;
            /** What a cuda world that spans nodes runs, and what it refuses. */
            runs: string;
        };
    };
    /** What `backend: 'auto'` resolves to here, or null with the reason. */
    auto: { backend: 'host' | 'cuda' | null; error?: string };
    /** What is broken here: `rankflow doctor` exits 1 when this is not empty. */
    problems: string[];
}

const HOST_SCALE_OUT = 'TCP between rail peers (the rendezvous connects them; world.nodeId marks simulated nodes)';
const CUDA_SCALE_OUT = "grouped ncclSend/ncclRecv between rail peers on the rank's stream, one NCCL communicator per rail (not NCCL's GIN device API)";
const CUDA_RUNS = 'barrier and allGather (node-local kernels, then NCCL between rail peers); dispatch with a CPU sync and combine ' +
    '(planned on the host, node-local copy and fold kernels, NCCL between rail peers); ' +
    'AGRS sessions, engram (this node\'s entries) and ppExchange in the host backend\'s two levels; ' +
    'dispatch without a CPU sync and graphs refuse with BACKEND_UNAVAILABLE (native/src/backends/cuda/scaleout.hpp)';

/** The cuda scale-out leg as the probe saw NCCL (its `nccl` object), and what createGroup runs on it (native/src/backends/cuda/two_level.cc). */
export function cudaScaleOut(nccl: Record<string, unknown> | undefined, notProbed = 'no NCCL probe: this build has no CUDA backend'): DoctorReport['scaleOut']['cuda'] {
    const available = nccl?.p2p === true;
    const unavailable = nccl === undefined ? notProbed
        : typeof nccl.reason === 'string' ? `no NCCL: ${parseLoadFailure(nccl.reason).reason}`
            : typeof nccl.p2pReason === 'string' ? nccl.p2pReason : undefined;
    return {
        transport: CUDA_SCALE_OUT,
        available,
        ...(!available && unavailable !== undefined ? { unavailable } : {}),
        enabled: true,
        runs: CUDA_RUNS
    };
}

/**
 * Splits "X was not found (tried:\n  a: a: err\n  b: b: err). Do this." into its parts. The
 * loader's error repeats the path it was given (dlerror's wording), so that copy is dropped.
 */
export function parseLoadFailure(message: string): LoadFailure {
    // The list ends at the first ')' that closes a sentence: a path may hold '(system)'.
    const match = /^([\s\S]*?)\s*\(tried:((?:\n[^\n]*?)*?)\)\.(?:\s+([\s\S]*))?$/.exec(message);
    if (!match) return { reason: message.trim(), tried: [] };
    const tried = match[2]!
        .split('\n')
        .map((line) => line.trim())
        .filter((line) => line !== '')
        .map((line) => {
            const colon = line.indexOf(': ');
            if (colon < 0) return { path: line, error: '' };
            const path = line.slice(0, colon);
            let error = line.slice(colon + 2);
            const bare = path.replace(/\s+\(.*\)$/, '');
            if (error.startsWith(`${bare}: `)) error = error.slice(bare.length + 2);
            return { path, error };
        });
    const advice = (match[3] ?? '').trim();
    return { reason: match[1]!.trim(), tried, ...(advice ? { advice } : {}) };
}

/** Gathers the report; never throws (a missing addon is part of the report). */
export function doctorReport(): DoctorReport {
    const report: DoctorReport = {
        rankflow: packageVersion(),
        node: process.version,
        platform: `${process.platform} ${process.arch}`,
        addon: { path: addonCandidates().map((c) => c.path).join(', '), loaded: false },
        cuda: { available: false, gpus: [] },
        scaleOut: { host: { transport: HOST_SCALE_OUT }, cuda: cudaScaleOut(undefined, 'not probed: the addon did not load') },
        auto: { backend: null },
        problems: []
    };
    try {
        loadAddon();
        const used = loadedAddon()!;
        report.addon = { path: used.path, loaded: true, origin: used.origin };
        if (used.passedOver.length > 0) report.addon.passedOver = used.passedOver.map((p) => ({ path: p.path, origin: p.origin, error: p.error }));
    } catch (error) {
        report.addon.error = (error as Error).message;
        report.auto.error = 'the addon did not load';
        report.problems.push('the native addon does not load (see addon)');
        return report;
    }
    const probe: CudaProbe = probeCuda();
    debug('doctor: probe %j', probe);
    const kernels = probe.kernels as { images?: number; note?: string } | undefined;
    if (kernels) report.kernels = { images: Number(kernels.images ?? 0), note: String(kernels.note ?? '') };
    report.cuda.available = probe.available;
    if (!probe.available && probe.reason) report.cuda.unavailable = parseLoadFailure(probe.reason);
    if (typeof probe.driver === 'string') {
        report.cuda.driver = { path: probe.driver, ...(typeof probe.driverVersion === 'string' ? { version: probe.driverVersion } : {}) };
    }
    if (Array.isArray(probe.gpus)) report.cuda.gpus = probe.gpus as Array<Record<string, unknown>>;
    const nccl = probe.nccl as { path?: string; version?: string; origin?: string; commShrink?: boolean; commGrow?: boolean; reason?: string } | undefined;
    report.scaleOut.cuda = cudaScaleOut(probe.nccl as Record<string, unknown> | undefined);
    if (nccl) {
        report.nccl = {
            ...(nccl.path !== undefined ? { path: nccl.path } : {}),
            ...(nccl.version !== undefined ? { version: nccl.version } : {}),
            ...(nccl.origin !== undefined ? { origin: nccl.origin } : {}),
            ...(typeof nccl.commShrink === 'boolean' ? { commShrink: nccl.commShrink } : {}),
            ...(typeof nccl.commGrow === 'boolean' ? { commGrow: nccl.commGrow } : {}),
            ...(nccl.reason !== undefined ? { unavailable: parseLoadFailure(nccl.reason) } : {})
        };
    }
    try {
        report.auto.backend = resolveBackend('auto');
    } catch (error) {
        report.auto.error = (error as Error).message;
        report.problems.push(`backend 'auto' resolves to nothing: ${report.auto.error}`);
    }
    // GPUs the driver sees that rankflow cannot use are broken here; no GPU at all is not.
    if (report.cuda.gpus.length > 0 && !report.cuda.available)
        report.problems.push(`the driver sees ${report.cuda.gpus.length} GPU(s) but the cuda backend is not usable: ${report.cuda.unavailable?.reason ?? 'unknown'}`);
    return report;
}

/** The report as aligned text: a label column, details indented under it. */
export function formatDoctorReport(report: DoctorReport): string[] {
    const lines: string[] = [];
    const row = (label: string, text: string) => lines.push(`${label.padEnd(9)}${text}`);
    const more = (text: string) => lines.push(`${''.padEnd(9)}${text}`);
    const failure = (label: string, f: LoadFailure) => {
        row(label, f.reason);
        f.tried.forEach((t, i) => more(`${i === 0 ? 'tried ' : '      '}${t.path}${t.error ? `: ${t.error}` : ''}`));
        if (f.advice) more(f.advice);
    };

    lines.push(`rankflow ${report.rankflow} (node ${report.node}, ${report.platform})`);
    if (!report.addon.loaded) {
        row('addon', `not loaded: ${report.addon.path}`);
        for (const line of (report.addon.error ?? '').split('\n')) more(line.trim());
        for (const p of report.problems) row('problem', p);
        return lines;
    }
    row('addon', `${report.addon.path}, loaded (${report.addon.origin})`);
    for (const p of report.addon.passedOver ?? []) more(`passed over ${p.path} (${p.origin}): ${p.error}`);
    row('kernels', report.kernels ? `${report.kernels.images} images, ${report.kernels.note}` : 'none: this build has no CUDA backend');
    if (report.cuda.driver) row('driver', `${report.cuda.driver.path}${report.cuda.driver.version ? `, CUDA ${report.cuda.driver.version}` : ''}`);
    else if (report.cuda.unavailable) failure('driver', report.cuda.unavailable);
    if (report.cuda.gpus.length === 0) row('GPUs', 'none');
    for (const gpu of report.cuda.gpus) {
        row('GPU', `${gpu.ordinal}: ${gpu.name}, ${gpu.arch}, ${gpu.sms} SMs, NUMA node ${gpu.numaNode}, ` +
            `${gpu.vmmPosixFd ? 'VMM with POSIX-fd handles' : 'no VMM with POSIX-fd handles'}`);
    }
    if (report.nccl?.unavailable) failure('NCCL', report.nccl.unavailable);
    else if (report.nccl) {
        row('NCCL', `${report.nccl.path ?? '?'}, version ${report.nccl.version ?? '?'}${report.nccl.origin ? ` (${report.nccl.origin})` : ''}`);
        const has = (v: boolean | undefined) => (v === undefined ? 'not probed' : v ? 'yes' : 'no');
        more(`ncclCommShrink ${has(report.nccl.commShrink)}, ncclCommGrow ${has(report.nccl.commGrow)} (elastic groups of one process need neither)`);
    }
    if (report.cuda.driver && report.cuda.unavailable) failure('cuda', report.cuda.unavailable);
    else row('cuda', report.cuda.available ? 'usable' : 'not usable: see driver above');
    row('scaleout', `host: ${report.scaleOut.host.transport}`);
    const cuda = report.scaleOut.cuda;
    more(`cuda: ${cuda.transport}${cuda.available ? ': the NCCL found has both calls' : `: ${cuda.unavailable ?? 'unavailable'}`}`);
    more(`      across nodes: ${cuda.runs}`);
    row('auto', report.auto.backend ? `picks '${report.auto.backend}'` : `picks nothing: ${report.auto.error ?? 'unknown'}`);
    for (const p of report.problems) row('problem', p);
    return lines;
}

export const doctorCommand: Command = {
    name: 'doctor',
    summary: "what this machine has: GPUs, driver, NCCL, kernels, what 'auto' picks",
    usage: 'usage: rankflow doctor [-j|--json]',
    details: '  -j, --json          one JSON object on stdout instead of text (fields: rankflow, node, addon, kernels, cuda, nccl, scaleOut, auto, problems)\n' +
        '  Exits 1 when something it checks is broken (the addon does not load; GPUs the cuda backend cannot use), else 0.',
    options: { json: { type: 'boolean', short: 'j' } },
    async run(values, context) {
        const report = doctorReport();
        if (values.json) context.out(JSON.stringify(report, null, 2));
        else for (const line of formatDoctorReport(report)) context.out(line);
        return report.problems.length === 0 ? 0 : 1;
    }
};
