// Device-resident tensors of cuda rank programs (`rank.tensor(...)` on backend 'cuda'): memory on the
// rank's GPU (its device pool, in the order of the rank's stream, on the rank's thread), freed with `free()` or
// when the group is destroyed; `toHost()` copies it back after the rank's queued work. Also device
// memory of the application's own (`rank.wrapDevice`): never freed here, its owner kept until free().
import { invalid, RankflowError } from './errors.js';
import { ELEMENT_BYTES, fromBytes, isDType, numel, type DType, type Tensor } from './tensor.js';
import { checkKnownKeys } from './option-keys.js';

/** What a device tensor needs from its rank's native context. */
export interface DeviceMemory {
  deviceAlloc(bytes: number): bigint;
  deviceFree(ptr: bigint): void;
  deviceUpload(ptr: bigint, data: ArrayBufferView): void;
  /** zero-fills on the rank's stream (a memset: no host bytes, and capturable) */
  deviceZero(ptr: bigint, bytes: number): void;
  deviceDownload(ptr: bigint, bytes: number): Uint8Array;
}

export class DeviceTensor<D extends DType = DType> {
  readonly device = true as const;
  readonly shape: number[];
  private freed = false;
  /** what keeps external memory alive (wrapDevice's owner) until free() */
  private owner: unknown;

  /**
   * @internal owned: freed by free(); a view (outputs left in the buffer) or external memory
   * (wrapDevice) only forgets its address, and lets go of `owner`
   */
  constructor(
    private readonly mem: DeviceMemory,
    readonly dtype: D,
    shape: number[],
    private readonly address: bigint,
    private readonly owned = true,
    owner?: unknown,
  ) {
    this.shape = [...shape];
    this.owner = owner;
  }

  get bytes(): number {
    return numel(this.shape) * ELEMENT_BYTES[this.dtype];
  }

  /** The device address (for the native side). */
  get ptr(): bigint {
    if (this.freed) throw new RankflowError('STATE', 'this device tensor was freed');
    return this.address;
  }

  /** Copies the tensor to a host tensor (waits for the rank's queued GPU work). */
  toHost(): Tensor<D> {
    return fromBytes(this.dtype, this.shape, this.mem.deviceDownload(this.ptr, this.bytes));
  }

  /** Overwrites the tensor with host data of the same byte length. */
  upload(data: ArrayBufferView): void {
    if (data.byteLength !== this.bytes) throw invalid('data', `has ${data.byteLength} bytes; the tensor has ${this.bytes}`);
    this.mem.deviceUpload(this.ptr, data);
  }

  /** Gives the memory back (a tensor of the same size reuses it); external memory: lets go of its owner. Safe twice. */
  free(): void {
    if (this.freed) return;
    this.freed = true;
    this.owner = undefined;
    if (this.owned) this.mem.deviceFree(this.address);
  }

  /** `using t = rank.tensor(...)`: free() when the scope ends. */
  [Symbol.dispose](): void {
    this.free();
  }
}

export const isDeviceTensor = (t: unknown): t is DeviceTensor => t instanceof DeviceTensor;

/** @internal uninitialised device memory of `dtype` and `shape` (outputs the kernels fill). */
export function deviceEmpty<D extends DType>(mem: DeviceMemory, dtype: D, shape: number[]): DeviceTensor<D> {
  return new DeviceTensor(mem, dtype, shape, mem.deviceAlloc(numel(shape) * ELEMENT_BYTES[dtype]));
}

/** A device tensor of `dtype` and `shape`, zero-filled or holding `data` (host typed array of the same bytes). */
export function deviceTensor<D extends DType>(mem: DeviceMemory, dtype: D, shape: number[], data?: ArrayBufferView): DeviceTensor<D> {
  if (!Array.isArray(shape) || shape.some((d) => !Number.isInteger(d) || d < 0)) throw invalid('shape', 'must be a list of non-negative integers');
  if (!isDType(dtype)) throw invalid('dtype', `must be one of ${Object.keys(ELEMENT_BYTES).join(', ')}`);
  const bytes = numel(shape) * ELEMENT_BYTES[dtype];
  if (data !== undefined && data.byteLength !== bytes) throw invalid('data', `has ${data.byteLength} bytes; [${shape.join(', ')}] ${dtype} needs ${bytes}`);
  const t = new DeviceTensor(mem, dtype, shape, mem.deviceAlloc(bytes));
  try {
    if (data !== undefined) t.upload(data);
    else mem.deviceZero(t.ptr, bytes);
  } catch (e) {
    t.free();  // nothing half-made: the memory goes back
    throw e;
  }
  return t;
}

/** What wrapping external memory needs from the rank's native context. */
export interface ExternalMemory extends DeviceMemory {
  deviceCheck(ptr: bigint, bytes: number): void;
}

/** The rankflow kernels read and write 16 bytes at a time. */
const DEVICE_ALIGNMENT = 16;

/**
 * A device tensor over memory the application owns (rank.wrapDevice): checked to be device memory of
 * the rank's GPU, 16-byte aligned; never freed by rankflow; `owner` is kept alive until free().
 */
export function externalTensor<D extends DType>(mem: ExternalMemory, ptr: unknown, dtype: D, shape: number[], opts?: { owner?: unknown }): DeviceTensor<D> {
  if (typeof ptr !== 'bigint' || ptr <= 0n || ptr >= 1n << 64n) throw invalid('ptr', `must be a device address as a BigInt in (0, 2^64) (got ${typeof ptr === 'bigint' ? ptr : typeof ptr})`);
  if (ptr % BigInt(DEVICE_ALIGNMENT) !== 0n) throw invalid('ptr', `0x${ptr.toString(16)} is not ${DEVICE_ALIGNMENT}-byte aligned: rankflow's kernels move 16 bytes at a time`);
  if (!isDType(dtype)) throw invalid('dtype', `must be one of ${Object.keys(ELEMENT_BYTES).join(', ')}`);
  if (!Array.isArray(shape) || shape.some((d) => !Number.isInteger(d) || d < 0)) throw invalid('shape', 'must be a list of non-negative integers');
  if (opts !== undefined && (opts === null || typeof opts !== 'object')) throw invalid('options', 'must be { owner? }');
  if (opts !== undefined) checkKnownKeys('options', opts, ['owner']);
  const bytes = numel(shape) * ELEMENT_BYTES[dtype];
  try {
    mem.deviceCheck(ptr, bytes);
  } catch (e) {
    throw RankflowError.from(e);
  }
  return new DeviceTensor(mem, dtype, shape, ptr, false, opts?.owner);
}
