// What the cuda backend keeps of a dispatch across nodes (two_level_moe.cc, two_level_combine.cc):
// the routing of my rail as the host computed it once the CPU sync brought every count. Shared by a
// handle and the cached dispatches that replay it, as the flat routing is.
#pragma once

#include <cstdint>
#include <vector>

namespace rankflow::cuda {

// The tokens of one source of my rail that reach my node: the rail peer on node k (those with an
// expert on my node, in the order its records came: token order), or, at my own node, all of mine.
struct RailSource {
  std::vector<int32_t> token;
  std::vector<uint64_t> nodes;   // the nodes the token has experts on (bit k)
  std::vector<uint64_t> locals;  // the ranks of my node it goes to (bit j: local index j)
  std::vector<int32_t> idx;      // [n * K] global expert ids, -1 unused (ids out of range made -1)
  std::vector<float> weights;    // [n * K] the weights of the dispatch that made the routing
};

struct TwoLevelRouting {
  std::vector<RailSource> rail;            // [N] node k's rail peer (mine at my node)
  std::vector<int64_t> send_records;       // [N] tokens of mine sent to node k (0 at mine)
  std::vector<int64_t> recv_records;       // [N] records from node k (0 at mine)
  std::vector<int64_t> count, offset;      // [R * W]: rows node rank j gets from source s, and the first
  std::vector<int64_t> tokens_per_expert;  // mine, unaligned
  int64_t bad_index = -1;                  // the first expert id of my topk outside [-1, E), or -1
  int32_t bad_value = 0;
};

}  // namespace rankflow::cuda
