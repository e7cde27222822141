// Loads the native addon once per thread, and says clearly what is missing when it cannot.
import { createRequire } from 'node:module';
import { existsSync } from 'node:fs';

import { config } from './config.js';
import { RankflowError } from './errors.js';

export interface ExportedSegments { deviceFd: number; hostFd: number; pid: number }

export interface NativeInfo {
  rank: number;
  worldSize: number;
  backend: 'host' | 'cuda';
  memoryKind: 'gpu' | 'elastic' | 'hybrid';
  symmetricBytes: number;
  workspaceBytes: number;
  bufferBytes: number;
  cpuBytes: number;
  stride: number;
  seq: number;
  window: bigint;
  peerWindows: bigint[];
  /** cuda: the rank's GPU, and whether its NCCL communicator is up */
  device?: { ordinal: number; name: string; nccl: boolean };
  domains: {
    numNvlRanks: number; numRdmaRanks: number; nvlRankIdx: number; rdmaRankIdx: number;
    numScaleupRanks: number; numScaleoutRanks: number; scaleupRankIdx: number; scaleoutRankIdx: number;
    isScaleupNvlink: boolean;
  };
}

/** What dispatchRun settles with: the layout id, the outputs' device addresses, the counts (alloc only). */
export interface NativeDispatchRun {
  id: number;
  x: bigint;
  scales?: bigint;
  topkIdx: bigint;
  topkWeights: bigint;
  srcRank: bigint;
  srcToken: bigint;
  numRecv?: number;
  tokensPerExpert?: number[];
}

export interface NativeContext {
  exported(): ExportedSegments;
  importPeers(peers: Array<{ deviceFd: number; hostFd: number }>): Promise<void>;
  /** cuda: rank 0's NCCL unique id (128 bytes); null on host or where NCCL is unavailable */
  ncclUniqueId(): Promise<Uint8Array | null>;
  /** cuda: ncclCommInitRank with rank 0's id (every rank together) */
  ncclInit(id: Uint8Array): Promise<void>;
  info(): NativeInfo;
  writePeer(peer: number, offset: number, bytes: Uint8Array): bigint;
  readWindow(offset: number, length: number): Uint8Array;
  failPeer(rank: number): void;
  destroy(): void;
  barrier(cpuRound: boolean): Promise<void>;
  allGather(bytes: Uint8Array): Promise<Uint8Array>;
  dispatchNotify(input: NativeDispatchInput): Promise<number>;
  dispatchWait(layoutId: number): Promise<{ numRecv: number; tokensPerExpert: number[] }>;
  dispatchData(layoutId: number, input: NativeDispatchInput, out: NativeDispatchOutput): Promise<void>;
  dispatchAbandon(layoutId: number): void;
  /** cuda, device tensors: notify, CPU sync (alloc: outputs allocated natively) or none (outputs in the
   *  buffer), and data in one executor job; progress(0) after notify, progress(1) once the counts are ready */
  dispatchRun(input: NativeDispatchInput, opts: { alloc: boolean }, progress: (stage: number) => void): Promise<NativeDispatchRun>;
  /** the barrier's device round, progress(0), then (cpuRound) its CPU-sync round, in one executor job */
  barrierRun(cpuRound: boolean, progress: (stage: number) => void): Promise<void>;
  combine(input: NativeCombineInput, out: { x: Uint16Array; topkWeights: Float32Array }): Promise<void>;
  sessionOpen(maxBytes: number, maxAllGathers: number): Promise<void>;
  sessionClose(): Promise<void>;
  sessionAllGather(bytes: Uint8Array): Promise<Uint8Array>;
  sessionReduceScatter(input: Float32Array | Uint16Array, bf16: boolean): Promise<Float32Array | Uint16Array>;
  engramWrite(table: ArrayBufferView, entries: number, rowBytes: number): Promise<void>;
  engramFetch(ids: Int32Array): Promise<Uint8Array>;
  ppExchange(bytes: Uint8Array): Promise<Uint8Array>;
  /** cuda: microseconds per call of `op` (ce, ag, rs-fp32, rs-bf16, pp, engram) on device-resident data, CUDA events */
  benchAgrs(op: string, engine: 'kernel' | 'ce' | 'auto', bytes: number, iters: number): Promise<number>;
  // cuda rank programs (native/src/gpu/moe.cc): device tensors, stream sync, CUDA events, baselines
  deviceAlloc(bytes: number): bigint;
  deviceFree(ptr: bigint): void;
  deviceUpload(ptr: bigint, data: ArrayBufferView): void;
  deviceDownload(ptr: bigint, bytes: number): Uint8Array;
  deviceSync(): Promise<void>;
  eventRecord(): bigint;
  eventElapsed(start: bigint, end: bigint): Promise<number>;
  eventDestroy(event: bigint): void;
  /** ms per ncclAlltoAll of `bytes` per rank (every rank together) */
  benchAlltoAll(bytes: number, iters: number, warmup: number): Promise<number>;
  /** ms per copy-engine copy of `bytes` into the next rank's buffer */
  benchPeerCopy(bytes: number, iters: number, warmup: number): Promise<number>;
  /** device ms of the last dispatch/combine (events around its launches) */
  lastOpMs(): number;
}

