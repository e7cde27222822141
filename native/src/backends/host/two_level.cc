// The host backend's collectives in a world whose nodes share no memory, in two levels: inside the
// node through the shared windows (the flat protocol restricted to the node's ranks), across nodes
// over the rank's rail connections (rail.cc), where a rank talks only to the ranks of its own local
// index. Every result is the flat one, bit for bit: data lands in the same slots of the same buffers,
// and every sum is taken in the same order.
//   barrier        : the node's barrier, then an empty frame to and from every rail peer; each of those
//                    was sent after its node's barrier, so every rank of the world has arrived.
//   allGather      : my part to my rail peers and theirs to me (one copy of each part crosses to each
//                    node), then every part this rank holds into every node peer's buffer.
//   reduceScatter  : the chunks for node k's ranks to my rail peer there, which writes them into their
//                    regions with its own; every rank then sums its W slots in rank order, as flat.
//   session open/close, engram write: the node's rounds, then a rail round.
//   async session collectives: run whole at issue (the rail rounds are synchronous), results in
//                    their regions (a reduceScatter's sums at the region's start, as flat).
//   pipeline       : a hop inside the node as flat; the hop from the node's last rank to the next
//                    node's first goes over the rail of local index R-1, whose rank there forwards it.
#include <cstring>

#include "two_level.hpp"

