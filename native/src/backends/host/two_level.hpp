// The two-level layer of the host backend: a world whose nodes share no memory (scale_out with more
// than one node). It is the node's protocol (HostBackend, whose windows it maps for the node's ranks
// only) plus the rank's rail connections to the ranks of its local index on the other nodes
// (rail.cc, rail_connect.cc), and it runs every op of the world in two levels: inside the node
// through the shared windows, across nodes over the rails. Every result is the flat one, bit for bit.
// two_level.cc: lifecycle, barrier, allGather, sessions, engram, pipeline; two_level_moe.cc:
// dispatch; two_level_combine.cc: combine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"

namespace rankflow::host {

class HostTwoLevel final : public HostBackend {
 public:
  explicit HostTwoLevel(Context& c);
  ~HostTwoLevel() override { destroy(); }

  void destroy() noexcept override;
  void check_alive(const char* op) const override;
  void recover() override;
  int scaleout_listen(const std::string& host) override;
  void scaleout_connect(const std::vector<ScaleoutEndpoint>& ends, const RailKey& key, double timeout_s) override;
  void import_peers(const std::vector<ExportedSegments>& peers, uint64_t seq) override;

  void barrier(uint64_t seq, bool cpu_round, bool wait) override;
  void all_gather(uint64_t seq, Mem in, int64_t bytes, Mem out) override;
  void dispatch_notify(uint64_t seq, DispatchLayout& l, const DispatchInput& in) override;
  void adopt_routing(DispatchLayout& l, const DispatchLayout& from, bool new_weights) override;
  void dispatch_data(uint64_t seq, DispatchLayout& l, const DispatchInput& in, DispatchOutput& out) override;
  void combine(uint64_t seq, DispatchLayout& l, const CombineInput& in, const CombineOutput& out) override;
  void session_signal(uint64_t enter_seq, uint64_t value, Phase phase) override;
  void session_all_gather(uint64_t seq, Mem in, int64_t bytes, int64_t at, Mem out) override;
  void session_reduce_scatter(uint64_t seq, Mem in, int64_t n, bool bf16, int64_t at, Mem out) override;
  // Refused: across nodes the runtime composes the peer reduce from allGather (runtime/ops/).
  void reduce_peers(uint64_t seq, Mem in, Mem out, int64_t n, bool bf16) override;
  void engram_write(uint64_t seq, Mem table, int64_t bytes) override;
  void pp_exchange(uint64_t seq, Mem in, int64_t bytes, Mem out) override;
  // A session collective across nodes runs whole at issue (the rail rounds are synchronous): its
  // result in its region; complete() has nothing left to wait for.
  void agrs_issue(AgrsOp& op) override;
  void agrs_complete(AgrsOp& op) override;

 private:
  int local_rank(int j) const { return c_.nodes.rank_of(c_.nodes.node, j); }
  // The intra-node halves of signal_all / wait_all / announce.
  void signal_locals(int64_t array, uint64_t seq);
  void wait_locals(int64_t array, uint64_t seq, Phase phase, const char* name, WaitKind kind = WaitKind::Device) const;
  void announce_locals(uint64_t seq, uint64_t tag = 0);
  // An empty frame to and from every rail peer: after it, every node has passed what came before.
  void rail_sync(uint64_t seq, Phase phase, WaitKind kind);
  // allGather (enter: outside a session) and the session's (at: its region); reduceScatter.
  void gather(uint64_t seq, const uint8_t* src, int64_t bytes, int64_t at, bool enter, Phase phase, uint8_t* out);
  void reduce_scatter(uint64_t seq, const uint8_t* src, int64_t n, bool bf16, int64_t at, Mem out);
  // two_level_moe.cc, two_level_combine.cc
  void exchange_records(uint64_t seq, Phase phase, DispatchLayout& l, const DispatchInput& in, bool forward_counts);
  void combine_rows(uint64_t seq, DispatchLayout& l, const CombineSources& in, const CombineOutput& out);

  std::unique_ptr<Rails> rails_;  // the scale-out leg
};

}  // namespace rankflow::host
