// What moe_smoke and moe_bench share: rank threads with a rendezvous, RAII device objects, and one
// rank of a GPU-only symmetric MoE buffer (window = workspace + buffer, peer table, MoE kernels,
// mapped host memory for the Diagnostic and the CPU-sync counts, the arrivals word).
#pragma once

#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device.hpp"
#include "cuda/driver.hpp"
#include "cuda/host_workspace.hpp"
#include "cuda/moe_launch.hpp"
#include "cuda/symmetric.hpp"
#include "harness.hpp"
#include "layout.hpp"

namespace rftest {

using namespace rankflow;
using namespace rankflow::cuda;

template <typename T>
void upload(const DeviceBuffer& d, const std::vector<T>& h) {
  copy_to_device(d.ptr, h.data(), h.size() * sizeof(T));
}
template <typename T>
std::vector<T> download(CUdeviceptr d, size_t n) {
  std::vector<T> h(n);
  if (n > 0) RF_CU(cuMemcpyDtoH, h.data(), d, n * sizeof(T));
  return h;
}

// What the rank threads of one world share.
struct WorldShared {
  explicit WorldShared(int world) : rv(world), exports(size_t(world)) {}
  Rendezvous rv;
  std::vector<ExportedSegments> exports;
};

// One rank of the MoE world: GPU-only symmetric memory holding [workspace | buffer].
class MoeRank {
 public:
  static constexpr uint64_t kTimeoutNs = 10ull * 1000 * 1000 * 1000;
  static constexpr int64_t kHostCountsOffset = 64;  // after the Diagnostic

  MoeRank(int rank, const EpConfig& ep, WorldShared& sh)
      : rank(rank), ep(ep), ws(WorkspaceLayout::make(ep.world_size, int32_t(ep.num_experts / ep.world_size))),
        buf(BufferLayout::make(ep)), dev(rank) {
    sh.exports[size_t(rank)] = mem.create(rank, ep.world_size, dev, ws.bytes + buf.bytes, 0, MemoryKind::GpuOnly,
                                          ep.world_size);
    sh.rv.arrive();
    mem.import_peers(sh.exports);
    sh.rv.arrive();
    mem.close_exported();
    stream = std::make_unique<Stream>();
    kernels = std::make_unique<MoeKernels>();
    RF_CU(cuMemsetD8Async, mem.window(), 0, size_t(ws.bytes), stream->s);
    const std::vector<uint64_t> table = mem.peer_table();
    peers.alloc(table.size() * 8);
    upload(peers, table);
    arrivals.alloc(16);
    RF_CU(cuMemsetD8Async, arrivals.ptr, 0, 16, stream->s);
    const moe::MoeArgs a = args(1);
    host.create(kHostCountsOffset + host_counts_bytes(a));
    state_bytes = moe_state_layout(a).bytes;
    RF_CU(cuStreamSynchronize, stream->s);
    sh.rv.arrive();  // every workspace is zeroed before anybody signals into it
  }

  moe::MoeArgs args(uint32_t s) const {
    return moe_args(peers.ptr, 0, ws, buf, ep, rank, s, kTimeoutNs, host.device_at(0), arrivals.ptr);
  }
  CUdeviceptr counts_device() const { return host.device_at(kHostCountsOffset); }
  const void* counts_host() const { return host.host_at<void>(kHostCountsOffset); }
  const Diagnostic* diag() const { return host.host_at<Diagnostic>(0); }
  CUstream s() const { return stream->s; }
  int sm_count() const { return dev.sm_count(); }
  CUdeviceptr buffer() const { return mem.window() + CUdeviceptr(ws.bytes); }
  CUdeviceptr peer_buffer(int p) const { return mem.peer_base(p) + CUdeviceptr(ws.bytes); }

  // Blocks until the CPU-sync counts of op `seq` are in the mirror.
  HostDispatchCounts wait_counts(uint32_t seq) const {
    HostDispatchCounts c;
    const int epr = int(ep.num_experts / ep.world_size);
    for (uint64_t spins = 0; !poll_dispatch_counts(counts_host(), ep.world_size, epr, seq, &c); ++spins) {
      if ((spins & 0xffff) == 0) {
        const CUresult r = driver().cuStreamQuery(stream->s);
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) check(r, "cuStreamQuery", "dispatch notify");
      }
    }
    return c;
  }

  int rank;
  EpConfig ep;
  WorkspaceLayout ws;
  BufferLayout buf;
  DeviceContext dev;
  SymmetricMemory mem;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<MoeKernels> kernels;
  DeviceBuffer peers, arrivals;
  HostWorkspace host;
  int64_t state_bytes = 0;
};

// xorshift64*: deterministic inputs.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
  uint32_t below(uint32_t n) { return uint32_t(next() % n); }
  float uniform() { return float(next() >> 40) / float(1 << 24); }  // [0, 1)
  // A finite bf16 in about [-4, 4): random sign, exponent and mantissa bits.
  uint16_t bf16() {
    const float f = (uniform() * 8.0f - 4.0f);
    return float_to_bf16(f);
  }
};

}  // namespace rftest