export interface NativeDispatchInput {
  numTokens: number;
  x: Uint8Array | Uint16Array;
  xElemBytes: number;
  scales?: Float32Array;
  topkIdx?: Int32Array;
  topkWeights?: Float32Array;
  expertAlignment: number;
  handle?: number;
}
export interface NativeDispatchOutput {
  x: Uint8Array | Uint16Array;
  scales?: Float32Array;
  topkIdx: Int32Array;
  topkWeights: Float32Array;
  srcRank: Int32Array;
  srcToken: Int32Array;
}
export interface NativeCombineInput {
  handle: number;
  x: Uint16Array;
  topkWeights?: Float32Array;
  bias0?: Uint16Array;
  bias1?: Uint16Array;
}

export interface EpLayout {
  workspace: Record<'barrier' | 'cpuBarrier' | 'enter' | 'done' | 'rankCount' | 'expertCount' | 'session' | 'diag' | 'slotBytes' | 'bytes', number>;
  buffer: Record<'slots' | 'x' | 'scales' | 'topkIdx' | 'topkWeights' | 'srcToken' | 'dispatchBytes' | 'combineX' | 'combineWeights' | 'combineFlags' | 'combineBytes' | 'bytes', number>;
  alignment: number;
  sizeHint: number;
}

export interface Addon {
  Context: new (config: Record<string, unknown>) => NativeContext;
  layout(ep: { maxTokensPerRank: number; hidden: number; topk: number; numExperts: number; fp8Dispatch?: boolean }, worldSize: number): EpLayout;
  encodeSignal(seq: number, count: number): bigint;
  alignment: number;
  cudaProbe?: () => Record<string, unknown>;
  /** SCM_RIGHTS fd passing over a Unix socket ('@name' = abstract namespace); served once per pid in `clients`, to no one else. */
  fdServe(socketPath: string, fds: number[], clients: number[], timeoutMs: number): Promise<void>;
  fdFetch(socketPath: string, timeoutMs: number, serverPid?: number): Promise<number[]>;
  closeFds(fds: number[]): void;
}

let addon: Addon | undefined;

export function loadAddon(): Addon {
  if (addon) return addon;
  if (!existsSync(config.addonPath)) {
    throw new RankflowError('BACKEND_UNAVAILABLE',
      `the native addon is not built (looked for ${config.addonPath}): run \`npm install\` or \`npm run build\` in the rankflow package`);
  }
  try {
    addon = createRequire(import.meta.url)(config.addonPath) as Addon;
  } catch (e) {
    throw new RankflowError('BACKEND_UNAVAILABLE', `the native addon at ${config.addonPath} failed to load: ${(e as Error).message}`, { cause: e });
  }
  return addon;
}
