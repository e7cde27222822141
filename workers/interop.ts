// The part of a rank program's handle (workers/program.ts) that lets the application's own GPU work
// run beside the rank's on cuda: the rank's CUDA stream and context as addresses (for the
// application's kernels and libraries), device tensors over the application's memory, and waits of
// the rank's stream for events recorded on other streams (rank.recordEvent() is the other way: a
// CUevent on the rank's stream that other streams wait for). On host each is EINVAL. The calls
// themselves, and their checks, are the op table's (workers/ops/device.ts).
import type { DeviceTensor } from '../actors/core/device-tensor.js';
import type { DType } from '../actors/core/tensor.js';
import type { DeviceOps } from './ops/device.js';

export function interopMethods(device: DeviceOps) {
  return {
    /** cuda: the rank's CUstream (a non-blocking stream) as an address: queue work on it to run in order with the rank's ops */
    cudaStream(): bigint {
      return device.cudaStream();
    },
    /** cuda: the rank's CUcontext (the primary context of its GPU, current on the rank's thread) as an address */
    cudaContext(): bigint {
      return device.cudaContext();
    },
    /**
     * cuda: a device tensor over the application's memory at `ptr` (device memory of this rank's GPU,
     * 16-byte aligned, numel(shape) elements of `dtype`). rankflow never frees it; `owner` (whatever
     * keeps the memory alive) is kept until the tensor's free() or the group's end.
     */
    wrapDevice<D extends DType>(ptr: bigint, dtype: D, shape: number[], opts?: { owner?: unknown }): DeviceTensor<D> {
      return device.wrapDevice(ptr, dtype, shape, opts);
    },
    /**
     * cuda: the rank's stream waits (on the GPU; the CPU goes on) for `event`, a CUevent recorded on
     * any stream of any context: later ops of the rank run after the work before it.
     */
    waitEvent(event: bigint): void {
      device.waitEvent(event);
    },
  };
}
