// GPU check of the MoE kernels against the host executor's rules, on a machine with 2 GPUs: 2 ranks in
// 2 threads, GPU-only symmetric memory, random routing (top-8 of 256 experts, some -1 slots, repeats),
// bf16 and fp8 dispatch (CPU sync with outputs copied out, no CPU sync with outputs in the buffer,
// cached), combine with 0, 1 and 2 biases; a rank with zero tokens; a rank that receives nothing.
// Every output is compared byte for byte with a reference computed here on the CPU:
//   dispatch: receive order by source rank, then source token; local expert ids (-1 elsewhere),
//             weights (0 elsewhere); tokens per expert count topk entries (the host's rule)
//   combine:  fp32 sum over the ranks a token went to in rank order, + bias0 + bias1, RNE to bf16
// Outputs are poisoned before every op, so an unwritten element fails too.
//   build: cmake -S native/test -B build/cuda-test && cmake --build build/cuda-test
//   run:   build/cuda-test/moe_smoke
#include <cstring>

#include "moe_harness.hpp"

namespace {

using namespace rftest;

constexpr int kWorld = 2;
constexpr int64_t kHidden = 7168, kTopk = 8, kExperts = 256, kMaxTokens = 1024;
constexpr int64_t kEpr = kExperts / kWorld;
constexpr int64_t kScales = kHidden / kFp8BlockSize;

enum class Mode { CpuSync, NoSync, Cached };

struct CaseSpec {
  const char* name;
  int64_t tokens[kWorld];
  bool fp8;
  Mode mode;
  int cached_from;      // case index whose layout a cached dispatch replays
  double p_unused;      // probability of a -1 slot
  bool only_rank0;      // every expert on rank 0
  bool combine_weights; // combine with given weights (else the dispatched ones)
  int biases;
  int num_sms;          // 0 = all
};

struct RankInput {
  int64_t T = 0;
  std::vector<uint8_t> x;
  std::vector<float> scales;
  std::vector<int32_t> idx;
  std::vector<float> w;
};

struct RefOut {
  int64_t num_recv = 0;
  std::vector<int64_t> recv_count, tokens_per_expert;
  std::vector<uint8_t> x;
  std::vector<float> scales;
  std::vector<int32_t> idx, src_rank, src_token;
  std::vector<float> w;
};

struct CaseData {
  CaseSpec spec;
  int64_t elem = 2;
  RankInput in[kWorld];
  RefOut ref[kWorld];
  std::vector<int64_t> row_at[kWorld];  // [T * W]: (my token t) -> its row at rank p, or -1
  // combine
  std::vector<uint16_t> comb_x[kWorld];  // [num_recv, H] at each rank
  std::vector<float> comb_w[kWorld];     // [num_recv, K] or empty
  std::vector<uint16_t> bias[kWorld][2]; // [T, H]
  std::vector<uint16_t> out_x[kWorld];   // [T, H]
  std::vector<float> out_w[kWorld];      // [T, K]
};

void make_inputs(CaseData& c, const CaseData* cached, uint64_t seed) {
  Rng rng(seed);
  c.elem = c.spec.fp8 ? 1 : 2;
  for (int r = 0; r < kWorld; ++r) {
    RankInput& in = c.in[r];
    in.T = c.spec.tokens[r];
    in.x.resize(size_t(in.T * kHidden * c.elem));
    for (auto& b : in.x) b = uint8_t(rng.next() >> 56);
    if (c.elem == 2)  // finite bf16 values (the bytes are copied as they are anyway)
      for (int64_t i = 0; i < in.T * kHidden; ++i) {
        const uint16_t v = rng.bf16();
        std::memcpy(&in.x[size_t(i * 2)], &v, 2);
      }
    if (c.spec.fp8) {
      in.scales.resize(size_t(in.T * kScales));
      for (auto& s : in.scales) s = rng.uniform() + 0.01f;
    }
    if (cached != nullptr) {
      in.idx = cached->in[r].idx;
    } else {
      in.idx.resize(size_t(in.T * kTopk));
      for (auto& e : in.idx) {
        if (rng.uniform() < c.spec.p_unused) e = -1;
        else e = int32_t(rng.below(c.spec.only_rank0 ? uint32_t(kEpr) : uint32_t(kExperts)));
      }
    }
    in.w.resize(size_t(in.T * kTopk));
    for (auto& w : in.w) w = rng.uniform();
  }
}

void make_reference(CaseData& c) {
  const int64_t row = kHidden * c.elem;
  for (int r = 0; r < kWorld; ++r) c.row_at[r].assign(size_t(c.in[r].T * kWorld), -1);
  for (int p = 0; p < kWorld; ++p) {
    RefOut& o = c.ref[p];
    o = RefOut();
    o.recv_count.assign(kWorld, 0);
    o.tokens_per_expert.assign(kEpr, 0);
    for (int r = 0; r < kWorld; ++r) {
      const RankInput& in = c.in[r];
      for (int64_t t = 0; t < in.T; ++t) {
        bool to_p = false;
        for (int64_t k = 0; k < kTopk; ++k) {
          const int32_t e = in.idx[size_t(t * kTopk + k)];
          if (e >= 0 && e / kEpr == p) {
            to_p = true;
            ++o.tokens_per_expert[size_t(e - p * kEpr)];
          }
        }
        if (!to_p) continue;
        c.row_at[r][size_t(t * kWorld + p)] = o.num_recv++;
        ++o.recv_count[size_t(r)];
        o.x.insert(o.x.end(), in.x.begin() + t * row, in.x.begin() + (t + 1) * row);
        if (c.spec.fp8) o.scales.insert(o.scales.end(), in.scales.begin() + t * kScales, in.scales.begin() + (t + 1) * kScales);
        for (int64_t k = 0; k < kTopk; ++k) {
          const int32_t e = in.idx[size_t(t * kTopk + k)];
          const bool mine = e >= 0 && e / kEpr == p;
          o.idx.push_back(mine ? int32_t(e - p * kEpr) : -1);
          o.w.push_back(mine ? in.w[size_t(t * kTopk + k)] : 0.0f);
        }
        o.src_rank.push_back(r);
        o.src_token.push_back(int32_t(t));
      }
    }
  }
}

void make_combine(CaseData& c, uint64_t seed) {
  Rng rng(seed);
  for (int p = 0; p < kWorld; ++p) {
    c.comb_x[p].resize(size_t(c.ref[p].num_recv * kHidden));
    for (auto& v : c.comb_x[p]) v = rng.bf16();
    c.comb_w[p].clear();
    if (c.spec.combine_weights) {
      c.comb_w[p].resize(size_t(c.ref[p].num_recv * kTopk));
      for (auto& w : c.comb_w[p]) w = rng.uniform();
    }
    for (int b = 0; b < 2; ++b) {
      c.bias[p][b].clear();
      if (b < c.spec.biases) {
        c.bias[p][b].resize(size_t(c.in[p].T * kHidden));
        for (auto& v : c.bias[p][b]) v = rng.bf16();
      }
    }
  }
  // The host executor's combine, for every rank r's tokens.
  for (int r = 0; r < kWorld; ++r) {
    const int64_t T = c.in[r].T;
    c.out_x[r].assign(size_t(T * kHidden), 0);
    c.out_w[r].assign(size_t(T * kTopk), 0.0f);
    std::vector<float> acc(static_cast<size_t>(kHidden));
    for (int64_t t = 0; t < T; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      float* w = &c.out_w[r][size_t(t * kTopk)];
      for (int p = 0; p < kWorld; ++p) {
        const int64_t o = c.row_at[r][size_t(t * kWorld + p)];
        if (o < 0) continue;
        for (int64_t h = 0; h < kHidden; ++h) acc[size_t(h)] += bf16_to_float(c.comb_x[p][size_t(o * kHidden + h)]);
        const std::vector<float>& ws = c.spec.combine_weights ? c.comb_w[p] : c.ref[p].w;
        for (int64_t k = 0; k < kTopk; ++k) w[k] += ws[size_t(o * kTopk + k)];
      }
      for (int b = 0; b < 2; ++b)
        if (!c.bias[r][b].empty())
          for (int64_t h = 0; h < kHidden; ++h) acc[size_t(h)] += bf16_to_float(c.bias[r][b][size_t(t * kHidden + h)]);
      for (int64_t h = 0; h < kHidden; ++h) c.out_x[r][size_t(t * kHidden + h)] = float_to_bf16(acc[size_t(h)]);
    }
  }
}

// First differing element of two arrays, or -1.
template <typename T>
int64_t first_diff(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) return int64_t(i);
  return -1;
}

