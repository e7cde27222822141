// MoE combine of the host backend in a world whose nodes share no memory (two levels; the dispatch
// that made the handle: two_level_moe.cc).
// Every receiver returns its row for (source p, token t) to the forwarder of p's rail on its
//   own node, at slot (node(p) * R + its local index) * maxT + t. The sum must be the flat one bit for
//   bit: fp32, in rank order, from 0. Ranks of a node are consecutive and nodes are in rank order, so
//   that sum is a fold along the token's destination nodes in ascending order: the first adds its
//   ranks' rows to 0, sends the partial (fp32) on its rail to the next, which goes on from it, ...,
//   the last sends it home (one row per token per destination node crosses the network). Per rail,
//   node n first receives what the nodes below it send (the partials it continues, and finals for its
//   own tokens), folds, sends one frame to every other node, then receives the finals of the nodes
//   above it. Frames hold rows in (source node, token) order, which both ends derive from the routing.
#include <cstring>

#include "two_level.hpp"

namespace rankflow::host {

namespace {

HostLayout& state_of(DispatchLayout& l) { return static_cast<HostLayout&>(*l.state); }

[[noreturn]] void broken_frame(const Context& c, int peer, const std::string& what, Phase phase) {
  throw Error("RANK_FAILED", "rank " + std::to_string(peer) + " sent rank " + std::to_string(c.rank()) + " a " + phase_name(phase) +
                                 " frame that does not fit the protocol: " + what,
              peer, phase_name(phase));
}

}  // namespace

void HostTwoLevel::combine(uint64_t seq, DispatchLayout& l, const CombineInput& in, const CombineOutput& out) {
  combine_rows(seq, l, combine_sources(l, in, out), out);
}

void HostTwoLevel::combine_rows(uint64_t seq, DispatchLayout& l, const CombineSources& in, const CombineOutput& out) {
  const HostLayout& st = state_of(l);
  RF_CHECK(st.two != nullptr, "STATE", "combine: this handle's dispatch did not run in two levels");
  const TwoLevelState& two = *st.two;
  const Nodes& nd = c_.nodes;
  const auto& cfg = c_.cfg.ep;
  const int64_t K = cfg.topk, H = cfg.hidden, maxT = cfg.max_tokens_per_rank, Z = H + K, R = nd.ranks_per_node;
  const int N = nd.num_nodes, n = nd.node;
  const uint16_t* x = in.x;
  const float* weights = in.weights;
  const auto& bias = in.bias;
  announce_locals(seq, l.fingerprint);
  std::string refused;
  int refused_rank = -1;
  // 1. My rows go to the forwarder of their source's rail on my node.
  std::vector<int64_t> start(size_t(world()) + 1, 0);
  for (int p = 0; p < world(); ++p) start[size_t(p) + 1] = start[size_t(p)] + l.counts->per_rank[size_t(p)];
  for (int i = 0; i < R; ++i) {
    const int j = int((nd.local + i) % R), f = local_rank(j);
    const bool same = f == rank() || wait_entered(f, seq) == l.fingerprint;
    if (!same && refused.empty()) {
      refused = "inputs.handle: rank " + std::to_string(f) + " combines with another dispatch's handle than rank " +
                std::to_string(rank()) + " in combine #" + std::to_string(seq) + ": every rank must pass the handle of the same dispatch";
      refused_rank = f;
    }
    if (same) {
      uint8_t* dst = f == rank() ? buffer() : peer_buffer(f);
      int64_t rows = 0;
      for (int k = 0; k < N; ++k) {
        const int p = nd.rank_of(k, j);
        for (int64_t q = start[size_t(p)]; q < start[size_t(p) + 1]; ++q, ++rows) {
          const int64_t slot = (int64_t(k) * R + nd.local) * maxT + st.recv_src_token[size_t(q)];
          std::memcpy(dst + c_.buf.combine_x + slot * H * 2, x + q * H, size_t(H * 2));
          std::memcpy(dst + c_.buf.combine_weights + slot * K * 4, weights + q * K, size_t(K * 4));
        }
      }
      if (f != rank()) c_.traffic.up(rows * (H * 2 + K * 4));
    }
    if (f != rank()) signal(peer_slot(f, c_.ws.done), seq);
  }
  wait_locals(c_.ws.done, seq, kPhaseCombineData, "done");

  // 2. The folds along my rail (file header): first what the nodes below send.
  const int64_t entry = Z * 4, max_frame = int64_t(N) * maxT * entry;
  std::vector<RailRecv> below, above;
  for (int k = 0; k < N; ++k) {
    if (k < n) below.push_back({k, max_frame, {}});
    if (k > n) above.push_back({k, max_frame, {}});
  }
  rails_->exchange(seq, kPhaseCombineData, l.fingerprint, {}, below, WaitKind::Device);
  std::vector<const RailRecv*> from(size_t(N), nullptr);
  std::vector<int64_t> cursor(size_t(N), 0);
  auto accept = [&](const RailRecv& f) {
    if (f.tag == l.fingerprint) return void(from[size_t(f.node)] = &f);
    if (refused.empty()) {
      refused = "inputs.handle: rank " + std::to_string(nd.rail_peer(f.node)) + " combines with another dispatch's handle than rank " +
                std::to_string(rank()) + " in combine #" + std::to_string(seq) + ": every rank must pass the handle of the same dispatch";
      refused_rank = nd.rail_peer(f.node);
    }
  };
  for (const RailRecv& f : below) accept(f);
  std::vector<float> scratch(static_cast<size_t>(Z));
  // The next entry of node k's frame into acc (zeros where k's frame is refused).
  auto take = [&](int k, float* acc) {
    const RailRecv* f = from[size_t(k)];
    if (f == nullptr) return void(std::fill(acc, acc + Z, 0.0f));
    if (cursor[size_t(k)] + entry > int64_t(f->data.size()))
      broken_frame(c_, nd.rail_peer(k), "it holds fewer partial sums than the routing sends this way", kPhaseCombineData);
    std::memcpy(acc, f->data.data() + cursor[size_t(k)], size_t(entry));
    cursor[size_t(k)] += entry;
  };
  const int64_t T = l.num_tokens;
  std::vector<float> finals(size_t(T * Z), 0.0f);
  std::vector<std::vector<uint8_t>> outgoing(static_cast<size_t>(N));
  const uint8_t* b = buffer();
  for (int sn = 0; sn < N; ++sn) {
    const RailTokens& rt = two.rail[size_t(sn)];
    for (size_t e = 0; e < rt.token.size(); ++e) {
      const uint64_t D = rt.nodes[e];
      const int64_t t = rt.token[e];
      if ((D >> n) & 1) {
        float* acc = scratch.data();
        const int prev = highest_below(D, n);
        if (prev >= 0) take(prev, acc);
        else std::fill(acc, acc + Z, 0.0f);
        for (int j = 0; j < R; ++j) {
          if (((rt.locals[e] >> j) & 1) == 0) continue;
          const int64_t slot = (int64_t(sn) * R + j) * maxT + t;
          const auto* rr = reinterpret_cast<const uint16_t*>(b + c_.buf.combine_x + slot * H * 2);
          for (int64_t h = 0; h < H; ++h) acc[h] += bf16_to_float(rr[h]);
          const auto* rw = reinterpret_cast<const float*>(b + c_.buf.combine_weights + slot * K * 4);
          for (int64_t k = 0; k < K; ++k) acc[H + k] += rw[k];
        }
        int next = lowest_above(D, n);
        if (next < 0 && sn != n) next = sn;  // the last destination node sends the sum home
        if (next < 0) {
          std::memcpy(finals.data() + t * Z, acc, size_t(entry));
        } else {
          std::vector<uint8_t>& o = outgoing[size_t(next)];
          o.insert(o.end(), reinterpret_cast<const uint8_t*>(acc), reinterpret_cast<const uint8_t*>(acc) + entry);
        }
      }
      // My own token whose last destination node is below me: its sum came in the frames above.
      const int last = highest(D);
      if (sn == n && last >= 0 && last < n) take(last, finals.data() + t * Z);
    }
  }
  // Then one frame to every other node, and the sums of my tokens from the nodes above.
  std::vector<RailSend> sends;
  for (int k = 0; k < N; ++k)
    if (k != n) sends.push_back({k, outgoing[size_t(k)].data(), int64_t(outgoing[size_t(k)].size())});
  rails_->exchange(seq, kPhaseCombineData, l.fingerprint, sends, above, WaitKind::Device);
  for (const RailRecv& f : above) accept(f);
  const RailTokens& own = two.rail[size_t(n)];
  for (size_t e = 0; e < own.token.size(); ++e) {
    const int last = highest(own.nodes[e]);
    if (last > n) take(last, finals.data() + int64_t(own.token[e]) * Z);
  }
  for (int k = 0; k < N; ++k)
    if (from[size_t(k)] != nullptr && cursor[size_t(k)] != int64_t(from[size_t(k)]->data.size()))
      broken_frame(c_, nd.rail_peer(k), "it holds more partial sums than the routing sends this way", kPhaseCombineData);
  if (!refused.empty()) throw Error("EINVAL", refused, refused_rank);
  // 3. My tokens: the sum, the biases, rounded once (as flat).
  auto* out_x = out.x.as<uint16_t>();
  auto* out_w = out.topk_weights.as<float>();
  for (int64_t t = 0; t < T; ++t) {
    float* acc = finals.data() + t * Z;
    for (const uint16_t* bb : bias)
      if (bb != nullptr)
        for (int64_t h = 0; h < H; ++h) acc[h] += bf16_to_float(bb[t * H + h]);
    for (int64_t h = 0; h < H; ++h) out_x[t * H + h] = float_to_bf16(acc[h]);
    std::memcpy(out_w + t * K, acc + H, size_t(K * 4));
  }
}

}  // namespace rankflow::host
