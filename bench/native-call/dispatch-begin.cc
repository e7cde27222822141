// What the runtime's C++ costs a cached dispatch before its data phase: ops::dispatch_begin for a
// handle (checks, the new handle's layout, the routing adopted), on the host backend, 1 rank, 128
// tokens, top-8 of 256, with 256 handles live (each new one takes over the expiring one's entry).
// Standalone (not part of the addon or CI); from the repository root:
//   g++ -O2 -std=c++20 -Inative/src -Inative/src/runtime -Ikernels bench/native-call/dispatch-begin.cc \
//     native/src/runtime/*.cc native/src/runtime/ops/*.cc native/src/backends/host/*.cc -o /tmp/dispatch-begin -lpthread -ldl
//   /tmp/dispatch-begin [calls per round, 300000]
// Prints µs per call for 5 rounds. The cuda backend's part (its receive block, bench/results/
// native-call-2026-12-01.md) is not in it: the host backend adopts a routing without device memory.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "context.hpp"
#include "ops.hpp"

using namespace rankflow;

int main(int argc, char** argv) {
  const int T = 128, K = 8, H = 64, E = 256;
  ContextConfig cfg;
  cfg.ep.world_size = 1;
  cfg.ep.max_tokens_per_rank = T;
  cfg.ep.hidden = H;
  cfg.ep.topk = K;
  cfg.ep.num_experts = E;
  Context c(cfg, nullptr);
  std::vector<ExportedSegments> peers{c.backend().exported()};
  ops::register_window(c, peers);

  std::vector<uint16_t> x(T * H, 0x3f80);
  std::vector<int32_t> idx(T * K);
  for (int i = 0; i < T * K; ++i) idx[size_t(i)] = (i * 37) % E;
  std::vector<float> w(T * K, 0.125f);
  DispatchInput in;
  in.x = Mem{x.data(), false};
  in.topk_idx = Mem{idx.data(), false};
  in.topk_weights = Mem{w.data(), false};
  in.num_tokens = T;
  // The handle: a dispatch with a CPU sync, run to its end.
  auto origin = ops::dispatch_begin(c, in);
  ops::dispatch_counts(c, *origin, /*block=*/true);
  std::vector<uint16_t> ox(size_t(T) * H);
  std::vector<int32_t> oi(T * K), src_rank(T), src_token(T);
  std::vector<float> ow(T * K);
  DispatchOutput out;
  out.x = Mem{ox.data(), false};
  out.topk_idx = Mem{oi.data(), false};
  out.topk_weights = Mem{ow.data(), false};
  out.src_rank = Mem{src_rank.data(), false};
  out.src_token = Mem{src_token.data(), false};
  ops::dispatch_finish(c, *origin, in, out);

  DispatchInput cached = in;
  cached.topk_idx = Mem{};
  cached.topk_weights = Mem{};
  cached.handle = origin->id;
  const int n = argc > 1 ? std::atoi(argv[1]) : 300000;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) ops::dispatch_begin(c, cached)->complete = true;  // as its data phase leaves it
    const auto t1 = std::chrono::steady_clock::now();
    std::printf("ops::dispatch_begin with a handle, 256 handles live: %.3f us per call\n",
                std::chrono::duration<double, std::micro>(t1 - t0).count() / n);
  }
  return 0;
}
