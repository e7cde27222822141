// The host backend: the reference executor of the protocol. Ranks' symmetric windows are shared host
// memory (memfd + mmap, HostSymmetricMemory), the "kernels" are C++ loops over them, the signals
// std::atomic-ordered stores into peers' workspaces, and every wait is the runtime's one wait (a
// device phase's wait times out with TIMEOUT_GPU, a CPU-sync wait with TIMEOUT_CPU). Ops run on the
// rank's own thread. backend.cc: lifecycle and the small collectives; moe.cc: dispatch and combine;
// agrs.cc: sessions, engram and pipeline; async.cc: asynchronous AGRS and engram fetches (these on an
// executor thread of the rank's own). This class is the protocol of one node: it never asks how many
// nodes there are. A world whose nodes share no memory (scale_out) gets HostTwoLevel (two_level.hpp)
// instead, the layer over it that runs each op in two levels.
#pragma once

#include <memory>
#include <vector>

#include "runtime/context.hpp"
#include "runtime/executor.hpp"
#include "rail.hpp"
#include "signals.hpp"
#include "symmetric.hpp"

namespace rankflow::host {

// The routing of one dispatch (shared by the cached dispatches that replay it) and what each
// dispatch keeps for combine.
struct Routing {
  std::vector<int32_t> topk_idx;    // [T * K] as given
  std::vector<uint64_t> dest_mask;  // [T] bit p set when rank p receives token t
  std::vector<int64_t> send_count;  // [W] tokens sent to rank p
  int64_t masked_slots = 0;         // slots dropped because their expert's rank left (elastic)
};
// A two-level dispatch's view of one rail: the tokens of source rank (k, my local index) that reached
// this node (for k = my node: all of my own tokens), in token order.
struct RailTokens {
  std::vector<int32_t> token;    // source token ids
  std::vector<uint64_t> nodes;   // the nodes that receive each (bit k)
  std::vector<uint64_t> locals;  // the ranks of this node that receive it (bit j: local index j)
  std::vector<int64_t> offset;   // where its record starts in the frame (remote sources)
};
// What a two-level dispatch keeps (two_level_moe.cc): the frames of token records its rank received
// from its rail peers (forwarded to the node's ranks in the data phase) and, for combine, the rail's
// tokens per source node.
struct TwoLevelState {
  int64_t record_bytes = 0;
  bool exchanged = false;              // the records crossed (in notify; a cached dispatch: in data)
  std::vector<RailRecv> frames;        // one per remote node
  std::vector<RailTokens> rail;        // [node]
  std::vector<std::string> refused;    // [node]: why that source's records are refused ("" = accepted)
};
// A combine's inputs as host pointers: the rows, their weights (the dispatch's where none are given)
// and the biases (null where absent).
struct CombineSources {
  const uint16_t* x;
  const float* weights;
  const uint16_t* bias[2];
};

struct HostLayout final : LayoutState {
  std::shared_ptr<const Routing> routing;
  std::unique_ptr<TwoLevelState> two;        // two-level dispatches only
  std::vector<float> topk_weights;           // [T * K] as given (cached without weights: the origin's)
  std::vector<int32_t> recv_src_rank;        // [num_recv]
  std::vector<int32_t> recv_src_token;       // [num_recv]
  std::vector<float> recv_topk_weights;      // [num_recv * K]
};

class HostBackend : public Backend {
 public:
  explicit HostBackend(Context& c);
  ~HostBackend() override { destroy(); }

  ExportedSegments exported() const override { return mem_.exported(); }
  void import_peers(const std::vector<ExportedSegments>& peers, uint64_t seq) override;
  BackendInfo info() const override;
  void read_window(int64_t offset, int64_t len, uint8_t* out) override;
  uint64_t write_peer(int peer, int64_t offset, const uint8_t* src, int64_t len) override;
  void destroy() noexcept override;
  int scaleout_listen(const std::string& host) override;
  void scaleout_connect(const std::vector<ScaleoutEndpoint>& ends, const RailKey& key, double timeout_s) override;

