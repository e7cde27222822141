// What the executors of a sum over the ranks share on the CPU: the sums themselves, in the kernels'
// arithmetic (rf_reduce, rf_peer_reduce: element i of every part added in rank order to an fp32
// accumulator that starts at 0, bf16 rounded to nearest even once at the end), and the refusal of a
// peer reduce whose ranks disagree on the shape. The host executor's reduce-scatter and peer reduce,
// the runtime's sum across nodes (from allGather) and the cuda backend's report of the GPU's refusal go through
// here, so that their bits and their messages agree.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "errors.hpp"
#include "protocol.hpp"

namespace rankflow {

// out[i] = the sum over q, in order, of parts[q][i], for i in [lo, hi) (out indexed as the parts are).
inline void sum_in_rank_order(const std::vector<const uint8_t*>& parts, int64_t lo, int64_t hi, bool bf16, uint8_t* out) {
  for (int64_t i = lo; i < hi; ++i) {
    float acc = 0.0f;
    for (const uint8_t* p : parts)
      acc += bf16 ? bf16_to_float(reinterpret_cast<const uint16_t*>(p)[i]) : reinterpret_cast<const float*>(p)[i];
    if (bf16) reinterpret_cast<uint16_t*>(out)[i] = float_to_bf16(acc);
    else reinterpret_cast<float*>(out)[i] = acc;
  }
}

// W parts of n elements each, one after another from `first`, as sum_in_rank_order takes them.
inline std::vector<const uint8_t*> consecutive_parts(const uint8_t* first, int world, int64_t n, bool bf16) {
  std::vector<const uint8_t*> parts;
  for (int q = 0; q < world; ++q) parts.push_back(first + int64_t(q) * n * (bf16 ? 2 : 4));
  return parts;
}

// EINVAL on every rank of a peer reduce whose rank `peer` passed another (n, dtype) than `rank`;
// `detail` follows the names ("(64 fp32 elements) in op #7: ...").
inline Error peer_shape_error(int peer, int rank, const std::string& detail) {
  return Error("EINVAL", "input: rank " + std::to_string(peer) + " reduces another element count or dtype than rank " +
                             std::to_string(rank) + " " + detail);
}

}  // namespace rankflow