namespace rankflow::host {

HostTwoLevel::HostTwoLevel(Context& c) : HostBackend(c), rails_(std::make_unique<Rails>(c)) {}

void HostTwoLevel::destroy() noexcept {
  rails_->close();
  HostBackend::destroy();
}

void HostTwoLevel::check_alive(const char* op) const { rails_->check_alive(op); }

// A released op may have left part of a frame in a scale-out connection (the next op would read it
// as its own): after a release the rank cannot go on, on every rank alike.
void HostTwoLevel::recover() {
  check_alive("recover");
  if (c_.abort.released_above() != 0) {
    rails_->close();
    throw Error("RANK_FAILED",
                "rank " + std::to_string(rank()) + " cannot be put back in step after a released run: its world's nodes share no "
                "memory, and a released op may have left part of a frame in a scale-out connection; make the group again",
                rank());
  }
}

int HostTwoLevel::scaleout_listen(const std::string& host) { return rails_->listen(host); }

void HostTwoLevel::scaleout_connect(const std::vector<ScaleoutEndpoint>& ends, const RailKey& key, double timeout_s) {
  rails_->connect(ends, key, timeout_s);
}

// Only the node's ranks' windows are mapped (the others' memory is on other machines).
void HostTwoLevel::import_peers(const std::vector<ExportedSegments>& peers, uint64_t seq) {
  RF_CHECK(rails_->connected(), "STATE", "registerWindow: the scale-out connections must be made first (scaleoutConnect)");
  mem_.import_peers(peers, c_.nodes.first_local(), c_.nodes.ranks_per_node);
  barrier(seq, false, true);
}

void HostTwoLevel::signal_locals(int64_t array, uint64_t seq) {
  for (int j = 0; j < c_.nodes.ranks_per_node; ++j)
    if (local_rank(j) != rank()) signal(peer_slot(local_rank(j), array), seq);
}

void HostTwoLevel::wait_locals(int64_t array, uint64_t seq, Phase phase, const char* name, WaitKind kind) const {
  for (int j = 0; j < c_.nodes.ranks_per_node; ++j) {
    const int p = local_rank(j);
    if (p != rank()) wait_slot(my_slot(array, p), seq, WaitSite{phase, p, name}, kind);
  }
}

void HostTwoLevel::announce_locals(uint64_t seq, uint64_t tag) {
  for (int j = 0; j < c_.nodes.ranks_per_node; ++j)
    if (local_rank(j) != rank()) signal(peer_slot(local_rank(j), c_.ws.enter), seq, 0, tag);
}

void HostTwoLevel::rail_sync(uint64_t seq, Phase phase, WaitKind kind) {
  std::vector<RailSend> sends;
  std::vector<RailRecv> recvs;
  for (int k = 0; k < c_.nodes.num_nodes; ++k) {
    if (k == c_.nodes.node) continue;
    sends.push_back({k, nullptr, 0});
    recvs.push_back({k, 0, {}});
  }
  rails_->exchange(seq, phase, 0, sends, recvs, kind);
}

void HostTwoLevel::barrier(uint64_t seq, bool cpu_round, bool) {
  signal_locals(c_.ws.barrier, seq);
  wait_locals(c_.ws.barrier, seq, kPhaseBarrier, "barrier");
  rail_sync(seq, kPhaseBarrier, WaitKind::Device);
  if (!cpu_round) return;
  signal_locals(c_.ws.cpu_barrier, seq);
  wait_locals(c_.ws.cpu_barrier, seq, kPhaseCpuBarrier, "cpu_barrier", WaitKind::Cpu);
  rail_sync(seq, kPhaseCpuBarrier, WaitKind::Cpu);
}

// allGather (enter: outside a session, where the buffer must be free first) and the session's
// allGather (at: its region; no enter round: every session collective has a fresh region).
void HostTwoLevel::gather(uint64_t seq, const uint8_t* src, int64_t bytes, int64_t at, bool enter, Phase phase, uint8_t* out) {
  const Nodes& nd = c_.nodes;
  if (enter) announce_locals(seq);
  std::vector<RailSend> sends;
  std::vector<RailRecv> recvs;
  for (int k = 0; k < nd.num_nodes; ++k) {
    if (k == nd.node) continue;
    sends.push_back({k, src, bytes});
    recvs.push_back({k, bytes, {}});
  }
  rails_->exchange(seq, phase, 0, sends, recvs, WaitKind::Device);
  // The parts of my rail: mine and what my rail peers sent; each goes to its rank's slot everywhere.
  std::vector<const uint8_t*> part(size_t(nd.num_nodes), src);
  for (const RailRecv& r : recvs) {
    RF_CHECK(int64_t(r.data.size()) == bytes, "EINVAL",
             "allGather: rank " + std::to_string(nd.rail_peer(r.node)) + " gave " + std::to_string(r.data.size()) +
                 " bytes, rank " + std::to_string(rank()) + " " + std::to_string(bytes) + ": every rank must give the same size");
    part[size_t(r.node)] = r.data.data();
  }
  for (int j = 0; j < nd.ranks_per_node; ++j) {
    const int p = local_rank((nd.local + j) % nd.ranks_per_node);  // the next rank first, as flat
    if (enter) wait_entered(p, seq);
    uint8_t* dst = (p == rank() ? buffer() : peer_buffer(p)) + at;
    for (int k = 0; k < nd.num_nodes; ++k) {
      uint8_t* slot = dst + int64_t(nd.rail_peer(k)) * bytes;
      if (slot != part[size_t(k)]) std::memcpy(slot, part[size_t(k)], size_t(bytes));  // in place: my slot holds it
    }
    if (p != rank()) {
      c_.traffic.up(bytes * nd.num_nodes);
      signal(peer_slot(p, c_.ws.done), seq);
    }
  }
  wait_locals(c_.ws.done, seq, phase, "done");
  if (out != buffer() + at) std::memcpy(out, buffer() + at, size_t(bytes * world()));
}

void HostTwoLevel::all_gather(uint64_t seq, Mem in, int64_t bytes, Mem out) {
  gather(seq, host_io(in, out, "allGather"), bytes, 0, true, kPhaseAllGather, out.as<uint8_t>());
}

void HostTwoLevel::session_all_gather(uint64_t seq, Mem in, int64_t bytes, int64_t at, Mem out) {
  gather(seq, host_io(in, out, "allGather"), bytes, at, false, kPhaseSessionGather, out.as<uint8_t>());
}

void HostTwoLevel::session_reduce_scatter(uint64_t seq, Mem in, int64_t n, bool bf16, int64_t at, Mem out) {
  reduce_scatter(seq, host_io(in, out, "reduceScatter"), n, bf16, at, out);
}

void HostTwoLevel::agrs_issue(AgrsOp& op) {
  const uint8_t* src = host_ptr(op.in, op.reduce ? "reduceScatter input" : "allGather input");
  if (op.reduce) reduce_scatter(op.seq, src, op.n, op.bf16, op.at, Mem{buffer() + op.at, false});
  else gather(op.seq, src, op.bytes, op.at, false, kPhaseSessionGather, buffer() + op.at);
}

void HostTwoLevel::agrs_complete(AgrsOp&) {}

void HostTwoLevel::reduce_peers(uint64_t, Mem, Mem, int64_t, bool) {
  throw Error("STATE", "peer reduce runs within one node (the runtime composes it across nodes)");
}

void HostTwoLevel::session_signal(uint64_t enter_seq, uint64_t value, Phase phase) {
  if (enter_seq != 0) {
    announce_locals(enter_seq);
    for (int j = 0; j < c_.nodes.ranks_per_node; ++j) wait_entered(local_rank(j), enter_seq, phase);
  }
  signal_locals(c_.ws.session, value);
  wait_locals(c_.ws.session, value, phase, "session");
  // The session's slots carry its index, not an op's seq: the rail round names the index.
  rail_sync(value, phase, WaitKind::Device);
}

void HostTwoLevel::reduce_scatter(uint64_t seq, const uint8_t* src, int64_t n, bool bf16, int64_t at, Mem out) {
  const Nodes& nd = c_.nodes;
  const int64_t chunk = n * (bf16 ? 2 : 4), R = nd.ranks_per_node;
  // My chunks for node k's ranks are contiguous in my input: ranks k*R .. k*R + R - 1.
  std::vector<RailSend> sends;
  std::vector<RailRecv> recvs;
  for (int k = 0; k < nd.num_nodes; ++k) {
    if (k == nd.node) continue;
    sends.push_back({k, src + int64_t(nd.rank_of(k, 0)) * chunk, R * chunk});
    recvs.push_back({k, R * chunk, {}});
  }
  rails_->exchange(seq, kPhaseSessionReduce, 0, sends, recvs, WaitKind::Device);
  for (const RailRecv& r : recvs)
    RF_CHECK(int64_t(r.data.size()) == R * chunk, "EINVAL",
             "reduceScatter: rank " + std::to_string(nd.rail_peer(r.node)) + " gave chunks of another size than rank " +
                 std::to_string(rank()) + ": every rank must give the same shape");
  // Into local rank j's region: my chunk for it at my slot, my rail peers' chunks for it at theirs.
  for (int i = 0; i < R; ++i) {
    const int j = int((nd.local + i) % R);
    const int q = local_rank(j);
    uint8_t* region = (q == rank() ? buffer() : peer_buffer(q)) + at;
    std::memcpy(region + int64_t(rank()) * chunk, src + int64_t(q) * chunk, size_t(chunk));
    for (const RailRecv& r : recvs)
      std::memcpy(region + int64_t(nd.rail_peer(r.node)) * chunk, r.data.data() + int64_t(j) * chunk, size_t(chunk));
    if (q != rank()) {
      c_.traffic.up(chunk * nd.num_nodes);
      signal(peer_slot(q, c_.ws.done), seq);
    }
  }
  wait_locals(c_.ws.done, seq, kPhaseSessionReduce, "done");
  reduce_region(buffer() + at, n, bf16, out);
}

void HostTwoLevel::engram_write(uint64_t seq, Mem table, int64_t bytes) {
  const uint8_t* src = host_ptr(table, "engram table");
  // Only this node's ranks read my host segment: they must have moved on from the previous table.
  announce_locals(seq);
  for (int j = 0; j < c_.nodes.ranks_per_node; ++j) wait_entered(local_rank(j), seq);
  std::memcpy(mem_.host_segment(rank()), src, size_t(bytes));
  signal_locals(c_.ws.done, seq);
  wait_locals(c_.ws.done, seq, kPhaseEngram, "done");
  rail_sync(seq, kPhaseEngram, WaitKind::Device);
}

void HostTwoLevel::pp_exchange(uint64_t seq, Mem in, int64_t bytes, Mem out_mem) {
  const uint8_t* src = host_io(in, out_mem, "ppExchange");
  uint8_t* out = out_mem.as<uint8_t>();
  const Nodes& nd = c_.nodes;
  const int R = nd.ranks_per_node, last = R - 1;
  const int next = (rank() + 1) % world(), prev = (rank() + world() - 1) % world();
  const int next_node = (nd.node + 1) % nd.num_nodes, prev_node = (nd.node + nd.num_nodes - 1) % nd.num_nodes;
  // The cross-node hop of the ring runs on rail `last`: (n, last) -> (n + 1, last) -> (n + 1, 0).
  std::vector<RailSend> sends;
  std::vector<RailRecv> recvs;
  if (nd.local == last) {
    sends.push_back({next_node, src, bytes});
    recvs.push_back({prev_node, bytes, {}});
    rails_->exchange(seq, kPhasePipeline, 0, sends, recvs, WaitKind::Device);
    RF_CHECK(int64_t(recvs[0].data.size()) == bytes, "EINVAL",
             "ppExchange: rank " + std::to_string(nd.rail_peer(prev_node)) + " sent another size than rank " + std::to_string(rank()));
  }
  if (R == 1) {  // every hop is a rail hop: what came is the previous rank's
    std::memcpy(out, recvs[0].data.data(), size_t(bytes));
    return;
  }
  // Who writes into my buffer: my previous rank, or for the node's first rank, the forwarder.
  const int writer = nd.local == 0 ? local_rank(last) : prev;
  signal(peer_slot(writer, c_.ws.enter), seq);
  if (nd.local == last) {
    // Forward the previous node's part to this node's first rank (its done slot names the source).
    const int first = local_rank(0);
    wait_entered(first, seq);
    std::memcpy(peer_buffer(first), recvs[0].data.data(), size_t(bytes));
    c_.traffic.up(bytes);
    signal(mem_.peer_window(first) + c_.ws.slot(c_.ws.done, prev_node * R + last), seq);
  } else {
    wait_entered(next, seq);
    std::memcpy(peer_buffer(next), src, size_t(bytes));
    c_.traffic.up(bytes);
    signal(peer_slot(next, c_.ws.done), seq);
  }
  wait_slot(my_slot(c_.ws.done, prev), seq, WaitSite{kPhasePipeline, prev, "done"}, WaitKind::Device);
  std::memcpy(out, buffer(), size_t(bytes));
}

}  // namespace rankflow::host
