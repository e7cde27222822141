// A rank put back in step with its peers after a run's release (ops.hpp recover). Nothing crosses to a
// peer here: every rank does this alone, once every program has ended, and the group goes on only
// when all have. What makes that safe is in the numbers: every signal carries the sequence number
// (or session count) of its op, and the group's new numbers are above all of them, so whatever a
// released op left in a slot or a region can satisfy no later wait.
#include "../ops.hpp"

namespace rankflow::ops {

void recover(Context& c, uint64_t seq, uint32_t session_index) {
  RF_CHECK(seq >= c.seq, "EINVAL",
           "recover: sequence number " + std::to_string(seq) + " is below the rank's (" + std::to_string(c.seq) + ")");
  RF_CHECK(session_index >= c.session.index, "EINVAL",
           "recover: session count " + std::to_string(session_index) + " is below the rank's (" + std::to_string(c.session.index) + ")");
  Backend& b = c.backend();
  // The ops still in flight end first: each either completes (its peers did their part) or gives up
  // at once on the release; either way nothing writes into their memory after this.
  while (std::unique_ptr<InFlightOp> op = c.inflight.take_any()) {
    try {
      if (op->kind == InFlightKind::Fetch) b.engram_fetch_complete(op->fetch);
      else b.agrs_complete(op->agrs);
    } catch (const Error& e) {
      if (e.code != "ABORTED") throw;  // a failure, not the release: the rank is dead
    }
  }
  if (c.capturing()) {
    int64_t ops = 0;
    c.device("recover").free_graph(capture_end(c, &ops));
  }
  b.recover();
  c.session.open = false;
  c.session.regions.clear();
  c.session.index = session_index;
  c.seq = seq;
}

}  // namespace rankflow::ops
