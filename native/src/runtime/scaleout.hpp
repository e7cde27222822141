// The scale-out view of a rank (worlds that span nodes): which node it is on, its rail peers, what a
// backend's scale-out leg is told to connect, and the traffic counters that group.traffic() reads.
//
// Nodes are blocks of ranks_per_node consecutive ranks: rank g is (node g / R, local index g % R).
// Processes on different nodes share no memory (ContextConfig::scale_out): a rank talks across nodes
// only with the ranks of its own local index on the other nodes (its rail, as DeepEP's internode
// kernels and NCCL's rail-aligned rings do), and everything else goes through the ranks of its node.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace rankflow {

struct Nodes {
  int num_nodes = 1;
  int ranks_per_node = 1;
  int node = 0;   // this rank's node
  int local = 0;  // this rank's index inside it

  bool two_level() const { return num_nodes > 1; }
  int node_of(int g) const { return g / ranks_per_node; }
  int local_of(int g) const { return g % ranks_per_node; }
  int rank_of(int node_index, int local_index) const { return node_index * ranks_per_node + local_index; }
  // The rank of this rank's rail on node n.
  int rail_peer(int n) const { return rank_of(n, local); }
  bool same_node(int g) const { return node_of(g) == node; }
  int first_local() const { return node * ranks_per_node; }
  // The nodes (bit k) that hold a rank of `ranks` (bit g: global rank g).
  uint64_t nodes_of(uint64_t ranks) const;
  // The ranks of `ranks` on this node, as local indices (bit j: local rank j).
  uint64_t locals_of(uint64_t ranks) const;
};

// Bit masks of ranks and nodes, for the two-level MoE of both backends.
inline uint64_t low_bits(int n) { return n >= 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1; }
// The highest bit of `mask` below bit n, the lowest above it, the highest of all: -1 where none.
inline int highest_below(uint64_t mask, int n) {
  const uint64_t m = mask & low_bits(n);
  return m == 0 ? -1 : 63 - __builtin_clzll(m);
}
inline int lowest_above(uint64_t mask, int n) {
  const uint64_t m = n >= 63 ? 0 : mask & ~low_bits(n + 1);
  return m == 0 ? -1 : __builtin_ctzll(m);
}
inline int highest(uint64_t mask) { return mask == 0 ? -1 : 63 - __builtin_clzll(mask); }

inline uint64_t Nodes::nodes_of(uint64_t ranks) const {
  uint64_t out = 0;
  for (int k = 0; k < num_nodes; ++k)
    if ((ranks >> (k * ranks_per_node)) & low_bits(ranks_per_node)) out |= uint64_t(1) << k;
  return out;
}
inline uint64_t Nodes::locals_of(uint64_t ranks) const { return (ranks >> first_local()) & low_bits(ranks_per_node); }

// Where a rank's scale-out leg listens (one per global rank; the rank's own entry is ignored).
struct ScaleoutEndpoint {
  std::string host;
  int port = 0;
};
// The world's rail key: HMAC-SHA256(token, "rankflow-scaleout/1\n" + worldId), made by the TypeScript
// layer (actors/world/scaleout.ts); every rail connection proves it knows it, both ways.
using RailKey = std::array<uint8_t, 32>;

// Bytes a rank has sent since creation: to ranks of its node (scale-up: writes into their windows)
// and to ranks of other nodes (scale-out: the payload of its rail frames, without their headers),
// and the time its scale-out exchanges took. Written by the rank's own thread only; the words may
// be a SharedArrayBuffer's, which the main thread reads with Atomics.load (group.traffic()).
class Traffic {
 public:
  static constexpr int kScaleUpBytes = 0;
  static constexpr int kScaleOutBytes = 1;
  static constexpr int kScaleOutNs = 2;
  static constexpr int kWords = 4;

  Traffic() : words_(own_) {}
  Traffic(const Traffic&) = delete;
  Traffic& operator=(const Traffic&) = delete;
  void attach(uint64_t* words) {
    for (int i = 0; i < kWords; ++i) __atomic_store_n(words + i, load(i), __ATOMIC_RELAXED);
    words_ = words;
  }
  void add(int word, uint64_t v) { __atomic_store_n(words_ + word, load(word) + v, __ATOMIC_RELAXED); }
  void up(int64_t bytes) { add(kScaleUpBytes, uint64_t(bytes)); }
  void out(int64_t bytes) { add(kScaleOutBytes, uint64_t(bytes)); }
  uint64_t load(int word) const { return __atomic_load_n(words_ + word, __ATOMIC_RELAXED); }

 private:
  uint64_t own_[kWords] = {0, 0, 0, 0};
  uint64_t* words_;
};

}  // namespace rankflow
