// The native addon's interface as TypeScript sees it, and its loading: once per thread, the build
// addon-select.ts picks, with a clear error when none loads.
import { isMainThread } from 'node:worker_threads';

import { addonCandidates, chooseAddon, fallbackMessage, type AddonCandidate, type PassedOver } from './addon-select.js';
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
  /** cuda: the rank's GPU, whether its NCCL communicator is up, its SMs and this rank's share of them */
  device?: { ordinal: number; name: string; nccl: boolean; sms: number; smShare: number; graphLaunches: number; directLaunches: number;
    /** dispatches without a CPU sync that ran as one kernel (RANKFLOW_FUSED_DISPATCH) */
    fusedDispatches: number };
  domains: {
    numNvlRanks: number; numRdmaRanks: number; nvlRankIdx: number; rdmaRankIdx: number;
    numScaleupRanks: number; numScaleoutRanks: number; scaleupRankIdx: number; scaleoutRankIdx: number;
    isScaleupNvlink: boolean;
  };
}

/** Dispatch modes of NativeContext.dispatch. */
export const DISPATCH_HOST = 0;         // host tensors; outputs made natively and returned
export const DISPATCH_DEVICE_ALLOC = 1; // device tensors; outputs allocated on the rank's GPU after the CPU sync
export const DISPATCH_IN_BUFFER = 2;    // device tensors; outputs left in the receive buffer, no CPU sync
/** NativeContext.dispatch's answer when the CPU-sync wait outlasted its spin: call dispatchResume(). */
export const DISPATCH_PENDING = 1;

/** Word indices of a context's scratch (native/src/binding/context.hpp). */
export const SCRATCH = { layoutId: 0, numRecv: 1, graphOps: 2, maskedSlots: 3, addresses: 8, args: 16, tokensPerExpert: 24 } as const;
/** The numbers of a dispatch call, in the scratch's args words (written just before the call): up to 6
 *  JS arguments cross Node-API without an allocation, and a number there costs no Node-API call. */
export const DISPATCH_ARG = { numTokens: 0, xElemBytes: 1, expertAlignment: 2, handle: 3, numSms: 4, mode: 5 } as const;
/** The numbers of a combine call, in the scratch's args words. */
export const COMBINE_ARG = { handle: 0, numSms: 1, xRows: 2 } as const;
/**
 * The abort words the main thread writes and the rank's native waits and kernels read: int32 word
 * indices and byte offsets of kernels/protocol.hpp AbortWords (test/abi.test.ts compares the two;
 * actors/core/abort-words.ts writes them). `bytes`: the SharedArrayBuffer made per rank, two pages so
 * that the words can start on a page the cuda backend maps into the GPU.
 */
export const ABORT = {
  failedRank: 0, stopping: 1, failureReasonBytes: 2, releaseOrigin: 3, releasedAbove: 4, releaseReasonBytes: 6, leftRank: 7, words: 8,
  maxReason: 1024, failureReasonAt: 32, releaseReasonAt: 1056, span: 2080, bytes: 8192,
} as const;

/** Words of a rank's traffic counters (native/src/runtime/scaleout.hpp Traffic): u64, read with Atomics.load. */
export const TRAFFIC = { scaleUpBytes: 0, scaleOutBytes: 1, scaleOutNs: 2, words: 4, bytes: 32 } as const;

/** Host outputs of a dispatch (mode DISPATCH_HOST). */
export interface NativeDispatchOutputs {
  x: Uint8Array | Uint16Array;
  scales?: Float32Array;
  topkIdx: Int32Array;
  topkWeights: Float32Array;
  srcRank: Int32Array;
  srcToken: Int32Array;
}

export type TensorArg = ArrayBufferView | bigint | undefined;

