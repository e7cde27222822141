// What a rank has in flight, and what the regions of its AGRS session hold: the bookkeeping that lets
// rank programs keep data in the symmetric buffer (session tensors, result views) and overlap ops with
// work ({ async: true }) without ever handing out stale data. The runtime (runtime/ops/inflight.cc)
// refuses what would corrupt: closing a session or writing the engram table while ops are in flight,
// a collective whose input is a region still being written, a second wait.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>

#include "backend.hpp"

namespace rankflow {

// One region of the open session: a collective's part of the buffer (a fresh one per collective,
// DeepEP V2's agrs_buffer_offset), or the region of a session tensor (s.tensor()), whose slot
// at + rank * slot_bytes is the tensor itself until a collective gathers it in place.
struct SessionRegion {
  int64_t at = 0;          // buffer offset
  int64_t bytes = 0;       // its size (W parts)
  int64_t slot_bytes = 0;  // a session tensor's bytes per rank; 0: a collective's own region
  bool consumed = false;   // a collective ran over it (a session tensor's region: gathered in place)
  uint64_t writer = 0;     // the op in flight that writes it (0: none)
};

enum class InFlightKind { Gather, Reduce, Fetch };

struct InFlightOp {
  uint64_t id = 0;  // the op's sequence number
  InFlightKind kind = InFlightKind::Gather;
  AgrsOp agrs;
  FetchOp fetch;
  // A fetch's host output (host backend): malloc'ed, handed to JS at the wait (or freed with the op).
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> host_out;
  int64_t host_out_bytes = 0;
};

// The rank's ops in flight, by id. Ops complete in any order; each once.
class InFlight {
 public:
  // At most this many engram fetches in flight at once (each holds its output and its ids).
  static constexpr int kMaxFetches = 16;
  // My buffer's address (host pointer or device address), once known: session inputs are found by it.
  uint64_t buffer_base = 0;
  // My buffer is device memory (BackendInfo::device_memory), known with buffer_base.
  bool device_memory = false;

  InFlightOp& add(std::unique_ptr<InFlightOp> op) {
    InFlightOp& o = *op;
    ops_[o.id] = std::move(op);
    return o;
  }
  InFlightOp* find(uint64_t id) const {
    const auto it = ops_.find(id);
    return it == ops_.end() ? nullptr : it->second.get();
  }
  std::unique_ptr<InFlightOp> take(uint64_t id) {
    const auto it = ops_.find(id);
    if (it == ops_.end()) return nullptr;
    std::unique_ptr<InFlightOp> op = std::move(it->second);
    ops_.erase(it);
    return op;
  }
  // Any op in flight (the oldest), taken; null when none is.
  std::unique_ptr<InFlightOp> take_any() {
    if (ops_.empty()) return nullptr;
    std::unique_ptr<InFlightOp> op = std::move(ops_.begin()->second);
    ops_.erase(ops_.begin());
    return op;
  }
  int count(InFlightKind k) const {
    int n = 0;
    for (const auto& [id, op] : ops_) n += op->kind == k ? 1 : 0;
    return n;
  }
  int session_ops() const { return count(InFlightKind::Gather) + count(InFlightKind::Reduce); }
  // After the backend is destroyed (nothing runs on the ops' memory any more).
  void clear() noexcept { ops_.clear(); }

 private:
  std::map<uint64_t, std::unique_ptr<InFlightOp>> ops_;
};

}  // namespace rankflow
