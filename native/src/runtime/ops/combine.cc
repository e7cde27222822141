// MoE combine as the runtime runs it: the handle's layout, then the backend's combine.
#include "../ops.hpp"

namespace rankflow::ops {

void combine(Context& c, uint32_t handle, const CombineInput& in, const CombineOutput& out) {
  Backend& b = c.backend();
  b.check_alive("combine");
  b.check_runs("combine");
  auto l = handle_layout(c, handle, "input.handle");
  RF_CHECK(bool(in.x), "EINVAL", "combine: x is required");
  RF_CHECK(in.x.device || l->counts_known, "EINVAL",
           "combine: the handle's receive counts are unknown (it came from a dispatch without a CPU sync)");
  b.combine(c.next_seq(), *l, in, out);
}

}  // namespace rankflow::ops
