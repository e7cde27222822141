// The host backend's lifecycle, its protocol steps (signals, waits, enter), barrier and allGather.
#include "backend.hpp"

#include <cstring>

#include "two_level.hpp"

namespace rankflow {

// A world of one node runs the node's protocol; one of several nodes, the two-level layer over it.
std::unique_ptr<Backend> make_host_backend(Context& c) {
  if (c.nodes.two_level()) return std::make_unique<host::HostTwoLevel>(c);
  return std::make_unique<host::HostBackend>(c);
}

namespace host {

HostBackend::HostBackend(Context& c) : c_(c) {
  // Many ranks share few cores here: a short spin, then the wait gives the core away.
  c.rules.spin_ns = 1000;
  c.rules.device_is_cpu = true;
  mem_.create(c.rank(), c.world(), c.sym_bytes, c.cpu_bytes, choose_memory_kind(c.cpu_bytes, c.cfg.hybrid),
              c.dom.num_scaleup_ranks);
  set_live(all_ranks_mask(c.world()), 0);  // every rank serves (elastic groups change it: membership.cc)
}

void HostBackend::destroy() noexcept {
  fetcher_.reset();  // runs the fetches still queued (they read the mapped segments), then joins
  mem_.destroy();
}

int HostBackend::scaleout_listen(const std::string&) {
  throw Error("EINVAL", "scale-out: this rank's world has one node (no scale-out leg to open)");
}

void HostBackend::scaleout_connect(const std::vector<ScaleoutEndpoint>&, const RailKey&, double) {
  throw Error("EINVAL", "scale-out: this rank's world has one node (no scale-out leg to connect)");
}

void HostBackend::import_peers(const std::vector<ExportedSegments>& peers, uint64_t seq) {
  mem_.import_peers(peers, 0, -1, live_mask());
  barrier(seq, false, true);
}

BackendInfo HostBackend::info() const {
  BackendInfo i;
  i.backend = "host";
  i.memory_kind = mem_.kind();
  i.stride = mem_.stride();
  for (int p = 0; p < world(); ++p) i.windows.push_back(uint64_t(reinterpret_cast<uintptr_t>(mem_.peer_window(p))));
  return i;
}

void HostBackend::read_window(int64_t offset, int64_t len, uint8_t* out) {
  std::memcpy(out, mem_.window() + offset, size_t(len));
}

uint64_t HostBackend::write_peer(int peer, int64_t offset, const uint8_t* src, int64_t len) {
  uint8_t* dst = mem_.translate(mem_.window() + offset, peer);
  std::memcpy(dst, src, size_t(len));
  return uint64_t(reinterpret_cast<uintptr_t>(dst));
}

const uint8_t* HostBackend::host_ptr(Mem r, const char* what) {
  RF_CHECK(!r.device, "EINVAL", std::string(what) + ": device tensors need backend 'cuda'");
  return r.as<const uint8_t>();
}

const uint8_t* HostBackend::host_io(Mem in, Mem out, const char* op) {
  const uint8_t* src = host_ptr(in, (std::string(op) + " input").c_str());
  RF_CHECK(!out.device, "EINVAL", std::string(op) + " output: device tensors need backend 'cuda'");
  return src;
}

void HostBackend::signal_all(int64_t array, uint64_t seq, bool include_self) {
  for (int p = 0; p < world(); ++p)
    if ((include_self || p != rank()) && live(p)) signal(peer_slot(p, array), seq);
}

uint64_t HostBackend::wait_slot(const void* slot, uint64_t seq, const WaitSite& site, WaitKind kind, bool exact) const {
  wait_until(c_.rules, site, kind, [&] {
    const uint64_t s = slot_seq(slot);
    return exact ? s == seq : seq_reached(s, seq);
  }, [&] { return slot_seq(slot); });
  return slot_payload(slot);
}

void HostBackend::wait_all(int64_t array, uint64_t seq, Phase phase, const char* name, WaitKind kind, uint64_t op) const {
  for (int p = 0; p < world(); ++p)
    if (p != rank() && live(p)) wait_slot(my_slot(array, p), seq, WaitSite{phase, p, name, -1, op}, kind);
}

void HostBackend::announce(uint64_t seq, uint64_t tag) {
  for (int p = 0; p < world(); ++p)
    if (p != rank() && live(p)) signal(peer_slot(p, c_.ws.enter), seq, 0, tag);
}

uint64_t HostBackend::wait_entered(int p, uint64_t seq, Phase phase) const {
  if (p == rank() || !live(p)) return 0;
  const void* slot = my_slot(c_.ws.enter, p);
  wait_slot(slot, seq, WaitSite{phase, p, "enter"}, WaitKind::Device);
  return slot_tag(slot);
}

void HostBackend::barrier(uint64_t seq, bool cpu_round, bool) {
  signal_all(c_.ws.barrier, seq);
  wait_all(c_.ws.barrier, seq, kPhaseBarrier, "barrier");
  if (!cpu_round) return;
  // DeepEP's with_cpu_sync: after the device round (same seq), a rendezvous the CPUs wait on.
  signal_all(c_.ws.cpu_barrier, seq);
  wait_all(c_.ws.cpu_barrier, seq, kPhaseCpuBarrier, "cpu_barrier", WaitKind::Cpu);
}

void HostBackend::all_gather(uint64_t seq, Mem in, int64_t bytes, Mem out) {
  const uint8_t* src = host_io(in, out, "allGather");
  announce(seq);
  const int64_t at = int64_t(rank()) * bytes;
  std::memcpy(buffer() + at, src, size_t(bytes));
  const uint64_t mask = live_mask();
  for (int i = 1; i < world(); ++i) {  // start at the next rank so that no receiver is hit by everyone first
    const int p = (rank() + i) % world();
    if (!rank_live(mask, p)) continue;
    wait_entered(p, seq);
    std::memcpy(peer_buffer(p) + at, src, size_t(bytes));
    signal(peer_slot(p, c_.ws.done), seq);
  }
  c_.traffic.up(bytes * (__builtin_popcountll(mask) - 1));
  wait_all(c_.ws.done, seq, kPhaseAllGather, "done");
  // A rank that left sent nothing: its part is zeros (what sits in the buffer there is an older op's).
  for (int p = 0; p < world(); ++p)
    if (rank_live(mask, p)) std::memcpy(out.as<uint8_t>() + p * bytes, buffer() + p * bytes, size_t(bytes));
    else std::memset(out.as<uint8_t>() + p * bytes, 0, size_t(bytes));
}

}  // namespace host
}  // namespace rankflow