template <typename T>
void expect_equal(int rank, const char* cname, const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  const int64_t d = first_diff(got, want);
  report(d < 0, "[rank %d] %s: %s (%zu elements)%s", rank, cname, what, want.size(),
         d < 0 ? " bit-exact" : (" differ from element " + std::to_string(d)).c_str());
}

void run_case(MoeRank& m, WorldShared& sh, std::vector<CaseData>& cases, int ci, std::vector<DeviceBuffer>& states,
              uint32_t& seq) {
  CaseData& c = cases[size_t(ci)];
  const int rank = m.rank;
  const RankInput& in = c.in[rank];
  const RefOut& ref = c.ref[rank];
  const char* cname = c.spec.name;
  const int64_t row = kHidden * c.elem;
  const int64_t S = c.spec.fp8 ? kScales : 0;
  const CUstream s = m.s();

  DeviceBuffer x(size_t(in.T * row)), scales(size_t(in.T * S * 4)), idx(size_t(in.T * kTopk * 4)),
      w(size_t(in.T * kTopk * 4));
  upload(x, in.x);
  upload(scales, in.scales);
  upload(idx, in.idx);
  upload(w, in.w);
  states[size_t(ci)].alloc(size_t(m.state_bytes));
  const CUdeviceptr state = states[size_t(ci)].ptr;
  // Poison the buffer (every output region) and the state: an unwritten element shows.
  RF_CU(cuMemsetD8Async, m.buffer(), 0xAB, size_t(m.buf.bytes), s);
  RF_CU(cuMemsetD8Async, state, 0xCD, size_t(m.state_bytes), s);
  RF_CU(cuStreamSynchronize, s);
  sh.rv.arrive();  // nobody writes into a buffer its owner is still poisoning

  moe::DispatchIn din;
  din.x = reinterpret_cast<const void*>(x.ptr);
  din.scales = c.spec.fp8 ? scales.as<float>() : nullptr;
  din.topk_idx = idx.as<int32_t>();
  din.topk_weights = w.as<float>();
  din.num_tokens = in.T;
  din.x_elem_bytes = int32_t(c.elem);

  const uint32_t dseq = ++seq;
  const moe::MoeArgs a = m.args(dseq);
  int64_t num_recv = ref.num_recv;
  DeviceBuffer ox, os, oi, ow, orank, otok;
  moe::DispatchOut dout;
  const bool copy_out = c.spec.mode != Mode::NoSync;
  if (c.spec.mode == Mode::Cached) {
    num_recv = ref.num_recv;  // known from the cached handle
  } else {
    launch_dispatch_notify(*m.kernels, s, a, state, idx.ptr, in.T, m.counts_device());
    if (c.spec.mode == Mode::CpuSync) {
      const HostDispatchCounts counts = m.wait_counts(dseq);
      num_recv = counts.num_recv;
      report(counts.num_recv == ref.num_recv && counts.recv_count == ref.recv_count &&
                 counts.tokens_per_expert == ref.tokens_per_expert,
             "[rank %d] %s: CPU-sync counts (num_recv %lld, want %lld; per rank and per expert)", rank, cname,
             (long long)counts.num_recv, (long long)ref.num_recv);
    }
  }
  if (copy_out) {
    ox.alloc(size_t(num_recv * row));
    os.alloc(size_t(num_recv * S * 4));
    oi.alloc(size_t(num_recv * kTopk * 4));
    ow.alloc(size_t(num_recv * kTopk * 4));
    orank.alloc(size_t(num_recv * 4));
    otok.alloc(size_t(num_recv * 4));
    for (DeviceBuffer* b : {&ox, &os, &oi, &ow, &orank, &otok}) RF_CU(cuMemsetD8Async, b->ptr, 0xEF, b->bytes, s);
    dout.x = reinterpret_cast<void*>(ox.ptr);
    dout.scales = c.spec.fp8 ? os.as<float>() : nullptr;
    dout.topk_idx = oi.as<int32_t>();
    dout.topk_weights = ow.as<float>();
    dout.src_rank = orank.as<int32_t>();
    dout.src_token = otok.as<int32_t>();
  }
  if (c.spec.mode == Mode::Cached)
    launch_dispatch_cached(*m.kernels, s, a, states[size_t(c.spec.cached_from)].ptr, state, din, dout, c.spec.num_sms,
                           m.sm_count());
  else
    launch_dispatch_data(*m.kernels, s, a, state, din, dout, c.spec.num_sms, m.sm_count());
  RF_CU(cuStreamSynchronize, s);

  const moe::MoeStateLayout sl = moe_state_layout(a);
  const std::vector<int32_t> offs = download<int32_t>(state + CUdeviceptr(sl.recv_offset), kWorld + 1);
  report(offs[kWorld] == ref.num_recv, "[rank %d] %s: num_recv on the device %d (want %lld)", rank, cname, offs[kWorld],
         (long long)ref.num_recv);
  const moe::DispatchOut where = copy_out ? dout : dispatch_outputs_in_buffer(a, m.mem.window(), state, c.spec.fp8);
  const size_t n = size_t(ref.num_recv);
  expect_equal(rank, cname, "x", download<uint8_t>(CUdeviceptr(where.x), n * size_t(row)), ref.x);
  if (c.spec.fp8) expect_equal(rank, cname, "scales", download<float>(CUdeviceptr(where.scales), n * size_t(S)), ref.scales);
  expect_equal(rank, cname, "topk_idx", download<int32_t>(CUdeviceptr(where.topk_idx), n * kTopk), ref.idx);
  expect_equal(rank, cname, "topk_weights", download<float>(CUdeviceptr(where.topk_weights), n * kTopk), ref.w);
  expect_equal(rank, cname, "src_rank", download<int32_t>(CUdeviceptr(where.src_rank), n), ref.src_rank);
  expect_equal(rank, cname, "src_token", download<int32_t>(CUdeviceptr(where.src_token), n), ref.src_token);
  sh.rv.arrive();

  // combine
  DeviceBuffer cx(c.comb_x[rank].size() * 2), cw(c.comb_w[rank].size() * 4), b0(c.bias[rank][0].size() * 2),
      b1(c.bias[rank][1].size() * 2), out_x(size_t(in.T * kHidden * 2)), out_w(size_t(in.T * kTopk * 4));
  upload(cx, c.comb_x[rank]);
  upload(cw, c.comb_w[rank]);
  upload(b0, c.bias[rank][0]);
  upload(b1, c.bias[rank][1]);
  RF_CU(cuMemsetD8Async, out_x.ptr, 0xEF, out_x.bytes, s);
  RF_CU(cuMemsetD8Async, out_w.ptr, 0xEF, out_w.bytes, s);
  moe::CombineIn cin;
  cin.x = cx.as<uint16_t>();
  cin.topk_weights = c.spec.combine_weights ? cw.as<float>() : nullptr;
  cin.bias0 = c.spec.biases >= 1 ? b0.as<uint16_t>() : nullptr;
  cin.bias1 = c.spec.biases >= 2 ? b1.as<uint16_t>() : nullptr;
  cin.num_tokens = in.T;
  moe::CombineOut cout;
  cout.x = out_x.as<uint16_t>();
  cout.topk_weights = out_w.as<float>();
  // Odd cases: every block sends, then reduces; even ones: half the blocks reduce as rows arrive.
  const int send_blocks = ci % 2 == 0 ? -1 : 0;
  launch_combine(*m.kernels, s, m.args(++seq), state, cin, cout, c.spec.num_sms, m.sm_count(), send_blocks);
  RF_CU(cuStreamSynchronize, s);
  char what[128];
  std::snprintf(what, sizeof(what), "combine x (%d bias%s, %s)", c.spec.biases, c.spec.biases == 1 ? "" : "es",
                send_blocks == 0 ? "send then reduce" : "split send/reduce");
  expect_equal(rank, cname, what, download<uint16_t>(out_x.ptr, size_t(in.T * kHidden)), c.out_x[rank]);
  expect_equal(rank, cname, c.spec.combine_weights ? "combine weights (given)" : "combine weights (dispatched)",
               download<float>(out_w.ptr, size_t(in.T * kTopk)), c.out_w[rank]);
  sh.rv.arrive();
}

}  // namespace

