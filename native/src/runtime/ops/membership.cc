// An elastic group's membership as each rank applies it (ops.hpp remask, rejoin): the live mask in
// the rank's workspace (WorkspaceLayout::live), written only here and only while none of the rank's
// ops runs; every op reads it when it starts and leaves out the ranks outside it.
#include "../ops.hpp"

namespace rankflow::ops {

namespace {
void check_mask(const Context& c, uint64_t mask, const char* op) {
  RF_CHECK((mask & ~all_ranks_mask(c.world())) == 0 && rank_live(mask, c.rank()), "EINVAL",
           std::string(op) + ": the live mask must name ranks of the group, this rank (" + std::to_string(c.rank()) + ") among them");
  RF_CHECK(!c.capturing(), "STATE", std::string(op) + " while a graph is captured");
}
}  // namespace

void remask(Context& c, uint64_t seq, uint32_t session_index, uint64_t mask, uint64_t epoch) {
  check_mask(c, mask, "remask");
  RF_CHECK(epoch >= c.live_epoch, "EINVAL", "remask: membership " + std::to_string(epoch) + " is older than the rank's");
  // The ops the left word ended are over; what they left in slots and regions carries numbers at or
  // below `seq`, which no later wait accepts.
  recover(c, seq, session_index);
  c.backend().set_live(mask, epoch);
  c.live_mask = mask;
  c.live_epoch = epoch;
}

void rejoin(Context& c, const std::vector<int>& peers, const std::vector<ExportedSegments>& segs, uint64_t mask, uint64_t epoch) {
  check_mask(c, mask, "rejoin");
  RF_CHECK(!peers.empty() && peers.size() == segs.size(), "EINVAL", "rejoin: one exported segment per joining rank, and at least one rank");
  uint64_t joining = 0;
  for (const int peer : peers) {
    RF_CHECK(peer >= 0 && peer < c.world() && peer != c.rank() && rank_live(mask, peer) && !rank_live(c.live_mask, peer) && !rank_live(joining, peer), "EINVAL",
             "rejoin: rank " + std::to_string(peer) + " is not a rank that left the group");
    joining |= uint64_t(1) << peer;
  }
  RF_CHECK((mask & ~(c.live_mask | joining)) == 0, "EINVAL", "rejoin: the new membership names ranks that neither serve nor join");
  Backend& b = c.backend();
  b.check_alive("rejoin");
  for (size_t i = 0; i < peers.size(); ++i) b.import_peer(peers[i], segs[i]);
  b.set_live(mask, epoch);
  c.live_mask = mask;
  c.live_epoch = epoch;
  // The old ranks' tables went with them: fetches refuse until the group writes one again.
  c.engram_entries = -1;
  // The replacements' registration barrier (ops::register_window) has this number too.
  b.barrier(c.next_seq(), false, true);
}

}  // namespace rankflow::ops