  void barrier(uint64_t seq, bool cpu_round, bool wait) override;
  void all_gather(uint64_t seq, Mem in, int64_t bytes, Mem out) override;
  void dispatch_notify(uint64_t seq, DispatchLayout& l, const DispatchInput& in) override;
  void adopt_routing(DispatchLayout& l, const DispatchLayout& from, bool new_weights) override;
  bool dispatch_counts(DispatchLayout& l, bool block) override;
  void dispatch_data(uint64_t seq, DispatchLayout& l, const DispatchInput& in, DispatchOutput& out) override;
  void combine(uint64_t seq, DispatchLayout& l, const CombineInput& in, const CombineOutput& out) override;
  void session_signal(uint64_t enter_seq, uint64_t value, Phase phase) override;
  void session_all_gather(uint64_t seq, Mem in, int64_t bytes, int64_t at, Mem out) override;
  void session_reduce_scatter(uint64_t seq, Mem in, int64_t n, bool bf16, int64_t at, Mem out) override;
  void reduce_peers(uint64_t seq, Mem in, Mem out, int64_t n, bool bf16) override;
  void engram_write(uint64_t seq, Mem table, int64_t bytes) override;
  void engram_fetch(Mem ids, int64_t n, int64_t entries, int64_t row_bytes, Mem out) override;
  void pp_exchange(uint64_t seq, Mem in, int64_t bytes, Mem out) override;
  void agrs_issue(AgrsOp& op) override;
  void agrs_complete(AgrsOp& op) override;
  void engram_fetch_issue(FetchOp& op) override;
  void engram_fetch_complete(FetchOp& op) override;
  void set_live(uint64_t mask, uint64_t epoch) override;
  void import_peer(int peer, const ExportedSegments& seg) override;

 protected:
  int rank() const { return c_.rank(); }
  int world() const { return c_.world(); }
  uint8_t* workspace() const { return mem_.window(); }
  uint8_t* buffer() const { return mem_.window() + c_.ws.bytes; }
  uint8_t* peer_buffer(int p) const { return mem_.peer_window(p) + c_.ws.bytes; }
  // My slot that rank `from` writes, and the slot of mine that peer p holds.
  void* my_slot(int64_t array, int from) const { return workspace() + c_.ws.slot(array, from); }
  void* peer_slot(int p, int64_t array) const { return mem_.peer_window(p) + c_.ws.slot(array, rank()); }

  // The ranks serving, as this rank's workspace says (WorkspaceLayout::live; elastic groups): every
  // protocol step below leaves out a rank outside it.
  uint64_t live_mask() const {
    return __atomic_load_n(reinterpret_cast<const uint64_t*>(workspace() + c_.ws.live) + kLiveMaskWord, __ATOMIC_ACQUIRE);
  }
  bool live(int p) const { return rank_live(live_mask(), p); }

  // Protocol steps shared by every op.
  void signal_all(int64_t array, uint64_t seq, bool include_self = false);
  // Waits until the slot reached seq (exact: equals it and carries the op's payload); its payload.
  uint64_t wait_slot(const void* slot, uint64_t seq, const WaitSite& site, WaitKind kind, bool exact = false) const;
  // op: the op that waits, where it is not the context's current one (an op in flight).
  void wait_all(int64_t array, uint64_t seq, Phase phase, const char* name, WaitKind kind = WaitKind::Device, uint64_t op = 0) const;
  void announce(uint64_t seq, uint64_t tag = 0);
  // Waits for peer p's enter of op seq; its tag.
  uint64_t wait_entered(int p, uint64_t seq, Phase phase = kPhaseEnter) const;
  static const uint8_t* host_ptr(Mem r, const char* what);
  // A collective's input and output as host memory (EINVAL naming `op` otherwise): the input.
  static const uint8_t* host_io(Mem in, Mem out, const char* op);
  // What both levels do first. dispatch_notify: the routing into l.state, the counts per expert;
  // adopt_routing: the origin's; dispatch_data: the inputs checked, new weights taken; combine: its sources.
  void begin_notify(DispatchLayout& l, const DispatchInput& in, std::vector<int64_t>& expert_counts) const;
  static void begin_adopt(DispatchLayout& l, const DispatchLayout& from);
  void begin_dispatch_data(DispatchLayout& l, const DispatchInput& in, const DispatchOutput& out) const;
  static CombineSources combine_sources(const DispatchLayout& l, const CombineInput& in, const CombineOutput& out);

  // dispatch steps shared by both levels (moe.cc)
  std::shared_ptr<Routing> make_routing(const DispatchInput& in, std::vector<int64_t>& expert_counts) const;
  void compact_dispatch(DispatchLayout& l, HostLayout& st, DispatchOutput& out, int64_t row);
  void reduce_region(const uint8_t* region, int64_t n, bool bf16, Mem out) const;

  Context& c_;
  HostSymmetricMemory mem_;
  std::unique_ptr<Executor> fetcher_;  // async engram fetches, made at the first one; stopped before mem_ goes
};

}  // namespace rankflow::host
