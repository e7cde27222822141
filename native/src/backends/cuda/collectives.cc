// Barrier, allGather, AGRS sessions, engram and pipeline on GPUs: the host executor's phases
// (backends/host/backend.cc, agrs.cc) on the kernels of barrier.cu, all_gather.cu, session.cu and
// engram.cu. Host tensors (driver mode) are staged through device memory and the op waits for its
// stream before it returns; device tensors (rank programs) are enqueued, and only what must be waited
// for on the CPU is (a barrier's completion, a copy back to the host). These are the node's ops (the
// kernels' view: rank_args, put, all_ring); across nodes the two-level layer (two_level.hpp) replaces
// barrier and allGather and joins the others at their hooks (check_rails, rail_round,
// check_rail_headers, session_gather_parts, session_scatter, pp_hop).
#include <algorithm>

#include "backend.hpp"
#include "driver.hpp"
#include "faults.hpp"

namespace rankflow::cuda {

// With CPU sync the rank waits for the kernel's completion flag (mapped host memory the kernel writes
// last): the kernel completes only once every peer's barrier kernel arrived, i.e. once every peer's
// CPU called the barrier and its earlier GPU work is done. That is the CPU round already, so cuda needs
// no second round of slot writes through the driver (the host executor does its CPU round on slots).
void CudaBackend::barrier(uint64_t seq, bool cpu_round, bool wait) {
  kargs::BarrierArgs a;
  a.r = rank_args(seq);
  a.array = kws_.barrier;
  a.phase = kPhaseBarrier;
  a.complete = wait || cpu_round ? 1 : 0;
  translating(rank(), [&] { launch_->barrier(stream_, a); });
  if (wait || cpu_round) wait_completed(seq, WaitSite{kPhaseBarrier, -1, "barrier"});
}

void CudaBackend::all_gather(uint64_t seq, Mem in, int64_t bytes, Mem out) {
  const int W = world();
  // The kernel moves 16-byte vectors: each rank's part is padded to 16 bytes in the buffer, and a host
  // (or unaligned) input is staged right behind the W gathered parts.
  const int64_t padded = align_up(bytes > 0 ? bytes : 16, 16);
  const int64_t gather = c_.ws.bytes;  // window offset of the buffer
  const int64_t staging_at = gather + align_up(padded * W, kRegionAlignment);
  RF_CHECK(staging_at + padded <= c_.sym_bytes, "EINVAL",
           "allGather of " + std::to_string(bytes) + " bytes per rank on cuda needs " +
               std::to_string(staging_at + padded - gather) + " buffer bytes (" + std::to_string(W) +
               " parts padded to 16 bytes and a staging area); the buffer has " + std::to_string(c_.buffer_bytes()) +
               " (raise buffer.bytes)");
  const bool direct = in.device && bytes == padded && (reinterpret_cast<uintptr_t>(in.ptr) & 15) == 0;
  translating(rank(), [&] {
    CUdeviceptr src = dev(in.ptr);
    if (!direct) {
      src = mem_.window() + CUdeviceptr(staging_at);
      if (bytes > 0) {
        if (in.device) RF_CU(cuMemcpyAsync, src, dev(in.ptr), size_t(bytes), stream_);
        else from_host(src, in.ptr, bytes);
      }
      if (padded > bytes) RF_CU(cuMemsetD8Async, src + CUdeviceptr(bytes), 0, size_t(padded - bytes), stream_);
    }
    kargs::AllGatherArgs a;
    a.r = rank_args(seq);
    a.src = reinterpret_cast<const void*>(src);
    a.bytes = padded;
    a.dst_offset = gather;
    launch_->all_gather(stream_, a);
  });
  if (!out.device) wait_stream(WaitSite{kPhaseAllGather, -1, "done"});
  copy_gathered(out, gather, bytes, padded);
}

// Peer reduce (rf_peer_reduce). Where every rank of the world is a rank of this process on this GPU,
// device tensors are read and written where they lie (their addresses are valid for every rank);
// other tensors go through my window: the input staged at the buffer's start, the sums behind it.
void CudaBackend::reduce_peers(uint64_t seq, Mem in, Mem out, int64_t n, bool bf16) {
  const int64_t bytes = n * (bf16 ? 2 : 4);
  const int64_t staged = c_.ws.bytes, sums = staged + align_up(bytes, kRegionAlignment);  // window offsets
  const bool shared = c_.cfg.device_share == world();
  const bool in_direct = shared && in.device, out_direct = shared && out.device;
  kargs::PeerReduceArgs a;
  a.in = in_direct ? in.ptr : reinterpret_cast<const void*>(uintptr_t(staged));
  a.out = out_direct ? out.ptr : reinterpret_cast<void*>(uintptr_t(sums));
  a.window = (in_direct ? 0u : 1u) | (out_direct ? 0u : 2u);
  a.local = shared ? 1 : 0;  // every signal, window and tensor is this GPU's memory: GPU-scope ordering
  a.n = n;
  a.bf16 = bf16 ? 1 : 0;
  a.tag = peer_reduce_tag(n, bf16);
  const CUdeviceptr result = mem_.window() + CUdeviceptr(sums);
  if (capturing_) capture_.needs_all = true;
  translating(rank(), [&] {
    if (!in_direct && bytes > 0) {
      const CUdeviceptr to = mem_.window() + CUdeviceptr(staged);
      if (in.device) RF_CU(cuMemcpyAsync, to, dev(in.ptr), size_t(bytes), stream_);
      else from_host(to, in.ptr, bytes);
    }
    a.r = rank_args(seq);
    launch_->peer_reduce(stream_, a);
    if (!out_direct && out.device && bytes > 0) RF_CU(cuMemcpyAsync, dev(out.ptr), result, size_t(bytes), stream_);
  });
  if (out.device) return;
  wait_stream(WaitSite{kPhasePeerReduce, -1, "done"});
  if (bytes > 0) translating(rank(), [&] { RF_CU(cuMemcpyDtoH, out.ptr, result, size_t(bytes)); });
}

// The W gathered parts (padded to `padded` bytes in the buffer at `gather`) into `out`, `bytes` each:
// for a device tensor in stream order (the buffer is reused by the next op), for host memory at once
// (the caller waited for the stream).
void CudaBackend::copy_gathered(Mem out, int64_t gather, int64_t bytes, int64_t padded) {
  if (bytes == 0) return;
  const int W = world();
  const CUdeviceptr g = mem_.window() + CUdeviceptr(gather);
  translating(rank(), [&] {
    if (out.device) {
      const CUdeviceptr o = dev(out.ptr);
      if (padded == bytes) RF_CU(cuMemcpyAsync, o, g, size_t(bytes * W), stream_);
      else
        for (int p = 0; p < W; ++p)
          RF_CU(cuMemcpyAsync, o + CUdeviceptr(p * bytes), g + CUdeviceptr(p * padded), size_t(bytes), stream_);
      return;
    }
    auto* o = out.as<uint8_t>();
    if (padded == bytes) {
      RF_CU(cuMemcpyDtoH, o, g, size_t(bytes * W));
      return;
    }
    for (int p = 0; p < W; ++p) RF_CU(cuMemcpyDtoH, o + int64_t(p) * bytes, g + CUdeviceptr(int64_t(p) * padded), size_t(bytes));
  });
}

// Destinations and rings are in the kernels' view (kernel_rank(), kernel_world(): in two levels the node's).
void CudaBackend::put(const kargs::RankArgs& a, CUdeviceptr src, int64_t src_stride, int64_t bytes, int64_t dst_offset,
                      kargs::Ring ring, bool enter, Phase phase) {
  const int W = kernel_world();
  const bool aligned = bytes % 16 == 0 && src % 16 == 0 && src_stride % 16 == 0 && dst_offset % 16 == 0;
  if (aligned && bytes < ce_min_bytes_) {
    kargs::PutArgs p;
    p.r = a;
    p.src = reinterpret_cast<const void*>(src);
    p.src_stride = src_stride;
    p.bytes = bytes;
    p.dst_offset = dst_offset;
    p.ring = ring;
    p.enter = enter ? 1 : 0;
    p.phase = phase;
    launch_->put(stream_, p);
    return;
  }
  // Copy engines: enter (announce to my sources, wait for my destinations: the reverse ring), the
  // copies into the peers' windows, then done.
  kargs::SignalArgs s;
  s.r = a;
  if (enter) {
    s.array = kws_.enter;
    s.value = a.seq;
    s.ring = kargs::Ring{W - ring.src_start % W, ring.src_count, W - ring.dst_start % W, ring.dst_count};
    s.phase = kPhaseEnter;
    launch_->signal(stream_, s);
  }
  if (bytes > 0)
    for (int k = 0; k < ring.dst_count && k < W; ++k) {
      const int p = (kernel_rank() + ring.dst_start + k) % W;
      RF_CU(cuMemcpyAsync, kernel_peer_base(p) + CUdeviceptr(dst_offset), src + CUdeviceptr(p * src_stride), size_t(bytes),
            stream_);
    }
  s.array = kws_.done;
  s.value = a.seq;
  s.ring = ring;
  s.phase = phase;
  launch_->signal(stream_, s);
}

// In two levels the signals run over the node, then the rail round (headers at the op's seq, c_.seq).
void CudaBackend::session_signal(uint64_t enter_seq, uint64_t value, Phase phase) {
  const char* op = phase == kPhaseSessionOpen ? "session open" : "session close";
  check_rails(op);
  translating(rank(), [&] {
    kargs::SignalArgs s;
    s.r = rank_args(enter_seq != 0 ? enter_seq : c_.seq);
    s.ring = all_ring();
    s.phase = phase;
    if (enter_seq != 0) {
      s.array = kws_.enter;
      s.value = enter_seq;
      launch_->signal(stream_, s);
    }
    s.array = kws_.session;
    s.value = value;
    launch_->signal(stream_, s);
    rail_round(c_.seq);
  });
  wait_stream(WaitSite{phase, -1, "session"});
  check_rail_headers(c_.seq, 0, op, phase);
}

void CudaBackend::session_gather_parts(uint64_t seq, int64_t region, int64_t bytes) {
  const int W = world();
  const int64_t mine = region + int64_t(rank()) * bytes;
  put(rank_args(seq), mem_.window() + CUdeviceptr(mine), 0, bytes, mine, kargs::Ring{1, W - 1, 1, W - 1}, false, kPhaseSessionGather);
}

void CudaBackend::session_scatter(uint64_t seq, CUdeviceptr src, CUdeviceptr, int64_t chunk, int64_t region) {
  const int W = world();
  put(rank_args(seq), src, chunk, chunk, region + int64_t(rank()) * chunk, kargs::Ring{0, W, 1, W - 1}, false, kPhaseSessionReduce);
}

void CudaBackend::session_all_gather(uint64_t seq, Mem in, int64_t bytes, int64_t at, Mem out) {
  check_rails("session allGather");
  const int W = world();
  const int64_t region = c_.ws.bytes + at;                // window offset of this collective's region
  const int64_t mine = region + int64_t(rank()) * bytes;  // my part, in every rank's window
  translating(rank(), [&] {
    // My part goes straight into my own slot of the region; from there to every peer's.
    if (bytes > 0) {
      if (in.device) RF_CU(cuMemcpyAsync, mem_.window() + CUdeviceptr(mine), dev(in.ptr), size_t(bytes), stream_);
      else from_host(mem_.window() + CUdeviceptr(mine), in.ptr, bytes);
    }
    session_gather_parts(seq, region, bytes);
    if (out.device && bytes > 0)
      RF_CU(cuMemcpyAsync, dev(out.ptr), mem_.window() + CUdeviceptr(region), size_t(bytes * W), stream_);
  });
  if (out.device) return;
  wait_stream(WaitSite{kPhaseSessionGather, -1, "done"});
  check_rail_headers(seq, bytes, "session allGather", kPhaseSessionGather);
  if (bytes > 0)
    translating(rank(), [&] { RF_CU(cuMemcpyDtoH, out.ptr, mem_.window() + CUdeviceptr(region), size_t(bytes * W)); });
}

void CudaBackend::session_reduce_scatter(uint64_t seq, Mem in, int64_t n, bool bf16, int64_t at, Mem out) {
  check_rails("session reduceScatter");
  const int W = world();
  const int64_t chunk = n * (bf16 ? 2 : 4);
  const int64_t region = c_.ws.bytes + at;
  translating(rank(), [&] {
    // My W chunks on the device (staged when they come from the host); chunk q goes to rank q's
    // region at my rank's slot. Behind the staged output: what other nodes send (scatter_recv_bytes).
    const int64_t across = scatter_recv_bytes(chunk);
    const CUdeviceptr stage = staging(chunk * W + chunk + across);
    CUdeviceptr src = dev(in.ptr);
    if (!in.device || (src & 15) != 0) {
      if (chunk > 0) {
        if (in.device) RF_CU(cuMemcpyAsync, stage, src, size_t(chunk * W), stream_);
        else from_host(stage, in.ptr, chunk * W);
      }
      src = stage;
    }
    session_scatter(seq, src, across > 0 ? stage + CUdeviceptr(chunk * W + chunk) : 0, chunk, region);
    kargs::ReduceArgs r;
    r.region = reinterpret_cast<const void*>(mem_.window() + CUdeviceptr(region));
    r.n = n;
    r.world = W;
    r.bf16 = bf16 ? 1 : 0;
    r.out = out.device ? out.ptr : reinterpret_cast<void*>(stage + CUdeviceptr(chunk * W));
    launch_->reduce(stream_, r);
  });
  if (out.device) return;
  wait_stream(WaitSite{kPhaseSessionReduce, -1, "done"});
  check_rail_headers(seq, chunk * c_.nodes.ranks_per_node, "session reduceScatter", kPhaseSessionReduce);
  if (chunk > 0) translating(rank(), [&] { RF_CU(cuMemcpyDtoH, out.ptr, stage_ + CUdeviceptr(chunk * W), size_t(chunk)); });
}

// In two levels over the node (only its ranks read my host segment), then the rail round.
void CudaBackend::engram_write(uint64_t seq, Mem table, int64_t bytes) {
  check_rails("engramWrite");
  translating(rank(), [&] {
    kargs::SignalArgs s;
    s.r = rank_args(seq);
    s.ring = all_ring();
    // Peers may still be fetching from the previous table: overwrite only once all of them moved on.
    s.array = kws_.enter;
    s.value = seq;
    s.phase = kPhaseEnter;
    launch_->signal(stream_, s);
    if (bytes > 0) {
      if (table.device) RF_CU(cuMemcpyAsync, mem_.host_segment(rank()), dev(table.ptr), size_t(bytes), stream_);
      else from_host(mem_.host_segment(rank()), table.ptr, bytes);
    }
    s.array = kws_.done;
    s.phase = kPhaseEngram;
    launch_->signal(stream_, s);
    rail_round(seq);
  });
  wait_stream(WaitSite{kPhaseEngram, -1, "done"});
  check_rail_headers(seq, 0, "engramWrite", kPhaseEngram);
}

void CudaBackend::engram_fetch(Mem ids, int64_t n, int64_t entries, int64_t row_bytes, Mem out) {
  if (n == 0) return;
  const int64_t ids_bytes = align_up(n * 4, kRegionAlignment);
  translating(rank(), [&] {
    const CUdeviceptr stage = staging(ids_bytes + (out.device ? 0 : n * row_bytes));
    CUdeviceptr id = dev(ids.ptr);
    if (!ids.device) {
      from_host(stage, ids.ptr, n * 4);
      id = stage;
    }
    kargs::FetchArgs f;
    f.segments = reinterpret_cast<const uint64_t*>(segments_);
    f.ids = reinterpret_cast<const int32_t*>(id);
    f.n = n;
    f.entries = entries;
    f.row_bytes = row_bytes;
    f.out = out.device ? out.as<uint8_t>() : reinterpret_cast<uint8_t*>(stage + CUdeviceptr(ids_bytes));
    launch_->engram_fetch(stream_, f);
  });
  if (out.device) return;
  wait_stream(WaitSite{kPhaseEngram, -1, "fetch"});
  translating(rank(), [&] { RF_CU(cuMemcpyDtoH, out.ptr, stage_ + CUdeviceptr(ids_bytes), size_t(n * row_bytes)); });
}

void CudaBackend::pp_hop(uint64_t seq, CUdeviceptr src, CUdeviceptr, int64_t bytes, int64_t at) {
  put(rank_args(seq), src, 0, bytes, at, kargs::Ring{1, 1, 1, 1}, true, kPhasePipeline);
}

void CudaBackend::pp_exchange(uint64_t seq, Mem in, int64_t bytes, Mem out) {
  check_rails("ppExchange");
  const int64_t at = c_.ws.bytes;
  // Where the hop receives (two levels: the node's last rank, the previous node's part) behind the staged input.
  const int64_t padded = align_up(std::max<int64_t>(bytes, 16), 16), across = pp_recv_bytes(padded);
  translating(rank(), [&] {
    const CUdeviceptr recv = across > 0 ? staging(padded + across) + CUdeviceptr(padded) : 0;
    CUdeviceptr src = dev(in.ptr);
    if (!in.device || (src & 15) != 0 || bytes % 16 != 0) {
      const CUdeviceptr stage = staging(bytes);
      if (bytes > 0) {
        if (in.device) RF_CU(cuMemcpyAsync, stage, src, size_t(bytes), stream_);
        else from_host(stage, in.ptr, bytes);
      }
      src = stage;
    }
    if (world() == 1) {
      if (bytes > 0) RF_CU(cuMemcpyAsync, mem_.window() + CUdeviceptr(at), src, size_t(bytes), stream_);
    } else {
      pp_hop(seq, src, recv, bytes, at);
    }
    if (out.device && bytes > 0) RF_CU(cuMemcpyAsync, dev(out.ptr), mem_.window() + CUdeviceptr(at), size_t(bytes), stream_);
  });
  if (out.device) return;
  wait_stream(WaitSite{kPhasePipeline, -1, "done"});
  if (across > 0) check_rail_headers(seq, bytes, "ppExchange", kPhasePipeline);  // the hop that crossed
  if (bytes > 0) translating(rank(), [&] { RF_CU(cuMemcpyDtoH, out.ptr, mem_.window() + CUdeviceptr(at), size_t(bytes)); });
}

}  // namespace rankflow::cuda
