// Device-side building blocks every rankflow kernel uses: system-scope release/acquire accesses for
// cross-GPU signals, the global timer, and the bounded signal wait that, instead of hanging the GPU
// forever when a peer never comes, leaves a Diagnostic in mapped host memory and traps.
// Signal encodings and slot offsets come from native/src/layout.hpp, shared with the host executor.
#pragma once

#include <cstdint>

#include "../native/src/layout.hpp"

namespace rankflow::kernels {

// Signals cross GPUs (NVLink) and may sit in host memory (hybrid segments): system scope throughout.
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void red_add_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

// Nanoseconds, the same clock on every GPU of the node (readable without a fence).
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The slot `array`[peer] of the workspace that starts at `workspace`.
__device__ __forceinline__ uint64_t* slot_ptr(uint64_t workspace, const WorkspaceLayout& ws,
                                              int64_t array, int peer) {
  return reinterpret_cast<uint64_t*>(workspace + uint64_t(ws.slot(array, peer)));
}

// Sequence numbers wrap at 2^32: compare by signed distance, as the host executor does (seq_reached).
__device__ __forceinline__ bool seq_reached(uint64_t v, uint32_t seq) {
  return int32_t(signal_seq(v) - seq) >= 0;
}

// Writes the Diagnostic (plain volatile stores: host-mapped memory has no reliable atomics over
// PCIe) with the code last, makes it visible to the CPU, and traps. The host sees the launch fail
// (CUDA_ERROR_ILLEGAL_INSTRUCTION or CUDA_ERROR_LAUNCH_FAILED) and reads the record.
__device__ __noinline__ void fail_timeout(Diagnostic* diag, Phase phase, int peer, uint64_t last) {
  if (diag != nullptr) {
    volatile Diagnostic* d = diag;
    d->phase = phase;
    d->peer = uint64_t(peer);
    d->value = last;
    __threadfence_system();
    d->code = 1;  // timeout
    __threadfence_system();
  }
  __trap();
}

// Spins until the slot's sequence reaches `seq` and returns the value (acquire: what the peer wrote
// before its release is visible afterwards). After timeout_ns, reports and traps.
__device__ __forceinline__ uint64_t wait_signal(const uint64_t* slot, uint32_t seq,
                                                uint64_t timeout_ns, Diagnostic* diag, Phase phase,
                                                int peer) {
  uint64_t v = ld_acquire_sys(slot);
  if (seq_reached(v, seq)) return v;
  const uint64_t start = globaltimer_ns();
  while (true) {
    v = ld_acquire_sys(slot);
    if (seq_reached(v, seq)) return v;
    if (globaltimer_ns() - start > timeout_ns) fail_timeout(diag, phase, peer, v);
  }
}

}  // namespace rankflow::kernels
