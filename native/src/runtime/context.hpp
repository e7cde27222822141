// A rank's view of the world (DeepEP's NCCLSymmetricMemoryContext, seed 4.2): rank, world size,
// domains, the symmetric window's layouts, and the protocol state that lives across operations (the
// op sequence number, the dispatch layouts that handles name, the AGRS session, the engram table).
// It owns the rank's Backend; the ops (runtime/ops.hpp) check their inputs here, then call it.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <numeric>
#include <unordered_map>
#include <vector>

#include "abort.hpp"
#include "backend.hpp"
#include "config.hpp"
#include "inflight.hpp"
#include "scaleout.hpp"
#include "wait.hpp"

namespace rankflow {

// What a dispatch received, once the CPU has its counts. Fixed from then on: the cached dispatches
// that replay its routing share it.
struct RecvCounts {
  std::vector<int64_t> per_rank;    // [W] tokens received from rank p
  std::vector<int64_t> per_expert;  // [local experts] unaligned
};

// The routing of one dispatch, kept for its handle: what cached dispatch and combine replay.
struct DispatchLayout {
  uint32_t id = 0;
  uint64_t seq = 0;                       // the dispatch op that filled it
  uint64_t fingerprint = 0;               // the seq of the dispatch that computed the routing (cached: its origin's)
  uint64_t live_epoch = 0;                // the membership it was routed for (a handle of another is refused)
  int64_t masked_slots = 0;               // top-k slots dropped because their expert's rank left
  int64_t num_tokens = 0;
  int64_t expert_alignment = 1;
  bool counts_known = false;              // counts and num_recv below are valid
  std::shared_ptr<const RecvCounts> counts;
  int64_t num_recv = 0;
  bool complete = false;                  // the data phase ran: the handle is usable
  // The backend's part (routing, device memory). A layout reused for a new handle (Context::add_layout)
  // keeps its old state for the backend to take over or replace (Backend::dispatch_notify, adopt_routing).
  std::unique_ptr<LayoutState> state;

  // The counts the CPU got (a backend's dispatch_counts): num_recv is their sum over the ranks.
  void set_counts(std::shared_ptr<const RecvCounts> k) {
    num_recv = std::accumulate(k->per_rank.begin(), k->per_rank.end(), int64_t(0));
    counts = std::move(k);
    counts_known = true;
  }

  // Everything as a new layout has it (the defaults above), but the backend's state is kept for reuse.
  void reset_for_reuse() {
    std::unique_ptr<LayoutState> kept = std::move(state);
    *this = DispatchLayout{};
    state = std::move(kept);
  }
};

struct Session {
  bool open = false;
  uint32_t index = 0;          // sessions opened so far
  int64_t max_bytes = 0;       // per rank per collective
  int64_t max_all_gathers = 0;
  int64_t collectives = 0;     // collectives done in this session
  int64_t cursor = 0;          // next free byte of the session region (fresh region per collective)
  std::vector<SessionRegion> regions;  // what each reserved region holds (runtime/inflight.hpp)
};

class Context {
 public:
  // abort_words: kWords int32 shared with the main thread (null: private ones).
  Context(const ContextConfig& cfg, int32_t* abort_words);
  ~Context() { destroy(); }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ContextConfig cfg;
  Domains dom;
  Nodes nodes;                 // scale_out: this rank's node and rail (one node otherwise)
  Traffic traffic;             // bytes sent (group.traffic())
  WorkspaceLayout ws;
  BufferLayout buf;
  int64_t sym_bytes = 0;       // workspace + buffer
  int64_t cpu_bytes = 0;       // aligned host segment bytes
  Abort abort;
  WaitRules rules;             // every wait of this rank: its rank, timeouts, abort words
  uint64_t seq = 0;            // collectives done; identical on every rank
  uint64_t capture_start = 0;  // seq when the graph being captured began (ops/graph.cc)
  Session session;
  uint32_t next_layout_id = 1;
  int64_t engram_entries = -1, engram_row_bytes = 0;
  InFlight inflight;           // asynchronous ops not yet waited for (runtime/ops/inflight.cc)
  // Elastic groups: the ranks serving (bit p) and the membership changes so far, as this rank last
  // wrote them into its workspace's `live` slot (runtime/ops/membership.cc), which its ops read.
  uint64_t live_mask = 0;
  uint64_t live_epoch = 0;
  bool whole() const { return live_mask == all_ranks_mask(world()); }
  static constexpr size_t kMaxLiveHandles = 256;

  Backend& backend() const {
    RF_CHECK(backend_ != nullptr, "STATE", "the rank's context is destroyed");
    return *backend_;
  }
  // The backend's devices (Backend::device()), or EINVAL: `what` needs backend 'cuda'.
  DeviceOps& device(const char* what) const;
  // A CUDA graph is being captured on this rank (never on a backend without devices).
  bool capturing() const {
    DeviceOps* d = backend().device();
    return d != nullptr && d->capturing();
  }
  bool alive() const { return backend_ != nullptr; }
  int rank() const { return cfg.rank; }
  int world() const { return cfg.world_size; }
  int64_t buffer_bytes() const { return sym_bytes - ws.bytes; }
  int64_t experts_per_rank() const { return cfg.ep.num_experts / cfg.world_size; }
  // The next op's sequence number; ABORTED where the run's release ends it (the op does not start).
  uint64_t next_seq() {
    if (abort.released(seq + 1)) throw release_error(abort, rank(), seq + 1, "the start of its next op");
    if (abort.left_rank() >= 0) throw left_error(abort, rank(), "the start of its next op");
    return ++seq;
  }

  // The layout a handle names (nullptr: unknown or expired); counts as a use.
  std::shared_ptr<DispatchLayout> layout(uint32_t id) const;
  std::shared_ptr<DispatchLayout> add_layout();
  void destroy() noexcept;
  // The worker ended without destroy(): true once nothing of the rank runs any more and destroy() is to
  // go on another thread (Backend::quiesce).
  bool quiesce() noexcept { return backend_ != nullptr && backend_->quiesce(); }

 private:
  std::unique_ptr<Backend> backend_;
  // Live handles, at most kMaxLiveHandles: using one (a cached dispatch, a combine) keeps it, and the
  // least recently used goes when a dispatch makes one more (actors/core/handles.ts does the same).
  // O(1) each way: the use order is a list, most recent first, each handle pointing at its place.
  // Once kMaxLiveHandles are live, a new handle takes over the expiring one's map entry and list node,
  // and its layout where nothing else holds it: a dispatch allocates nothing for its handle then.
  struct LiveLayout {
    std::shared_ptr<DispatchLayout> layout;
    std::list<uint32_t>::iterator use;
  };
  mutable std::unordered_map<uint32_t, LiveLayout> layouts_;
  mutable std::list<uint32_t> use_order_;
};

}  // namespace rankflow
