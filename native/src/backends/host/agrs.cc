// AGRS sessions, engram and pipeline send/recv on the host executor (seed 6.3).
#include <cstring>
#include <vector>

#include "backend.hpp"
#include "runtime/peer_reduce.hpp"

namespace rankflow::host {

void HostBackend::session_signal(uint64_t enter_seq, uint64_t value, Phase phase) {
  if (enter_seq != 0) {
    // The buffer may still hold data a slow peer reads for the previous op: wait until all entered.
    announce(enter_seq);
    for (int p = 0; p < world(); ++p) wait_entered(p, enter_seq, phase);
  }
  signal_all(c_.ws.session, value);
  wait_all(c_.ws.session, value, phase, "session");
}

void HostBackend::session_all_gather(uint64_t seq, Mem in, int64_t bytes, int64_t at, Mem out) {
  const uint8_t* src = host_io(in, out, "allGather");
  const int64_t mine = at + int64_t(rank()) * bytes;
  std::memcpy(buffer() + mine, src, size_t(bytes));
  for (int i = 1; i < world(); ++i) {
    const int p = (rank() + i) % world();
    std::memcpy(peer_buffer(p) + mine, src, size_t(bytes));
    signal(peer_slot(p, c_.ws.done), seq);
  }
  c_.traffic.up(bytes * (world() - 1));
  wait_all(c_.ws.done, seq, kPhaseSessionGather, "done");
  std::memcpy(out.ptr, buffer() + at, size_t(bytes * world()));
}

void HostBackend::session_reduce_scatter(uint64_t seq, Mem in, int64_t n, bool bf16, int64_t at, Mem out) {
  const uint8_t* src = host_io(in, out, "reduceScatter");
  const int64_t chunk = n * (bf16 ? 2 : 4);
  // Chunk q of my input goes to rank q, at my rank's slot of its region.
  for (int i = 0; i < world(); ++i) {
    const int q = (rank() + i) % world();
    uint8_t* dst = (q == rank() ? buffer() : peer_buffer(q)) + at + int64_t(rank()) * chunk;
    std::memcpy(dst, src + int64_t(q) * chunk, size_t(chunk));
    if (q != rank()) signal(peer_slot(q, c_.ws.done), seq);
  }
  c_.traffic.up(chunk * (world() - 1));
  wait_all(c_.ws.done, seq, kPhaseSessionReduce, "done");
  reduce_region(buffer() + at, n, bf16, out);
}

// out[i] = the sum over ranks q, in rank order, of region slot q's element i (fp32 accumulation).
void HostBackend::reduce_region(const uint8_t* region, int64_t n, bool bf16, Mem out) const {
  sum_in_rank_order(consecutive_parts(region, world(), n, bf16), 0, n, bf16, out.as<uint8_t>());
}

// Peer reduce as rf_peer_reduce does it, through the windows: my input into my buffer at 0, an enter
// round tagged with (n, dtype), my slice of every rank's input summed in rank order into every rank's
// buffer at `sums`, a done round, then my buffer's sums out.
void HostBackend::reduce_peers(uint64_t seq, Mem in, Mem out, int64_t n, bool bf16) {
  const uint8_t* src = host_ptr(in, "input");
  RF_CHECK(!out.device, "EINVAL", "output: device tensors need backend 'cuda'");
  const int W = world();
  const int64_t elem = bf16 ? 2 : 4, bytes = n * elem, sums = align_up(bytes, kRegionAlignment);
  const uint64_t tag = peer_reduce_tag(n, bf16);
  std::memmove(buffer(), src, size_t(bytes));
  announce(seq, tag);
  int refused = -1;
  for (int p = 0; p < W; ++p)
    if (p != rank() && wait_entered(p, seq) != tag) refused = p;
  if (refused < 0) {
    // My slice's sums into my buffer, then from there into every peer's.
    int64_t lo = 0, hi = 0;
    peer_reduce_slice(n, W, rank(), &lo, &hi);
    std::vector<const uint8_t*> parts;
    for (int q = 0; q < W; ++q) parts.push_back(q == rank() ? buffer() : peer_buffer(q));
    sum_in_rank_order(parts, lo, hi, bf16, buffer() + sums);
    for (int q = 0; q < W; ++q)
      if (q != rank()) std::memcpy(peer_buffer(q) + sums + lo * elem, buffer() + sums + lo * elem, size_t((hi - lo) * elem));
    c_.traffic.up((hi - lo) * elem * (W - 1));
  }
  signal_all(c_.ws.done, seq);
  wait_all(c_.ws.done, seq, kPhasePeerReduce, "done");
  if (refused >= 0)
    throw peer_shape_error(refused, rank(), "(" + std::to_string(n) + (bf16 ? " bf16" : " fp32") + " elements) in op #" + std::to_string(seq) +
                                                ": every rank must pass the same shape and dtype (nothing moved)");
  std::memcpy(out.ptr, buffer() + sums, size_t(bytes));
}

void HostBackend::engram_write(uint64_t seq, Mem table, int64_t bytes) {
  const uint8_t* src = host_ptr(table, "engram table");
  // Peers may still be fetching from the previous table: overwrite only once all of them moved on.
  announce(seq);
  for (int p = 0; p < world(); ++p) wait_entered(p, seq);
  std::memcpy(mem_.host_segment(rank()), src, size_t(bytes));
  signal_all(c_.ws.done, seq);
  wait_all(c_.ws.done, seq, kPhaseEngram, "done");
}

void HostBackend::engram_fetch(Mem ids, int64_t n, int64_t entries, int64_t row_bytes, Mem out) {
  const auto* id = reinterpret_cast<const int32_t*>(host_ptr(ids, "indices"));
  RF_CHECK(!out.device, "EINVAL", "engramFetch output: device tensors need backend 'cuda'");
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = id[i];
    const uint8_t* row = mem_.host_segment(int(g / entries)) + (g % entries) * row_bytes;
    std::memcpy(out.as<uint8_t>() + i * row_bytes, row, size_t(row_bytes));
  }
}

void HostBackend::pp_exchange(uint64_t seq, Mem in, int64_t bytes, Mem out) {
  const uint8_t* src = host_io(in, out, "ppExchange");
  if (world() == 1) {
    std::memcpy(out.ptr, src, size_t(bytes));
    return;
  }
  const int next = (rank() + 1) % world(), prev = (rank() + world() - 1) % world();
  // Only the previous rank writes into my buffer: tell it, and only wait for my next rank.
  signal(peer_slot(prev, c_.ws.enter), seq);
  wait_entered(next, seq);
  std::memcpy(peer_buffer(next), src, size_t(bytes));
  c_.traffic.up(bytes);
  signal(peer_slot(next, c_.ws.done), seq);
  wait_slot(my_slot(c_.ws.done, prev), seq, WaitSite{kPhasePipeline, prev, "done"}, WaitKind::Device);
  std::memcpy(out.ptr, buffer(), size_t(bytes));
}

}  // namespace rankflow::host