/** One rank's native context (native/src/binding/context.cc). Every operation is synchronous. */
export interface NativeContext {
  /** Float64Array / BigUint64Array views of it carry small results (SCRATCH) */
  readonly scratch: ArrayBuffer;
  /** byte offset of the abort words in the SharedArrayBuffer given to the constructor */
  readonly abortOffset: number;
  exported(): ExportedSegments;
  importPeers(peers: Array<{ deviceFd: number; hostFd: number }>): void;
  ncclUniqueId(): Uint8Array | null;
  ncclInit(id: Uint8Array): void;
  info(): NativeInfo;
  /** the rank's sequence number now (the last collective's) */
  seq(): number;
  /** AGRS sessions the rank opened so far */
  sessionCount(): number;
  /** after a run's release: ops in flight waited for, session closed, seq and session count set (the group's) */
  recover(seq: number, sessionCount: number): void;
  /** elastic: recover to the group's numbers and go on with the ranks of liveMask (bit p: rank p) */
  remask(seq: number, sessionCount: number, liveMask: bigint, epoch: number): void;
  /** elastic: rank `peer`'s replacement is mapped over its window and joins (a barrier with it) */
  rejoin(peers: number | number[], segments: { deviceFd: number; hostFd: number } | Array<{ deviceFd: number; hostFd: number }>, liveMask: bigint, epoch: number): void;
  readWindow(offset: number, length: number): Uint8Array;
  writePeer(peer: number, offset: number, bytes: Uint8Array): bigint;
  destroy(): void;
  barrier(cpuSync: boolean): void;
  allGather(input: TensorArg, bytes: number, output: TensorArg): void;
  /** n fp32 (bf16 = false) or bf16 elements, summed over the ranks into output (input itself: in place) */
  allReduce(input: TensorArg, n: number, bf16: boolean, output: TensorArg): void;
  /** Host outputs (mode 0), DISPATCH_PENDING, or undefined (device modes: results in the scratch). Its
   *  numbers (DISPATCH_ARG: numTokens, xElemBytes, expertAlignment, handle, numSms, mode) are in the scratch. */
  dispatch(x: TensorArg, scales: TensorArg, topkIdx: TensorArg, topkWeights: TensorArg): NativeDispatchOutputs | number | undefined;
  dispatchResume(): NativeDispatchOutputs | undefined;
  /** outX = 0n: outputs allocated on the rank's GPU (addresses in the scratch). Its numbers (COMBINE_ARG:
   *  handle, numSms, xRows) are in the scratch. */
  combine(x: TensorArg, topkWeights: TensorArg, bias0: TensorArg, bias1: TensorArg, outX: TensorArg, outW: TensorArg): void;
  sessionOpen(maxBytes: number, maxAllGathers: number): void;
  sessionClose(): void;
  sessionAllGather(input: TensorArg, bytes: number, output: TensorArg): void;
  sessionReduceScatter(input: TensorArg, n: number, bf16: boolean, output: TensorArg): void;
  engramWrite(table: TensorArg, entries: number, rowBytes: number): void;
  engramFetch(ids: Int32Array, output: TensorArg): void;
  ppExchange(input: TensorArg, bytes: number, output: TensorArg): void;
  // session tensors, views of the window, asynchronous ops (native/src/binding/inflight.cc)
  /** a fresh session region for a tensor of `bytes` per rank; the window offset of my slot in it */
  sessionTensor(bytes: number): number;
  /** host: an ArrayBuffer over my window's bytes [offset, offset + bytes), detached at session close and destroy */
  windowView(offset: number, bytes: number): ArrayBuffer;
  /** starts a session allGather (size: bytes per rank) or reduceScatter (size: n per chunk): [op id, window offset of the result] */
  sessionIssue(reduce: boolean, input: TensorArg, size: number, bf16: boolean): [number, number];
  /** starts an engram fetch: [op id, device address of the rows (cuda) or 0n (host)] */
  engramFetchIssue(ids: Int32Array): [number, bigint];
  /** waits for an op in flight; a host fetch's rows (an ArrayBuffer that owns them), else undefined */
  inflightWait(id: number): ArrayBuffer | undefined;
  // cuda: device memory, streams, events, graphs, baselines
  deviceAlloc(bytes: number): bigint;
  deviceFree(ptr: bigint): void;
  deviceUpload(ptr: bigint, data: ArrayBufferView): void;
  deviceZero(ptr: bigint, bytes: number): void;
  deviceDownload(ptr: bigint, bytes: number): Uint8Array;
  deviceSync(): void;
  eventRecord(): bigint;
  eventElapsed(start: bigint, end: bigint): number;
  eventDestroy(event: bigint): void;
  lastOpMs(): number;
  setOpTiming(on: boolean): void;
  benchAlltoAll(bytes: number, iters: number, warmup: number): number;
  benchPeerCopy(bytes: number, iters: number, warmup: number): number;
  benchAgrs(op: string, engine: 'kernel' | 'ce' | 'auto', bytes: number, iters: number): number;
  captureBegin(): void;
  /** the graph's id; its op count in the scratch */
  captureEnd(): bigint;
  replay(graph: bigint, ops: number): void;
  graphFree(graph: bigint): void;
  /** tests: hold `sms` SMs of the rank's GPU for `ms` milliseconds */
  occupy(sms: number, ms: number): void;
  /** fn runs (on the rank's thread) when one of its waits has lasted a millisecond */
  onSlowWait(fn: () => void): void;
  // cuda interop (native/src/binding/interop.cc): the rank's CUstream and CUcontext; its stream
  // waits for a CUevent recorded elsewhere; EINVAL unless [ptr, ptr + bytes) is device memory of its GPU
  cudaStream(): bigint;
  cudaContext(): bigint;
  eventWait(event: bigint): void;
  deviceCheck(ptr: bigint, bytes: number): void;
  /** scale-out: this rank's listener on `host` (its port), then its authenticated connections to its rail peers */
  scaleoutListen(host: string): number;
  scaleoutConnect(endpoints: Array<{ host: string; port: number }>, key: Uint8Array, timeoutMs: number): void;
  /** where the rank counts the bytes it sends (TRAFFIC words) */
  trafficWords(words: BigUint64Array): void;
}

