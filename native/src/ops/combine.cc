// MoE combine on the host executor: every receiver returns its row for (source rank, source token)
// into the source's buffer at slot receiver * maxTokensPerRank + token; the source then reduces the
// rows of the ranks it sent the token to, in rank order, in fp32, adds the biases, and rounds to bf16.
#include <cstring>

#include "../moe_device.hpp"
#include "ops.hpp"

namespace rankflow::ops {

void combine(Context& c, const CombineInput& in, uint16_t* out_x, float* out_weights) {
  if (c.on_cuda()) {  // the kernels: native/src/gpu/moe.cc
    MoeDevice* m = c.device->moe();
    RF_CHECK(m != nullptr, "EINVAL", "combine is not available on this rank's device backend");
    return m->combine(in, out_x, out_weights);
  }
  auto l = c.layout(in.handle);
  RF_CHECK(l && l->complete, "EINVAL", "handle " + std::to_string(in.handle) + " is unknown or expired on rank " + std::to_string(c.rank()));
  const auto& cfg = c.cfg.ep;
  const int64_t K = cfg.topk, H = cfg.hidden, maxT = cfg.max_tokens_per_rank;
  const int W = c.world();
  const float* weights = in.topk_weights != nullptr ? in.topk_weights : l->recv_topk_weights.data();
  const uint32_t s = c.next_seq();
  c.announce(s);
  // Rows are grouped by source rank (the dispatch receive order), so each peer is waited on once.
  int64_t row = 0;
  for (int p = 0; p < W; ++p) {
    const int64_t n = l->recv_count[size_t(p)];
    if (n > 0) {
      c.wait_entered(p, s);
      uint8_t* dst = c.peer_buffer(p);
      for (int64_t j = 0; j < n; ++j, ++row) {
        const int64_t slot = int64_t(c.rank()) * maxT + l->recv_src_token[size_t(row)];
        std::memcpy(dst + c.buf.combine_x + slot * H * 2, in.x + row * H, size_t(H * 2));
        std::memcpy(dst + c.buf.combine_weights + slot * K * 4, weights + row * K, size_t(K * 4));
      }
    }
    if (p != c.rank()) store_release(c.peer_slot(p, c.ws.done), encode_signal(s, 0));
  }
  c.wait_all(c.ws.done, s, kPhaseCombineData, "done");
  const uint8_t* b = c.buffer();
  std::vector<float> acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < l->num_tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    float* w = out_weights + t * K;
    std::fill(w, w + K, 0.0f);
    const uint64_t mask = l->dest_mask[size_t(t)];
    for (int p = 0; p < W; ++p) {
      if (((mask >> p) & 1) == 0) continue;
      const int64_t slot = int64_t(p) * maxT + t;
      const auto* r = reinterpret_cast<const uint16_t*>(b + c.buf.combine_x + slot * H * 2);
      for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += bf16_to_float(r[h]);
      const auto* rw = reinterpret_cast<const float*>(b + c.buf.combine_weights + slot * K * 4);
      for (int64_t k = 0; k < K; ++k) w[k] += rw[k];
    }
    for (const uint16_t* bias : in.bias)
      if (bias != nullptr)
        for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += bf16_to_float(bias[t * H + h]);
    for (int64_t h = 0; h < H; ++h) out_x[t * H + h] = float_to_bf16(acc[size_t(h)]);
  }
}

}  // namespace rankflow::ops
