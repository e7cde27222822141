// allReduce: the sum over ranks, in rank order with fp32 accumulation (bf16 rounded to nearest even),
// of every rank's n fp32 or bf16 elements, on every rank (in == out: in place). Within a node it is
// the backend's peer reduce; across nodes it is composed here from the backend's allGather (of the
// shapes, then of the data) and the same sums on the CPU, so every rank gets the same bits either way.
#include <vector>

#include "../ops.hpp"
#include "../peer_reduce.hpp"

namespace rankflow::ops {
namespace {

void across_nodes(Context& c, Mem in, Mem out, int64_t n, bool bf16) {
  const int W = c.world();
  const int64_t bytes = n * (bf16 ? 2 : 4);
  // Every rank learns every rank's shape first: a mismatch is refused on all of them, nothing moved.
  uint64_t tag = peer_reduce_tag(n, bf16);
  std::vector<uint64_t> tags(static_cast<size_t>(W));
  c.backend().all_gather(c.next_seq(), Mem{&tag, false}, 8, Mem{tags.data(), false});
  for (int q = 0; q < W; ++q)
    if (tags[size_t(q)] != tag)
      throw peer_shape_error(q, c.rank(), "(" + std::to_string(n) + (bf16 ? " bf16" : " fp32") +
                                             " elements): every rank must pass the same shape and dtype (nothing moved)");
  std::vector<uint8_t> parts(static_cast<size_t>(bytes * W)), sums(static_cast<size_t>(bytes));
  c.backend().all_gather(c.next_seq(), in, bytes, Mem{parts.data(), false});
  sum_in_rank_order(consecutive_parts(parts.data(), W, n, bf16), 0, n, bf16, out.device ? sums.data() : out.as<uint8_t>());
  if (out.device && bytes > 0) c.device("allReduce of device tensors").upload(uint64_t(reinterpret_cast<uintptr_t>(out.ptr)), sums.data(), bytes);
}

}  // namespace

void all_reduce(Context& c, Mem in, Mem out, int64_t n, bool bf16) {
  const bool across = c.nodes.two_level();
  c.backend().check_runs(across ? "allGather" : "peer reduce");  // what it is made of, asked before anything moves
  RF_CHECK(n >= 0, "EINVAL", "allReduce: the input's element count must be >= 0");
  const int64_t bytes = n * (bf16 ? 2 : 4);
  // Within a node: the input staged at the buffer's start, the sums behind it (where a backend stages);
  // across nodes: the W gathered parts.
  const int64_t need = across ? bytes * c.world() : align_up(bytes, kRegionAlignment) + bytes;
  RF_CHECK(need <= c.buffer_bytes(), "EINVAL",
           "allReduce of " + std::to_string(bytes) + " bytes per rank needs " + std::to_string(need) + " buffer bytes; the buffer has " +
               std::to_string(c.buffer_bytes()) + " (raise buffer.bytes)");
  c.backend().check_alive("allReduce");
  if (across) return across_nodes(c, in, out, n, bf16);
  c.backend().reduce_peers(c.next_seq(), in, out, n, bf16);
}

}  // namespace rankflow::ops
