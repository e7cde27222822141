// Registration of the window and the barrier.
#include "../ops.hpp"

namespace rankflow::ops {

void register_window(Context& c, const std::vector<ExportedSegments>& peers) {
  RF_CHECK(int(peers.size()) == c.world(), "EINVAL",
           "importPeers needs one entry per rank (" + std::to_string(c.world()) + "), got " + std::to_string(peers.size()));
  c.backend().check_alive("registerWindow");
  c.backend().check_runs("registerWindow");
  c.backend().import_peers(peers, c.next_seq());
}

void barrier(Context& c, bool cpu_sync) {
  Backend& b = c.backend();
  b.check_alive(cpu_sync ? "barrier (CPU sync)" : "barrier");
  b.check_runs(cpu_sync ? "barrier (CPU sync)" : "barrier");
  RF_CHECK(!(cpu_sync && c.capturing()), "EINVAL",
           "barrier({ withCpuSync: true }) cannot be captured in a graph: the CPU would have to wait");
  b.barrier(c.next_seq(), cpu_sync, !c.capturing());
}

}  // namespace rankflow::ops
