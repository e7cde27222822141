// createGroup's options: their type, and every check of them, done once before anything starts. The
// result is what the group is built from: the resolved backend, the rank count, the devices, the
// timeouts, the buffer and the world, each checked and named in its error.
import { config } from './core/config.js';
import { RankflowError, invalid } from './core/errors.js';
import { loadAddon } from './core/addon.js';
import { cudaDeviceCount, probeCuda, resolveBackend, type Backend } from './core/backend.js';
import { checkBufferConfig, checkOptions, checkPositiveInt, checkTestFirstSeq, type BufferConfig } from './core/validate.js';
import { abortError, checkSignal } from './core/abort.js';
import { keysOf } from './core/option-keys.js';
import { checkWorld, type WorldOptions } from './world/join.js';
import { inspectorAddress } from './observe/inspector.js';
import type { GroupObserver } from './observe/timeline.js';

export interface GroupOptions {
  ranks?: number;
  backend?: 'auto' | Backend;
  devices?: number[];
  /** Ranks per node: the physical NVLink domain (default: all ranks). */
  ranksPerNode?: number;
  buffer: BufferConfig;
  timeouts?: { cpuSeconds?: number; gpuSeconds?: number };
  /**
   * A function: every xstate inspection event of every rank, as plain data tagged with its rank.
   * A loopback URL ('http://127.0.0.1:PORT'): serve the live inspector page there for this group.
   */
  inspect?: ((record: Record<string, unknown>) => void) | string;
  /** This process hosts `ranks` of a world spread over several processes (API.md). */
  world?: WorldOptions;
  /**
   * Elastic group (API.md, "Elastic groups"; actors/elastic.ts): a rank that fails leaves, the others go
   * on among themselves, group.replaceRank(r) brings a fresh rank r. Default false: a failure fails
   * the group. Either backend ('cuda': ranks may share a GPU), the ranks of one process on one node, for now.
   */
  elastic?: boolean;
  /** Watchers attached before the ranks start (a TimelineRecorder, an inspector server), so they see every transition. */
  observers?: GroupObserver[];
  /**
   * Aborts the creation, the wait for the other processes of a world included: every rank that was
   * started is torn down (workers, memory, fds, the rendezvous' sockets), then createGroup rejects with
   * RankflowError code 'ABORTED' (its cause: the signal's reason). No effect once the group is ready.
   */
  signal?: AbortSignal;
}

/** Every key of createGroup's options: any other is EINVAL naming it (option-keys.ts). */
export const GROUP_OPTION_KEYS = keysOf<GroupOptions>()(['ranks', 'backend', 'devices', 'ranksPerNode', 'buffer', 'timeouts', 'inspect', 'world', 'elastic', 'observers', 'signal']);

/** The options once checked: what a group is made of. */
export interface GroupPlan {
  backend: Backend;
  /** ranks hosted by this process */
  size: number;
  world?: WorldOptions;
  buffer: BufferConfig;
  /** each local rank's GPU where `devices` was given (cuda only) */
  devices?: number[];
  ranksPerNode: number;
  cpuSeconds: number;
  gpuSeconds: number;
  inspectAt?: { host: string; port: number };
  /** the first collective's sequence number (RANKFLOW_TEST_FIRST_SEQ; 0 otherwise) */
  firstSeq: number;
  elastic: boolean;
  signal?: AbortSignal;
}