int main(int argc, char** argv) {
  (void)argc;
  std::string why;
  if (!driver_available(&why)) {
    report(false, "driver: %s", why.c_str());
    return 1;
  }
  if (driver().device_count < kWorld) {
    report(false, "need %d GPUs, the driver sees %d", kWorld, driver().device_count);
    return 1;
  }
  const CaseSpec specs[] = {
      {"bf16, CPU sync, outputs copied out", {1000, 777}, false, Mode::CpuSync, -1, 0.1, false, true, 0, 0},
      {"fp8, no CPU sync, outputs in the buffer", {513, 1024}, true, Mode::NoSync, -1, 0.05, false, false, 1, 3},
      {"bf16, cached (layout of the first case)", {1000, 777}, false, Mode::Cached, 0, 0, false, false, 2, 16},
      {"bf16, rank 1 has zero tokens", {300, 0}, false, Mode::CpuSync, -1, 0.2, false, true, 2, 1},
      {"bf16, every expert on rank 0 (rank 1 receives nothing)", {200, 150}, false, Mode::NoSync, -1, 0.3, true, false, 1, 7},
      {"fp8, cached (layout of the previous case)", {200, 150}, true, Mode::Cached, 4, 0, false, true, 0, 0},
  };
  std::vector<CaseData> cases;
  for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); ++i) {
    CaseData c;
    c.spec = specs[i];
    cases.push_back(std::move(c));
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const int from = cases[i].spec.cached_from;
    make_inputs(cases[i], from >= 0 ? &cases[size_t(from)] : nullptr, 1000 + i);
    make_reference(cases[i]);
    make_combine(cases[i], 2000 + i);
  }
  EpConfig ep;
  ep.world_size = kWorld;
  ep.max_tokens_per_rank = kMaxTokens;
  ep.hidden = kHidden;
  ep.topk = kTopk;
  ep.num_experts = kExperts;
  ep.fp8 = true;
  WorldShared sh(kWorld);
  run_ranks(kWorld, "moe", sh.rv, [&](int rank) {
    MoeRank m(rank, ep, sh);
    std::vector<DeviceBuffer> states(cases.size());
    uint32_t seq = 0;
    for (size_t i = 0; i < cases.size(); ++i) run_case(m, sh, cases, int(i), states, seq);
    sh.rv.arrive();  // nobody unmaps memory a peer may still touch
  });
  std::printf("%s: %s\n", argv[0], g_failed == 0 ? "ALL PASS" : (std::to_string(g_failed) + " FAILED").c_str());
  return g_failed == 0 ? 0 : 1;
}
