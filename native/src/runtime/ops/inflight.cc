// Session tensors and asynchronous ops as the runtime runs them: checks, sequence numbers, the
// session's regions and the rank's ops in flight (runtime/inflight.hpp); the backends move the data.
// A session tensor is my slot of a region of its own, so an allGather of it moves no local copy; a
// collective's result stays in its region (a view, valid until the session closes: every collective
// of a session has a fresh region, so nothing else writes it).
#include <algorithm>

#include "../ops.hpp"

namespace rankflow::ops {

namespace {

// The address of my buffer (host pointer or device address: my window + the workspace), and the kind
// of memory it is, asked of the backend once.
uint64_t buffer_base(Context& c) {
  static_assert(sizeof(uintptr_t) == sizeof(uint64_t));
  if (c.inflight.buffer_base == 0) {
    const BackendInfo info = c.backend().info();
    c.inflight.device_memory = info.device_memory;
    c.inflight.buffer_base = info.windows.at(size_t(c.rank())) + uint64_t(c.ws.bytes);
  }
  return c.inflight.buffer_base;
}

bool device_memory(Context& c) {
  buffer_base(c);
  return c.inflight.device_memory;
}

// The buffer offset of `in` if it lies in my session area (memory of the kind my buffer is), else -1.
int64_t session_offset(Context& c, Mem in, int64_t bytes) {
  if (!in || in.device != device_memory(c) || !c.session.open) return -1;
  const uint64_t base = buffer_base(c), p = uint64_t(reinterpret_cast<uintptr_t>(in.ptr));
  if (p < base || p + uint64_t(bytes) > base + uint64_t(c.session.cursor)) return -1;
  return int64_t(p - base);
}

// The region that starts at `at` (regions are recorded in increasing order), or null.
SessionRegion* region_at(Session& s, int64_t at) {
  auto it = std::lower_bound(s.regions.begin(), s.regions.end(), at, [](const SessionRegion& r, int64_t a) { return r.at < a; });
  return it != s.regions.end() && it->at == at ? &*it : nullptr;
}

// The session tensor whose slot `in` is and that no collective gathered yet, or null.
SessionRegion* fresh_slot(Context& c, Mem in, int64_t bytes) {
  const int64_t off = session_offset(c, in, bytes);
  if (off < 0 || bytes <= 0) return nullptr;
  for (SessionRegion& r : c.session.regions)
    if (r.slot_bytes == bytes && !r.consumed && r.at + int64_t(c.rank()) * bytes == off) return &r;
  return nullptr;
}

}  // namespace

int64_t session_tensor(Context& c, int64_t bytes) {
  RF_CHECK(c.session.open, "STATE", "session tensor outside an AGRS session: call openSession() first");
  RF_CHECK(bytes > 0, "EINVAL", "session tensor: shape must have at least one element");
  RF_CHECK(bytes <= c.session.max_bytes, "EINVAL",
           "session tensor of " + std::to_string(bytes) + " bytes exceeds the session's maxBytes (" +
               std::to_string(c.session.max_bytes) + ")");
  return session_reserve(c, bytes * c.world(), "session tensor", bytes) + int64_t(c.rank()) * bytes;
}

void check_input_ready(Context& c, Mem in, int64_t bytes, const char* what) {
  if (c.inflight.session_ops() == 0) return;
  const int64_t off = session_offset(c, in, bytes);
  if (off < 0) return;
  for (const SessionRegion& r : c.session.regions)
    if (r.writer != 0 && off < r.at + r.bytes && r.at < off + std::max<int64_t>(bytes, 1))
      throw Error("STATE", std::string(what) + " lies in the region that collective #" + std::to_string(r.writer) +
                               " is still writing: wait() for it first");
}

uint64_t session_issue(Context& c, bool reduce, Mem in, int64_t bytes_or_n, bool bf16, int64_t* result_at) {
  const char* op = reduce ? "session reduceScatter" : "session allGather";
  c.backend().check_runs(op);
  RF_CHECK(c.session.open, "STATE", std::string(op) + " outside an AGRS session: call openSession() first");
  RF_CHECK(bytes_or_n >= 0, "EINVAL", std::string(op) + ": negative size");
  const int W = c.world();
  auto o = std::make_unique<InFlightOp>();
  AgrsOp& a = o->agrs;
  a.reduce = reduce;
  a.in = in;
  a.bf16 = bf16;
  if (reduce) {
    a.n = bytes_or_n;
    a.bytes = a.n * (bf16 ? 2 : 4);
    o->kind = InFlightKind::Reduce;
  } else {
    a.bytes = bytes_or_n;
    o->kind = InFlightKind::Gather;
  }
  // allGather of a session tensor: in place, in its own region. Anything else takes a fresh region
  // (a reduceScatter reads its input where it is, and its chunks arrive in the new region).
  SessionRegion* slot = reduce ? nullptr : fresh_slot(c, in, a.bytes);
  if (slot == nullptr) check_input_ready(c, in, reduce ? a.bytes * W : a.bytes, reduce ? "reduceScatter input" : "allGather input");
  c.backend().check_alive(op);
  a.at = slot != nullptr ? slot->at : session_reserve(c, a.bytes * W, op);
  SessionRegion* region = slot != nullptr ? slot : region_at(c.session, a.at);
  region->consumed = true;
  a.seq = c.next_seq();
  o->id = a.seq;
  c.backend().agrs_issue(a);
  region->writer = a.seq;
  *result_at = a.at;
  c.inflight.add(std::move(o));
  return a.seq;
}

uint64_t engram_fetch_issue(Context& c, const int32_t* ids, int64_t n, uint64_t* device_out) {
  c.backend().check_runs("engramFetch");
  RF_CHECK(!c.session.open, "STATE", "engramFetch inside an AGRS session: close() the session first");
  RF_CHECK(c.engram_entries >= 0, "STATE", "engramFetch before engramWrite: no table is stored");
  const int fetches = c.inflight.count(InFlightKind::Fetch);
  RF_CHECK(fetches < InFlight::kMaxFetches, "STATE",
           "engramFetch: " + std::to_string(fetches) + " fetches are in flight already (at most " +
               std::to_string(InFlight::kMaxFetches) + "): wait() for one first");
  check_engram_ids(c, ids, n);
  c.backend().check_alive("engramFetch");
  auto o = std::make_unique<InFlightOp>();
  o->kind = InFlightKind::Fetch;
  FetchOp& f = o->fetch;
  f.ids.assign(ids, ids + n);
  f.entries = c.engram_entries;
  f.row_bytes = c.engram_row_bytes;
  const int64_t bytes = n * f.row_bytes;
  uint64_t dev = 0;
  if (device_memory(c)) {
    dev = c.device("a device tensor").device_alloc(std::max<int64_t>(bytes, 1));
    f.out = Mem{reinterpret_cast<void*>(uintptr_t(dev)), true};
  } else {
    o->host_out.reset(static_cast<uint8_t*>(std::malloc(size_t(std::max<int64_t>(bytes, 16)))));
    RF_CHECK(o->host_out != nullptr, "EINVAL", "engramFetch: out of memory for " + std::to_string(bytes) + " bytes");
    o->host_out_bytes = bytes;
    f.out = Mem{o->host_out.get(), false};
  }
  o->id = c.next_seq();
  try {
    c.backend().engram_fetch_issue(f);
  } catch (...) {
    if (dev != 0) c.device("free").device_free(dev);
    throw;
  }
  if (device_out != nullptr) *device_out = dev;
  const uint64_t id = o->id;
  c.inflight.add(std::move(o));
  return id;
}

std::unique_ptr<InFlightOp> inflight_wait(Context& c, uint64_t id) {
  std::unique_ptr<InFlightOp> o = c.inflight.take(id);
  RF_CHECK(o != nullptr, "STATE", "op #" + std::to_string(id) + " is not in flight: it was waited for already, or never issued");
  if (o->kind == InFlightKind::Fetch) {
    c.backend().engram_fetch_complete(o->fetch);
    return o;
  }
  c.backend().agrs_complete(o->agrs);
  // Complete: its region may be read (as an input) from now on; nothing writes it again this session.
  SessionRegion* r = c.session.open ? region_at(c.session, o->agrs.at) : nullptr;
  if (r != nullptr && r->writer == o->id) r->writer = 0;
  return o;
}

}  // namespace rankflow::ops
