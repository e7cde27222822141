// The op table's session part (`ops.session`): the native calls behind rank programs' AGRS session
// views and asynchronous ops (workers/session-views.ts): a fresh region of the session's buffer,
// views of the window (host: an ArrayBuffer over it; cuda: a device tensor in it, revoked when its
// session closes), the issue of a session collective or an engram fetch, and the wait for one in
// flight. The machine's passes around them (event in, ISSUED, COMPLETED) stay with session-views.
import type { NativeContext, TensorArg } from '../../actors/core/addon.js';
import { DeviceTensor } from '../../actors/core/device-tensor.js';
import { RankflowError } from '../../actors/core/errors.js';
import type { DType } from '../../actors/core/tensor.js';

/** A device tensor in the session's buffer: unusable once its session closed (the next one reuses the memory). */
export class SessionDeviceView<D extends DType = DType> extends DeviceTensor<D> {
  private revokedBy: string | null = null;
  override get ptr(): bigint {
    if (this.revokedBy !== null) throw new RankflowError('STATE', this.revokedBy);
    return super.ptr;
  }
  /** @internal */
  revoke(why: string): void {
    this.revokedBy = why;
  }
}

export class SessionOps {
  constructor(private readonly native: NativeContext) {}

  /** A fresh session region for a tensor of `bytes` per rank: the window offset of my slot in it. */
  region(bytes: number): number {
    return this.native.sessionTensor(bytes);
  }

  /** host: an ArrayBuffer over my window's bytes [offset, offset + bytes), detached when the session closes. */
  hostView(offset: number, bytes: number): ArrayBuffer {
    return this.native.windowView(offset, bytes);
  }

  /** cuda: the device address of my window. */
  window(): bigint {
    return this.native.info().window;
  }

  /** cuda: a view (never freed) of `shape` at `address` in my window. */
  deviceView<D extends DType>(dtype: D, shape: number[], address: bigint): SessionDeviceView<D> {
    return new SessionDeviceView(this.native, dtype, shape, address, false);
  }

  /** Starts a session allGather (size: bytes per rank) or reduceScatter (size: n per chunk): [op id, window offset of the result]. */
  issue(reduce: boolean, input: TensorArg, size: number, bf16: boolean): [number, number] {
    return this.native.sessionIssue(reduce, input, size, bf16);
  }

  /** Starts an engram fetch: [op id, device address of the rows (cuda) or 0n (host)]. */
  fetchIssue(ids: Int32Array): [number, bigint] {
    return this.native.engramFetchIssue(ids);
  }

  /** cuda: the rows a fetch leaves at `ptr`, as a device tensor of their own (its free() gives them back). */
  fetchedRows<D extends DType>(dtype: D, shape: number[], ptr: bigint): DeviceTensor<D> {
    return new DeviceTensor(this.native, dtype, shape, ptr);
  }

  /** Waits for an op in flight: a host fetch's rows (an ArrayBuffer that owns them), else undefined. */
  wait(id: number): ArrayBuffer | undefined {
    return this.native.inflightWait(id);
  }
}
