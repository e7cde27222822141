// Asynchronous AGRS collectives and engram fetches on GPUs (Backend::agrs_issue, ...): the phases of
// collectives.cc, enqueued on the rank's stream with nothing waited for, then an event recorded;
// complete() waits for that event in the runtime's one wait loop (GPU timeout, abort words, faults),
// as wait_stream does for the whole stream. An allGather of a session tensor is in place: its data is
// my slot of the region already, so only the puts to the peers run. A reduceScatter leaves its sum
// at the start of its region (the reduce kernel reads every part of element i, then writes part 0's).
// A fetch copies its ids into a block of the rank's pool (stream-ordered: no device-wide
// synchronisation, which pinned allocations would bring, and with ranks sharing a GPU could deadlock
// a peer's waiting kernel) through the rank's pinned staging (from_host): issuing waits for the rank's
// earlier stream work only where ids of more than one staging half are still queued. Across nodes the
// collectives cross in two levels as the synchronous ones (two_level_agrs.cc; their rail headers go
// unchecked: nothing is waited for), and a fetch reads this node's host segments.
#include "backend.hpp"
#include "driver.hpp"
#include "faults.hpp"

namespace rankflow::cuda {

namespace {
struct AsyncEnd final : AsyncState {
  CUevent done = nullptr;  // recorded after the op's last work on the stream
};

}  // namespace

void CudaBackend::agrs_issue(AgrsOp& op) {
  RF_CHECK(!capturing_, "STATE", "an asynchronous session collective cannot be captured into a graph");
  check_rails(op.reduce ? "session reduceScatter" : "session allGather");
  const int W = world();
  const int64_t region = c_.ws.bytes + op.at;  // window offset of the op's region
  auto end = std::make_unique<AsyncEnd>();
  translating(rank(), [&] {
    if (!op.reduce) {
      const int64_t mine = region + int64_t(rank()) * op.bytes;
      const CUdeviceptr slot = mem_.window() + CUdeviceptr(mine);
      const bool in_place = op.in.device && dev(op.in.ptr) == slot;
      if (!in_place && op.bytes > 0) {
        if (op.in.device) RF_CU(cuMemcpyAsync, slot, dev(op.in.ptr), size_t(op.bytes), stream_);
        else from_host(slot, op.in.ptr, op.bytes);
      }
      session_gather_parts(op.seq, region, op.bytes);
    } else {
      const int64_t chunk = op.bytes;
      // Behind the staged input: what other nodes send (scatter_recv_bytes).
      const int64_t across = scatter_recv_bytes(chunk);
      const CUdeviceptr recv = across > 0 ? staging(chunk * W + across) + CUdeviceptr(chunk * W) : 0;
      CUdeviceptr src = dev(op.in.ptr);
      if (!op.in.device || (src & 15) != 0) {  // staged in stream order (a later op reuses it after this one)
        const CUdeviceptr stage = staging(chunk * W);
        if (chunk > 0) {
          if (op.in.device) RF_CU(cuMemcpyAsync, stage, src, size_t(chunk * W), stream_);
          else from_host(stage, op.in.ptr, chunk * W);
        }
        src = stage;
      }
      session_scatter(op.seq, src, recv, chunk, region);
      kargs::ReduceArgs r;
      r.region = reinterpret_cast<const void*>(mem_.window() + CUdeviceptr(region));
      r.n = op.n;
      r.world = W;
      r.bf16 = op.bf16 ? 1 : 0;
      r.out = reinterpret_cast<void*>(mem_.window() + CUdeviceptr(region));
      if (op.n > 0) launch_->reduce(stream_, r);
    }
    end->done = pool_.new_event();
    RF_CU(cuEventRecord, end->done, stream_);
  });
  op.state = std::move(end);
}

void CudaBackend::agrs_complete(AgrsOp& op) {
  auto* end = static_cast<AsyncEnd*>(op.state.get());
  wait_event(end->done, WaitSite{op.reduce ? kPhaseSessionReduce : kPhaseSessionGather, -1, "done"});
  pool_.destroy_event(end->done);
  end->done = nullptr;
}

void CudaBackend::engram_fetch_issue(FetchOp& op) {
  RF_CHECK(!capturing_, "STATE", "an asynchronous engram fetch cannot be captured into a graph");
  RF_CHECK(op.out.device, "EINVAL", "engramFetch output: an asynchronous fetch on cuda writes device memory");
  const int64_t n = int64_t(op.ids.size());
  auto end = std::make_unique<AsyncEnd>();
  translating(rank(), [&] {
    if (n > 0) {
      const CUdeviceptr ids = pool_.alloc(n * 4, "engram fetch ids");
      kargs::FetchArgs f;
      f.segments = reinterpret_cast<const uint64_t*>(segments_);
      f.ids = reinterpret_cast<const int32_t*>(ids);
      f.n = n;
      f.entries = op.entries;
      f.row_bytes = op.row_bytes;
      f.out = op.out.as<uint8_t>();
      try {
        from_host(ids, op.ids.data(), n * 4);
        launch_->engram_fetch(stream_, f);
      } catch (...) {
        pool_.free(ids);
        throw;
      }
      pool_.free(ids);  // in stream order: after the kernel
    }
    end->done = pool_.new_event();
    RF_CU(cuEventRecord, end->done, stream_);
  });
  op.state = std::move(end);
}

void CudaBackend::engram_fetch_complete(FetchOp& op) {
  auto* end = static_cast<AsyncEnd*>(op.state.get());
  wait_event(end->done, WaitSite{kPhaseEngram, -1, "fetch"});
  pool_.destroy_event(end->done);
  end->done = nullptr;
}

}  // namespace rankflow::cuda