/** Checks createGroup's options; throws EINVAL naming the first bad one (ABORTED for an aborted signal). */
export function planGroup(opts: GroupOptions): GroupPlan {
  checkOptions('options', opts, '{ buffer, ranks?, backend?, ... }', false, GROUP_OPTION_KEYS);
  const backend = resolveBackend(checkBackendOption(opts.backend));
  const gpus = backend === 'cuda' ? cudaDeviceCount() : 0;
  const size = opts.ranks ?? (backend === 'cuda' ? (Array.isArray(opts.devices) ? opts.devices.length : gpus) : config.hostRanks);
  checkPositiveInt('ranks', size, 64);
  const world = opts.world !== undefined ? checkWorld(opts.world, size) : undefined;
  const worldSize = world?.size ?? size;
  const devices = checkDevices(opts.devices, size, backend, gpus);
  if (backend === 'cuda' && devices === undefined && size > gpus)
    throw invalid('ranks', `(${size}) exceeds the GPU count (${gpus}): backend 'cuda' runs one rank per GPU unless told otherwise; ` +
      `to share GPUs on purpose, name each rank's GPU, e.g. devices: [${Array.from({ length: size }, (_, r) => r % Math.max(1, gpus)).join(', ')}]`);
  const buffer = checkBufferConfig(opts.buffer, worldSize);
  const ranksPerNode = opts.ranksPerNode ?? worldSize;
  checkPositiveInt('ranksPerNode', ranksPerNode, worldSize);
  if (worldSize % ranksPerNode !== 0) throw invalid('ranksPerNode', `(${ranksPerNode}) must divide the world size (${worldSize})`);
  checkOptions('timeouts', opts.timeouts, '{ cpuSeconds?, gpuSeconds? }');
  const cpuSeconds = checkTimeout('timeouts.cpuSeconds', opts.timeouts?.cpuSeconds ?? config.cpuSeconds);
  const gpuSeconds = checkTimeout('timeouts.gpuSeconds', opts.timeouts?.gpuSeconds ?? config.gpuSeconds);
  if (opts.inspect !== undefined && typeof opts.inspect !== 'function' && typeof opts.inspect !== 'string')
    throw invalid('inspect', "must be a function (record) => void or a loopback URL 'http://127.0.0.1:PORT'");
  let inspectAt: { host: string; port: number } | undefined;
  try {
    inspectAt = typeof opts.inspect === 'string' ? inspectorAddress(opts.inspect) : undefined;
  } catch (e) {
    throw new RankflowError('EINVAL', (e as Error).message);  // "inspect: host ... is not loopback"
  }
  if (opts.observers !== undefined && (!Array.isArray(opts.observers) || opts.observers.some((o) => typeof o?.attach !== 'function')))
    throw invalid('observers', 'must be an array of objects with attach(group)');
  const elastic = checkElastic(opts.elastic, backend, world !== undefined, ranksPerNode < worldSize);
  // Before the world is met: a rejoin at rankOffset 0 follows whoever leads (world/takeover.ts), so it must not wait for one in vain.
  if (world?.rejoin && !elastic) throw invalid('world.rejoin', 'needs elastic: true (a rejoin takes back a range that left an elastic world)');
  const firstSeq = checkTestFirstSeq(config.testFirstSeq);
  const signal = checkSignal('signal', opts.signal);
  if (signal?.aborted) throw abortError('createGroup', signal);
  const layout = loadAddon().layout(buffer, worldSize);
  if (buffer.bytes !== undefined && buffer.bytes < layout.workspace.bytes + layout.alignment)
    throw invalid('buffer.bytes', `(${buffer.bytes}) leaves no room after the ${layout.workspace.bytes}-byte workspace`);
  return {
    backend, size, buffer, ranksPerNode, cpuSeconds, gpuSeconds, firstSeq, elastic,
    ...(world ? { world } : {}), ...(devices ? { devices } : {}), ...(inspectAt ? { inspectAt } : {}), ...(signal ? { signal } : {}),
  };
}

/**
 * `devices`: the GPU ordinal of each rank, below the GPU count (cuda only; ignored on host). A GPU may
 * be named more than once: those ranks share it (one process only).
 */
function checkDevices(devices: unknown, size: number, backend: Backend, gpus: number): number[] | undefined {
  if (devices === undefined) return undefined;
  if (!Array.isArray(devices)) throw invalid('devices', `must be an array of GPU ordinals, one per rank (got ${typeof devices})`);
  if (devices.length !== size) throw invalid('devices', `has ${devices.length} entries; it needs one GPU ordinal per rank (${size})`);
  devices.forEach((d, i) => {
    if (!Number.isInteger(d) || (d as number) < 0) throw invalid(`devices[${i}]`, `must be a non-negative integer GPU ordinal (got ${String(d)})`);
    if (backend === 'cuda' && (d as number) >= gpus) throw invalid(`devices[${i}]`, `GPU ${d} does not exist: the driver sees ${gpus} GPU(s)`);
  });
  return backend === 'cuda' ? (devices as number[]) : undefined;
}

/** The GPUs (UUIDs) this process's cuda ranks use: `devices`, or rank % GPU count as the native side picks. */
export function localGpuIds(size: number, rankOffset: number, devices?: number[]): string[] {
  const gpus = (probeCuda().gpus ?? []) as Array<{ uuid?: string }>;
  if (gpus.length === 0) return [];
  return Array.from({ length: size }, (_, r) => gpus[devices ? devices[r]! : (rankOffset + r) % gpus.length]?.uuid ?? '').filter((u) => u !== '');
}

/**
 * Longest timeout, in seconds: each rank machine's backstop timer ((seconds + margin) * 1000 ms) must
 * fit the 32-bit setTimeout of Node, which fires at once when given more (or Infinity).
 */
const MAX_TIMEOUT_SECONDS = 2_000_000;

function checkTimeout(name: string, v: unknown): number {
  if (typeof v !== 'number' || !(v > 0) || v > MAX_TIMEOUT_SECONDS)
    throw invalid(name, `must be a number of seconds in (0, ${MAX_TIMEOUT_SECONDS}] (got ${String(v)})`);
  return v;
}

/** `elastic`: a boolean; true only where it is implemented (either backend in one process; a world of processes on host; one node). */
function checkElastic(v: unknown, backend: Backend, world: boolean, nodes: boolean): boolean {
  if (v === undefined || v === false) return false;
  if (v !== true) throw invalid('elastic', `must be a boolean (got ${String(v)})`);
  if (world && backend !== 'host')
    throw invalid('elastic', `across processes (world) is supported on backend 'host' only (this group resolved to backend '${backend}'): ` +
      "on cuda, keep an elastic group's ranks in one process, or leave elastic off");
  if (nodes) throw invalid('elastic', 'is supported within one node only (ranksPerNode below the world size: the scale-out legs do not mask ranks yet)');
  return true;
}

function checkBackendOption(b: unknown): 'auto' | Backend | undefined {
  if (b === undefined || b === 'auto' || b === 'cuda' || b === 'host') return b;
  throw invalid('backend', `must be 'auto', 'cuda' or 'host' (got ${String(b)})`);
}
