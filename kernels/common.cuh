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

// ---- bulk copies shared by allGather and the AGRS puts ----
constexpr int kWarpSize = 32;
// Independent 16-byte loads in flight per lane before the first store (Hopper: several per thread).
constexpr int kCopyUnroll = 4;
constexpr int64_t kCopyChunkBytes = int64_t(kWarpSize) * kCopyUnroll * 16;  // 2 KiB per warp step

// Read-only input, streamed once: a 16-byte non-coherent load with no L1 allocation.
__device__ __forceinline__ int4 ld_nc_v4(const void* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// One warp copies chunk `chunk` (kCopyChunkBytes) of `vecs` 16-byte vectors: all loads first, then the
// stores, so that kCopyUnroll loads per lane are in flight over NVLink.
__device__ __forceinline__ void warp_copy_chunk(int4* out, const int4* in, int64_t chunk, int64_t vecs, int lane) {
  int4 v[kCopyUnroll];
#pragma unroll
  for (int u = 0; u < kCopyUnroll; ++u) {
    const int64_t i = chunk * (kCopyChunkBytes / 16) + u * kWarpSize + lane;
    if (i < vecs) v[u] = ld_nc_v4(in + i);
  }
#pragma unroll
  for (int u = 0; u < kCopyUnroll; ++u) {
    const int64_t i = chunk * (kCopyChunkBytes / 16) + u * kWarpSize + lane;
    if (i < vecs) out[i] = v[u];
  }
}

// Every block calls it after its stores: true in the one block that arrives last, once every block's
// stores are visible system-wide (a fence each, then a grid-wide count). The count is left at zero
// for the next launch on the stream. Every thread of a block gets the same answer.
__device__ __forceinline__ bool last_block_arrived(unsigned* arrivals) {
  __threadfence_system();
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return false;
  __threadfence();  // acquire the other blocks' arrivals (their fences came before their atomicAdd)
  if (threadIdx.x == 0) *arrivals = 0;
  return true;
}

}  // namespace rankflow::kernels