export interface EpLayout {
  workspace: Record<'barrier' | 'cpuBarrier' | 'enter' | 'done' | 'rankCount' | 'expertCount' | 'session' | 'live' | 'slotBytes' | 'seqWord' | 'payloadWord' | 'tagWord' | 'bytes', number>;
  buffer: Record<'slots' | 'x' | 'scales' | 'topkIdx' | 'topkWeights' | 'srcToken' | 'srcRank' | 'dispatchBytes' | 'combineX' | 'combineWeights' | 'combineFlags' | 'combineBytes' | 'bytes', number>;
  alignment: number;
  sizeHint: number;
}

export interface Addon {
  Context: new (config: Record<string, unknown>, abortWords?: Int32Array) => NativeContext;
  layout(ep: { maxTokensPerRank: number; hidden: number; topk: number; numExperts: number; fp8Dispatch?: boolean }, worldSize: number): EpLayout;
  /** The native side's copy of every ABI number here (binding/context.hpp, kernels/protocol.hpp), and the
   *  phase names by id (RF_PHASES): test/abi.test.ts compares them with SCRATCH, DISPATCH_ARG, COMBINE_ARG,
   *  the DISPATCH_* modes and ABORT. */
  abi: {
    scratch: Record<keyof typeof SCRATCH, number>;
    dispatchArg: Record<keyof typeof DISPATCH_ARG, number>;
    combineArg: Record<keyof typeof COMBINE_ARG, number>;
    dispatchModes: { host: number; deviceAlloc: number; inBuffer: number; pending: number };
    phases: string[];
    abortWords: Record<keyof typeof ABORT, number>;
  };
  alignment: number;
  cudaProbe?: (options?: { ncclHome?: string; pythonPrefixes?: string[] }) => Record<string, unknown>;
  /** SCM_RIGHTS fd passing over a Unix socket ('@name' = abstract namespace); served once per pid in `clients`, to no one else. */
  fdServe(socketPath: string, fds: number[], clients: number[], timeoutMs: number): Promise<void>;
  fdFetch(socketPath: string, timeoutMs: number, serverPid?: number): Promise<number[]>;
  /** Ends this process's fdServe and fdFetch calls of `socketPath` now (each rejects with STATE); how many. */
  fdCancel(socketPath: string): number;
  closeFds(fds: number[]): void;
  /** The scale-out handshake's HMAC-SHA256 (tests check it against node:crypto). */
  hmacSha256(key: Uint8Array, message: Uint8Array): Uint8Array;
}

let loaded: (AddonCandidate & { addon: Addon; passedOver: PassedOver[] }) | undefined;

/**
 * The addon this thread uses (addon-select.ts picks it: RANKFLOW_ADDON, the source build, the prebuilt
 * addon for this machine), loaded and probed once per thread. Every thread picks the same file; the main
 * thread says so when it fell back from one that failed.
 */
export function loadAddon(): Addon {
  if (loaded) return loaded.addon;
  const choice = chooseAddon<Addon>(addonCandidates());
  if (!choice.loaded) throw new RankflowError('BACKEND_UNAVAILABLE', choice.error ?? 'no native addon');
  loaded = { ...choice.loaded, passedOver: choice.passedOver };
  const fallback = fallbackMessage(choice);
  if (fallback && isMainThread) process.emitWarning(fallback);
  return loaded.addon;
}

/** Which build of the addon is in use (after loadAddon), and what was passed over on the way: for doctor and the debug log. */
export function loadedAddon(): { origin: AddonCandidate['origin']; path: string; description: string; passedOver: PassedOver[] } | undefined {
  return loaded ? { origin: loaded.origin, path: loaded.path, description: loaded.description, passedOver: loaded.passedOver } : undefined;
}
