// AGRS sessions as the runtime runs them (seed 6.3). Opening and closing write the session index into
// every peer's session slot and wait for all of theirs; inside a session every collective uses a
// fresh part of the buffer, so no per-collective enter round is needed: that is what sessions buy.
// Each part is recorded (Session::regions) for session tensors and async collectives (ops/inflight.cc).
#include "../ops.hpp"

namespace rankflow::ops {

// Reserves `bytes` of the session region for the next collective (or session tensor), or says why it
// cannot; records what the region holds.
int64_t session_reserve(Context& c, int64_t bytes, const char* op, int64_t slot_bytes) {
  Session& s = c.session;
  RF_CHECK(s.open, "STATE", std::string(op) + " outside an AGRS session: call openSession() first");
  RF_CHECK(s.collectives < s.max_all_gathers, "EINVAL",
           std::string(op) + ": the session allows " + std::to_string(s.max_all_gathers) +
               " collectives (maxAllGathers); close it and open another");
  RF_CHECK(bytes >= 0 && bytes <= s.max_bytes * c.world(), "EINVAL",
           std::string(op) + " of " + std::to_string(bytes / c.world()) + " bytes per rank exceeds the session's maxBytes (" +
               std::to_string(s.max_bytes) + ")");
  const int64_t at = s.cursor;
  s.cursor = align_up(s.cursor + bytes, kRegionAlignment);
  ++s.collectives;
  s.regions.push_back(SessionRegion{at, bytes, slot_bytes, slot_bytes == 0, 0});
  return at;
}

void session_open(Context& c, int64_t max_bytes, int64_t max_all_gathers) {
  c.backend().check_runs("session open");
  RF_CHECK(!c.session.open, "STATE", "an AGRS session is already open: close() it before opening another");
  const int fetches = c.inflight.count(InFlightKind::Fetch);
  RF_CHECK(fetches == 0, "STATE",
           "openSession while " + std::to_string(fetches) + " engram fetch(es) are in flight: wait() for them first");
  RF_CHECK(max_bytes > 0 && max_all_gathers > 0, "EINVAL", "openSession: maxBytes and maxAllGathers must be positive");
  const int64_t need = max_all_gathers * align_up(max_bytes * c.world(), kRegionAlignment);
  RF_CHECK(need <= c.buffer_bytes(), "EINVAL",
           "openSession: maxBytes * worldSize * maxAllGathers = " + std::to_string(need) + " bytes exceeds the buffer (" +
               std::to_string(c.buffer_bytes()) + " bytes); give createGroup a buffer.bytes of at least " +
               std::to_string(c.ws.bytes + need) + " (sessionSizeHint)");
  c.backend().check_alive("session open");
  // The buffer may still hold data a slow peer reads for the previous op: an enter round first.
  const uint64_t s = c.next_seq();
  c.backend().session_signal(s, 2 * uint64_t(c.session.index + 1) - 1, kPhaseSessionOpen);
  c.session.index += 1;
  c.session.open = true;
  c.session.max_bytes = max_bytes;
  c.session.max_all_gathers = max_all_gathers;
  c.session.collectives = 0;
  c.session.cursor = 0;
  c.session.regions.clear();
}

void session_close(Context& c) {
  c.backend().check_runs("session close");
  RF_CHECK(c.session.open, "STATE", "no AGRS session is open");
  const int pending = c.inflight.session_ops();
  RF_CHECK(pending == 0, "STATE",
           "close: " + std::to_string(pending) + " collective(s) of the session are in flight: wait() for them first");
  c.backend().check_alive("session close");
  c.next_seq();
  c.backend().session_signal(0, 2 * uint64_t(c.session.index), kPhaseSessionClose);
  c.session.open = false;
  c.session.regions.clear();
}

void session_all_gather(Context& c, Mem in, int64_t bytes, Mem out) {
  c.backend().check_runs("session allGather");
  check_input_ready(c, in, bytes, "session allGather input");
  const int64_t at = session_reserve(c, bytes * c.world(), "session allGather");
  c.backend().check_alive("session allGather");
  c.backend().session_all_gather(c.next_seq(), in, bytes, at, out);
}

void session_reduce_scatter(Context& c, Mem in, int64_t n, bool bf16, Mem out) {
  c.backend().check_runs("session reduceScatter");
  const int64_t chunk = n * (bf16 ? 2 : 4);
  check_input_ready(c, in, chunk * c.world(), "session reduceScatter input");
  const int64_t at = session_reserve(c, chunk * c.world(), "session reduceScatter");
  c.backend().check_alive("session reduceScatter");
  c.backend().session_reduce_scatter(c.next_seq(), in, n, bf16, at, out);
}

}  // namespace rankflow::ops
