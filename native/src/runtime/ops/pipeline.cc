// Pipeline send/recv between ring neighbours.
#include <cstring>

#include "../ops.hpp"

namespace rankflow::ops {

void pp_exchange(Context& c, Mem in, int64_t bytes, Mem out) {
  c.backend().check_runs("ppExchange");
  RF_CHECK(bytes >= 0 && bytes <= c.buffer_bytes(), "EINVAL",
           "ppExchange of " + std::to_string(bytes) + " bytes exceeds the buffer (" + std::to_string(c.buffer_bytes()) +
               " bytes; see ppSizeHint)");
  c.backend().check_alive("ppExchange");
  c.backend().pp_exchange(c.next_seq(), in, bytes, out);
}

}  // namespace rankflow::ops
