// Benchmarks and baselines of the CUDA backend, timed with CUDA events on the rank's stream, apart
// from the runtime's ops: ncclAlltoAll and a copy-engine peer copy of the same bytes (bench:gpu), and
// the AGRS / engram / pipeline transports on device-resident data (bench/gpu-agrs). Every rank calls
// each one together with the same arguments (they are collectives: each iteration takes a seq).
#include <algorithm>
#include <random>

#include "backend.hpp"
#include "driver.hpp"
#include "faults.hpp"

namespace rankflow::cuda {

namespace {

// ms per call of `one` over `iters` runs after `warmup`, between events on `s`.
template <typename F>
double timed(DevicePool& pool, CUstream s, F&& one, int iters, int warmup) {
  for (int i = 0; i < warmup; ++i) one();
  const CUevent a = pool.new_event(), b = pool.new_event();
  RF_CU(cuEventRecord, a, s);
  for (int i = 0; i < iters; ++i) one();
  RF_CU(cuEventRecord, b, s);
  RF_CU(cuEventSynchronize, b);
  float ms = 0;
  RF_CU(cuEventElapsedTime, &ms, a, b);
  pool.destroy_event(a);
  pool.destroy_event(b);
  return double(ms) / std::max(1, iters);
}

}  // namespace

double CudaBackend::bench_all_to_all(int64_t bytes, int iters, int warmup) {
  check_alive("benchAlltoAll");
  check_runs("benchAlltoAll");  // two levels: comm_ is the rail's, not the world's
  RF_CHECK(comm_ != nullptr, "EINVAL",
           c_.cfg.nccl ? "benchAlltoAll: this rank has no NCCL communicator (NCCL was not found: see rankflow doctor)"
                       : "benchAlltoAll: NCCL is unavailable in this group: its ranks share a GPU, and NCCL refuses two "
                         "ranks on one GPU (give each rank its own GPU for the NCCL baselines)");
  const int W = world();
  const int64_t per_peer = align_up(std::max<int64_t>(bytes / W, 1), 16);
  return translating(rank(), [&] {
    const CUdeviceptr send = pool_.alloc(per_peer * W, "benchAlltoAll input"), recv = pool_.alloc(per_peer * W, "benchAlltoAll output");
    const double ms = timed(pool_, stream_, [&] {
      RF_NCCL(ncclAlltoAll, reinterpret_cast<void*>(send), reinterpret_cast<void*>(recv), size_t(per_peer), ncclUint8, comm_, stream_);
    }, iters, warmup);
    pool_.free(send);
    pool_.free(recv);
    return ms;
  });
}

double CudaBackend::bench_peer_copy(int64_t bytes, int iters, int warmup) {
  check_alive("benchPeerCopy");
  check_runs("benchPeerCopy");
  const int peer = (rank() + 1) % world();
  RF_CHECK(bytes <= c_.buffer_bytes(), "EINVAL", "benchPeerCopy: more bytes than the peer's buffer");
  return translating(rank(), [&] {
    const CUdeviceptr src = pool_.alloc(bytes, "benchPeerCopy input");
    const CUdeviceptr dst = mem_.peer_base(peer) + CUdeviceptr(c_.ws.bytes);
    RF_CU(cuMemsetD8Async, src, 0, size_t(bytes), stream_);
    const double ms = timed(pool_, stream_, [&] { RF_CU(cuMemcpyAsync, dst, src, size_t(bytes), stream_); }, iters, warmup);
    pool_.free(src);
    return ms;
  });
}

double CudaBackend::bench_agrs(const std::string& op, const std::string& engine, int64_t bytes, int64_t iters) {
  check_alive("benchAgrs");
  check_runs("benchAgrs");
  const int W = world();
  RF_CHECK(iters > 0 && bytes > 0 && bytes % 16 == 0, "EINVAL", "benchAgrs: bytes must be a positive multiple of 16");
  RF_CHECK(engine == "kernel" || engine == "ce" || engine == "auto", "EINVAL", "benchAgrs: engine is kernel, ce or auto");
  const bool is_engram = op == "engram";
  RF_CHECK(is_engram || bytes * W <= c_.buffer_bytes(), "EINVAL",
           "benchAgrs " + op + " of " + std::to_string(bytes) + " bytes per rank needs " + std::to_string(bytes * W) +
               " buffer bytes; the buffer has " + std::to_string(c_.buffer_bytes()));
  RF_CHECK(!is_engram || c_.engram_entries > 0, "EINVAL", "benchAgrs engram needs an engramWrite first");
  RF_CHECK(op == "ce" || op == "ag" || op == "rs-fp32" || op == "rs-bf16" || op == "pp" || op == "engram", "EINVAL",
           "benchAgrs: unknown op '" + op + "' (ce, ag, rs-fp32, rs-bf16, pp, engram)");
  const int64_t saved = ce_min_bytes_;
  if (engine == "kernel") ce_min_bytes_ = int64_t(1) << 40;
  if (engine == "ce") ce_min_bytes_ = 0;
  double us = 0;
  try {
    translating(rank(), [&] {
      const int64_t src_bytes = is_engram ? align_up(bytes * 4, kRegionAlignment) + bytes * c_.engram_row_bytes : bytes * W * 2;
      const CUdeviceptr src = staging(src_bytes);
      if (is_engram) {  // `bytes` random global row ids, the same on every run
        std::mt19937 gen(1234 + rank());
        std::uniform_int_distribution<int32_t> pick(0, int32_t(c_.engram_entries * W - 1));
        std::vector<int32_t> ids(static_cast<size_t>(bytes));
        for (auto& id : ids) id = pick(gen);
        from_host(src, ids.data(), int64_t(ids.size() * 4));
      } else {
        RF_CU(cuMemsetD8Async, src, 0x3c, size_t(src_bytes), stream_);
      }
      const int64_t base = c_.ws.bytes;
      auto once = [&] {
        const kargs::RankArgs a = rank_args(c_.next_seq());
        if (op == "ce") {  // the copy-engine limit: my bytes into every peer's window, no signals
          for (int k = 1; k < W; ++k) {
            const int p = (rank() + k) % W;
            RF_CU(cuMemcpyAsync, mem_.peer_base(p) + CUdeviceptr(base + rank() * bytes), src, size_t(bytes), stream_);
          }
        } else if (op == "ag") {
          put(a, src, 0, bytes, base + rank() * bytes, kargs::Ring{1, W - 1, 1, W - 1}, false, kPhaseSessionGather);
        } else if (op == "rs-fp32" || op == "rs-bf16") {
          const bool bf = op == "rs-bf16";
          put(a, src, bytes, bytes, base + rank() * bytes, kargs::Ring{0, W, 1, W - 1}, false, kPhaseSessionReduce);
          kargs::ReduceArgs r;
          r.region = reinterpret_cast<const void*>(mem_.window() + CUdeviceptr(base));
          r.n = bytes / (bf ? 2 : 4);
          r.world = W;
          r.bf16 = bf ? 1 : 0;
          r.out = reinterpret_cast<void*>(src + CUdeviceptr(bytes * W));
          launch_->reduce(stream_, r);
        } else if (op == "pp") {
          put(a, src, 0, bytes, base, kargs::Ring{1, 1, 1, 1}, true, kPhasePipeline);
        } else {
          kargs::FetchArgs f;
          f.segments = reinterpret_cast<const uint64_t*>(segments_);
          f.ids = reinterpret_cast<const int32_t*>(src);
          f.n = bytes;
          f.entries = c_.engram_entries;
          f.row_bytes = c_.engram_row_bytes;
          f.out = reinterpret_cast<uint8_t*>(src + CUdeviceptr(align_up(bytes * 4, kRegionAlignment)));
          launch_->engram_fetch(stream_, f);
        }
      };
      auto barrier_now = [&] {
        kargs::BarrierArgs b;
        b.r = rank_args(c_.next_seq());
        b.array = kws_.barrier;
        launch_->barrier(stream_, b);
      };
      for (int i = 0; i < 3; ++i) once();  // warm-up
      barrier_now();
      const double ms = timed(pool_, stream_, once, int(iters), 0);
      barrier_now();
      us = ms * 1000.0;
    });
    wait_stream(WaitSite{kPhaseBarrier, -1, "barrier"});
  } catch (...) {
    ce_min_bytes_ = saved;
    throw;
  }
  ce_min_bytes_ = saved;
  return us;
}

}  // namespace rankflow::cuda
