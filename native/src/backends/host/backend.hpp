// The host backend: the reference executor of the protocol. Ranks' symmetric windows are shared host
// memory (memfd + mmap, HostSymmetricMemory), the "kernels" are C++ loops over them, the signals
// std::atomic-ordered stores into peers' workspaces, and every wait is the runtime's one wait (a
// device phase's wait times out with TIMEOUT_GPU, a CPU-sync wait with TIMEOUT_CPU). Ops run on the
// rank's own thread. backend.cc: lifecycle and the small collectives; moe.cc: dispatch and combine;
// agrs.cc: sessions, engram and pipeline; async.cc: asynchronous AGRS and engram fetches (these on an
// executor thread of the rank's own).
#pragma once

#include <memory>
#include <vector>

#include "runtime/context.hpp"
#include "runtime/executor.hpp"
#include "signals.hpp"
#include "symmetric.hpp"

namespace rankflow::host {

// The routing of one dispatch (shared by the cached dispatches that replay it) and what each
// dispatch keeps for combine.
struct Routing {
  std::vector<int32_t> topk_idx;    // [T * K] as given
  std::vector<uint64_t> dest_mask;  // [T] bit p set when rank p receives token t
  std::vector<int64_t> send_count;  // [W] tokens sent to rank p
};
struct HostLayout final : LayoutState {
  std::shared_ptr<const Routing> routing;
  std::vector<float> topk_weights;           // [T * K] as given (cached without weights: the origin's)
  std::vector<int32_t> recv_src_rank;        // [num_recv]
  std::vector<int32_t> recv_src_token;       // [num_recv]
  std::vector<float> recv_topk_weights;      // [num_recv * K]
};

class HostBackend final : public Backend {
 public:
  explicit HostBackend(Context& c);
  ~HostBackend() override { destroy(); }

  ExportedSegments exported() const override { return mem_.exported(); }
  void import_peers(const std::vector<ExportedSegments>& peers, uint64_t seq) override;
  BackendInfo info() const override;
  void read_window(int64_t offset, int64_t len, uint8_t* out) override;
  uint64_t write_peer(int peer, int64_t offset, const uint8_t* src, int64_t len) override;
  void destroy() noexcept override;

  void barrier(uint64_t seq, bool cpu_round, bool wait) override;
  void all_gather(uint64_t seq, Mem in, int64_t bytes, Mem out) override;
  void dispatch_notify(uint64_t seq, DispatchLayout& l, const DispatchInput& in) override;
  void adopt_routing(DispatchLayout& l, const DispatchLayout& from) override;
  bool dispatch_counts(DispatchLayout& l, bool block) override;
  void dispatch_data(uint64_t seq, DispatchLayout& l, const DispatchInput& in, DispatchOutput& out) override;
  void combine(uint64_t seq, DispatchLayout& l, const CombineInput& in, const CombineOutput& out) override;
  void session_signal(uint64_t enter_seq, uint64_t value, Phase phase) override;
  void session_all_gather(uint64_t seq, Mem in, int64_t bytes, int64_t at, Mem out) override;
  void session_reduce_scatter(uint64_t seq, Mem in, int64_t n, bool bf16, int64_t at, Mem out) override;
  void engram_write(uint64_t seq, Mem table, int64_t bytes) override;
  void engram_fetch(Mem ids, int64_t n, int64_t entries, int64_t row_bytes, Mem out) override;
  void pp_exchange(uint64_t seq, Mem in, int64_t bytes, Mem out) override;
  void agrs_issue(AgrsOp& op) override;
  void agrs_complete(AgrsOp& op) override;
  void engram_fetch_issue(FetchOp& op) override;
  void engram_fetch_complete(FetchOp& op) override;

 private:
  int rank() const { return c_.rank(); }
  int world() const { return c_.world(); }
  uint8_t* workspace() const { return mem_.window(); }
  uint8_t* buffer() const { return mem_.window() + c_.ws.bytes; }
  uint8_t* peer_buffer(int p) const { return mem_.peer_window(p) + c_.ws.bytes; }
  // My slot that rank `from` writes, and the slot of mine that peer p holds.
  void* my_slot(int64_t array, int from) const { return workspace() + c_.ws.slot(array, from); }
  void* peer_slot(int p, int64_t array) const { return mem_.peer_window(p) + c_.ws.slot(array, rank()); }

  // Protocol steps shared by every op.
  void signal_all(int64_t array, uint64_t seq, bool include_self = false);
  // Waits until the slot reached seq (exact: equals it and carries the op's payload); its payload.
  uint64_t wait_slot(const void* slot, uint64_t seq, const WaitSite& site, WaitKind kind, bool exact = false) const;
  void wait_all(int64_t array, uint64_t seq, Phase phase, const char* name, WaitKind kind = WaitKind::Device) const;
  void announce(uint64_t seq, uint64_t tag = 0);
  // Waits for peer p's enter of op seq; its tag.
  uint64_t wait_entered(int p, uint64_t seq, Phase phase = kPhaseEnter) const;
  static const uint8_t* host_ptr(Mem r, const char* what);

  Context& c_;
  HostSymmetricMemory mem_;
  std::unique_ptr<Executor> fetcher_;  // async engram fetches, made at the first one; stopped before mem_ goes
};

}  // namespace rankflow::host
