// CUDA graphs of no-CPU-sync ops (rank.capture): while capturing, ops take sequence numbers as
// usual but nothing runs; the graph's kernels read them from a device epoch, so the capture leaves
// the rank's sequence where it was and every replay advances it by the graph's op count.
#include "../ops.hpp"

namespace rankflow::ops {

void capture_begin(Context& c) {
  Backend& b = c.backend();
  b.check_alive("capture");
  b.check_runs("capture");
  DeviceOps& d = c.device("capture");
  RF_CHECK(!d.capturing(), "STATE", "capture: a capture is already in progress on this rank");
  d.capture_begin(c.seq);
  c.capture_start = c.seq;
}

uint64_t capture_end(Context& c, int64_t* ops) {
  DeviceOps& d = c.device("capture");
  RF_CHECK(d.capturing(), "STATE", "capture: no capture is in progress on this rank");
  const uint64_t start = c.capture_start;
  const int64_t n = int64_t(c.seq - start);
  c.seq = start;  // nothing ran: the replays will take these sequence numbers
  const uint64_t graph = d.capture_end(uint64_t(n));
  *ops = n;
  return graph;
}

void replay(Context& c, uint64_t graph, int64_t ops) {
  c.backend().check_alive("replay");
  c.backend().check_runs("replay");
  c.device("replay").replay(graph, c.seq);
  c.seq += uint64_t(ops);
}

}  // namespace rankflow::ops
