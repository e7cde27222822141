// allGather outside a session.
#include "../ops.hpp"

namespace rankflow::ops {

void all_gather(Context& c, Mem in, int64_t bytes, Mem out) {
  c.backend().check_runs("allGather");
  RF_CHECK(bytes >= 0, "EINVAL", "allGather: bytes must be >= 0");
  RF_CHECK(bytes * c.world() <= c.buffer_bytes(), "EINVAL",
           "allGather of " + std::to_string(bytes) + " bytes per rank needs " + std::to_string(bytes * c.world()) +
               " buffer bytes; the buffer has " + std::to_string(c.buffer_bytes()) + " (raise buffer.bytes)");
  c.backend().check_alive("allGather");
  c.backend().all_gather(c.next_seq(), in, bytes, out);
}

}  // namespace rankflow::ops
