// Benchmark of the MoE kernels on 2 GPUs, side by side in one run with NCCL's all-to-all moving the
// same bytes and the copy engine (cuMemcpyAsync into the peer's window: the link's practical limit).
// 2 ranks in 2 threads; device-resident tensors; CUDA-event timing after warm-up, back-to-back
// iterations (the ranks pace each other through the kernels' signals), median of 5 repeats.
// Sizes: 4096 x 7168 top-8 of 256 experts (DeepEP's headline case) in bf16 and fp8, 512 and 128
// tokens (decode); an SM sweep of the 4096-token bf16 case.
// Metric (DeepEP's): bytes a rank receives, its own tokens included, over the time of the op
// (dispatch: received rows x row bytes (+ fp8 scales); combine: the same rows sent back).
// Prints a table, then the JSON of every figure (also written to $OUT/moe_bench.json when OUT is set).
//   run: build/cuda-test/moe_bench
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include "cuda/nccl.hpp"
#include "moe_harness.hpp"

namespace {

using namespace rftest;

constexpr int kWorld = 2;
constexpr int64_t kHidden = 7168, kTopk = 8, kExperts = 256, kMaxTokens = 4096;
constexpr int64_t kScales = kHidden / kFp8BlockSize;
constexpr int kRepeats = 5;

struct Figure {
  std::string size, op;
  int sms = 0;
  double us[kWorld] = {0, 0};
  double bytes[kWorld] = {0, 0};         // DeepEP metric bytes (received incl. local)
  double remote_bytes[kWorld] = {0, 0};  // bytes over the link, per direction
};

std::mutex g_fig_mutex;
std::vector<Figure> g_figs;

void add_figure(int rank, const std::string& size, const std::string& op, int sms, double us, double bytes,
                double remote) {
  std::lock_guard<std::mutex> lock(g_fig_mutex);
  for (Figure& f : g_figs)
    if (f.size == size && f.op == op && f.sms == sms) {
      f.us[rank] = us;
      f.bytes[rank] = bytes;
      f.remote_bytes[rank] = remote;
      return;
    }
  Figure f;
  f.size = size;
  f.op = op;
  f.sms = sms;
  f.us[rank] = us;
  f.bytes[rank] = bytes;
  f.remote_bytes[rank] = remote;
  g_figs.push_back(f);
}

// Averages over the ranks that recorded the figure (one-way copies record rank 0 only).
double avg(const double* v, const Figure& f) {
  double s = 0;
  int n = 0;
  for (int r = 0; r < kWorld; ++r)
    if (f.us[r] > 0) {
      s += v[r];
      ++n;
    }
  return n > 0 ? s / n : 0;
}
double avg_us(const Figure& f) { return avg(f.us, f); }
double gbps(const Figure& f) {
  double v[kWorld];
  for (int r = 0; r < kWorld; ++r) v[r] = f.us[r] > 0 ? f.bytes[r] / (f.us[r] * 1e3) : 0;
  return avg(v, f);
}
double remote_gbps(const Figure& f) {
  double v[kWorld];
  for (int r = 0; r < kWorld; ++r) v[r] = f.us[r] > 0 ? f.remote_bytes[r] / (f.us[r] * 1e3) : 0;
  return avg(v, f);
}
const Figure* find(const std::string& size, const std::string& op, int sms = 0) {
  for (const Figure& f : g_figs)
    if (f.size == size && f.op == op && f.sms == sms) return &f;
  return nullptr;
}

// fn() `iters` times back to back, both ranks starting together; median over repeats of the mean, in us.
double time_loop(MoeRank& m, WorldShared& sh, int iters, const std::function<void()>& fn) {
  Event e0, e1;
  std::vector<double> means;
  for (int rep = 0; rep < kRepeats; ++rep) {
    RF_CU(cuStreamSynchronize, m.s());
    sh.rv.arrive();
    RF_CU(cuEventRecord, e0.e, m.s());
    for (int i = 0; i < iters; ++i) fn();
    RF_CU(cuEventRecord, e1.e, m.s());
    RF_CU(cuStreamSynchronize, m.s());
    float ms = 0;
    RF_CU(cuEventElapsedTime, &ms, e0.e, e1.e);
    means.push_back(1000.0 * ms / iters);
  }
  std::sort(means.begin(), means.end());
  sh.rv.arrive();
  return means[means.size() / 2];
}

struct Shared {
  explicit Shared(int w) : world(w) {}
  WorldShared world;
  ncclUniqueId nccl_id = {};
};

void bench_rank(int rank, const EpConfig& ep, Shared& shared) {
  WorldShared& sh = shared.world;
  MoeRank m(rank, ep, sh);
  const CUstream s = m.s();
  uint32_t seq = 0;
  const int all_sms = m.sm_count();
  if (rank == 0) info("GPU: %s, %d SMs; buffer %lld MiB per rank", m.dev.name().c_str(), all_sms, (long long)(m.buf.bytes >> 20));

  // NCCL
  const bool with_nccl = nccl_available();
  ncclComm_t comm = nullptr;
  if (with_nccl) {
    if (rank == 0) RF_NCCL(ncclGetUniqueId, &shared.nccl_id);
    sh.rv.arrive();
    RF_NCCL(ncclCommInitRank, &comm, kWorld, shared.nccl_id, rank);
  }

  // Inputs: random bf16 / fp8 rows, scales, top-8 of 256 distinct experts per token, weights.
  Rng rng(77 + uint64_t(rank));
  const int64_t T = kMaxTokens;
  std::vector<uint16_t> hx(size_t(T * kHidden));
  for (auto& v : hx) v = rng.bf16();
  std::vector<float> hs(size_t(T * kScales)), hw(size_t(T * kTopk));
  for (auto& v : hs) v = rng.uniform() + 0.01f;
  for (auto& v : hw) v = rng.uniform();
  std::vector<int32_t> hidx(size_t(T * kTopk));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < kTopk; ++k) {
      int32_t e;
      bool dup;
      do {
        e = int32_t(rng.below(uint32_t(kExperts)));
        dup = false;
        for (int64_t j = 0; j < k; ++j) dup |= hidx[size_t(t * kTopk + j)] == e;
      } while (dup);
      hidx[size_t(t * kTopk + k)] = e;
    }
  DeviceBuffer x(size_t(T * kHidden * 2)), scales(hs.size() * 4), idx(hidx.size() * 4), w(hw.size() * 4);
  upload(x, hx);
  upload(scales, hs);
  upload(idx, hidx);
  upload(w, hw);
  const int64_t max_recv = kWorld * kMaxTokens;
  DeviceBuffer ox(size_t(max_recv * kHidden * 2)), os(size_t(max_recv * kScales * 4)), oi(size_t(max_recv * kTopk * 4)),
      ow(size_t(max_recv * kTopk * 4)), orank(size_t(max_recv * 4)), otok(size_t(max_recv * 4));
  DeviceBuffer cx(size_t(max_recv * kHidden * 2)), out_x(size_t(T * kHidden * 2)), out_w(size_t(T * kTopk * 4));
  {
    std::vector<uint16_t> hc(size_t(max_recv * kHidden));
    for (auto& v : hc) v = rng.bf16();
    upload(cx, hc);
  }
  DeviceBuffer state(size_t(m.state_bytes));
  DeviceBuffer a2a_send(size_t(kWorld * T * kHidden * 2)), a2a_recv(size_t(kWorld * T * kHidden * 2));
  RF_CU(cuMemsetD8Async, a2a_send.ptr, 0x3c, a2a_send.bytes, s);
  RF_CU(cuStreamSynchronize, s);

  struct Size {
    const char* name;
    int64_t tokens;
    bool fp8;
  };
  const Size sizes[] = {{"4096 bf16", 4096, false}, {"4096 fp8", 4096, true}, {"512 bf16", 512, false},
                        {"128 bf16", 128, false}};
  for (const Size& sz : sizes) {
    const int64_t elem = sz.fp8 ? 1 : 2;
    const int64_t S = sz.fp8 ? kScales : 0;
    const int64_t row = kHidden * elem;
    const int64_t row_bytes = row + S * 4;  // DeepEP's fp8 factor: x + scales
    moe::DispatchIn din;
    din.x = reinterpret_cast<const void*>(x.ptr);  // fp8 rows: the first T*H bytes, random bits
    din.scales = sz.fp8 ? scales.as<float>() : nullptr;
    din.topk_idx = idx.as<int32_t>();
    din.topk_weights = w.as<float>();
    din.num_tokens = sz.tokens;
    din.x_elem_bytes = int32_t(elem);
    moe::DispatchOut user;
    user.x = reinterpret_cast<void*>(ox.ptr);
    user.scales = sz.fp8 ? os.as<float>() : nullptr;
    user.topk_idx = oi.as<int32_t>();
    user.topk_weights = ow.as<float>();
    user.src_rank = orank.as<int32_t>();
    user.src_token = otok.as<int32_t>();
    const moe::DispatchOut in_buffer{};
    moe::CombineIn cin;
    cin.x = cx.as<uint16_t>();
    cin.num_tokens = sz.tokens;
    moe::CombineOut cout;
    cout.x = out_x.as<uint16_t>();
    cout.topk_weights = out_w.as<float>();

    auto dispatch_cpu_sync = [&](int sms) {
      const moe::MoeArgs a = m.args(++seq);
      launch_dispatch_notify(*m.kernels, s, a, state.ptr, idx.ptr, sz.tokens, m.counts_device());
      m.wait_counts(a.seq);
      launch_dispatch_data(*m.kernels, s, a, state.ptr, din, user, sms, all_sms);
    };
    auto dispatch_no_sync = [&](int sms) {
      const moe::MoeArgs a = m.args(++seq);
      launch_dispatch_notify(*m.kernels, s, a, state.ptr, idx.ptr, sz.tokens, 0);
      launch_dispatch_data(*m.kernels, s, a, state.ptr, din, in_buffer, sms, all_sms);
    };
    auto dispatch_cached = [&](int sms, bool copy_out) {
      launch_dispatch_cached(*m.kernels, s, m.args(++seq), state.ptr, state.ptr, din, copy_out ? user : in_buffer, sms,
                             all_sms);
    };
    auto combine = [&](int sms, int send_blocks = -1) {
      launch_combine(*m.kernels, s, m.args(++seq), state.ptr, cin, cout, sms, all_sms, send_blocks);
    };

    // Warm-up, and the counts of this routing.
    for (int i = 0; i < 3; ++i) {
      dispatch_cpu_sync(0);
      combine(0);
    }
    RF_CU(cuStreamSynchronize, s);
    const moe::MoeArgs a0 = m.args(1);
    const moe::MoeStateLayout sl = moe_state_layout(a0);
    const std::vector<int32_t> recv_count = download<int32_t>(state.ptr + CUdeviceptr(sl.recv_count), kWorld);
    const std::vector<int32_t> send_count = download<int32_t>(state.ptr + CUdeviceptr(sl.send_count), kWorld);
    int64_t num_recv = 0, remote_recv = 0, remote_send = 0;
    for (int p = 0; p < kWorld; ++p) {
      num_recv += recv_count[size_t(p)];
      if (p != rank) {
        remote_recv += recv_count[size_t(p)];
        remote_send += send_count[size_t(p)];
      }
    }
    const double d_bytes = double(num_recv) * double(row_bytes), d_remote = double(remote_recv) * double(row_bytes);
    const double c_bytes = double(num_recv) * double(kHidden * 2), c_remote = double(remote_recv) * double(kHidden * 2);
    const int iters = sz.tokens >= 4096 ? 20 : 50;
    sh.rv.arrive();

    add_figure(rank, sz.name, "dispatch (CPU sync, outputs copied out)", 0,
               time_loop(m, sh, iters, [&] { dispatch_cpu_sync(0); }), d_bytes, d_remote);
    add_figure(rank, sz.name, "dispatch (no CPU sync, outputs in buffer)", 0,
               time_loop(m, sh, iters, [&] { dispatch_no_sync(0); }), d_bytes, d_remote);
    add_figure(rank, sz.name, "dispatch (cached, outputs in buffer)", 0,
               time_loop(m, sh, iters, [&] { dispatch_cached(0, false); }), d_bytes, d_remote);
    add_figure(rank, sz.name, "dispatch (cached, outputs copied out)", 0,
               time_loop(m, sh, iters, [&] { dispatch_cached(0, true); }), d_bytes, d_remote);
    add_figure(rank, sz.name, "dispatch notify only", 0,
               time_loop(m, sh, iters, [&] {
                 launch_dispatch_notify(*m.kernels, s, m.args(++seq), state.ptr, idx.ptr, sz.tokens, 0);
               }),
               0, 0);
    // the layout for combine again (notify-only ops left the routing in place, but keep it plain)
    dispatch_cpu_sync(0);
    add_figure(rank, sz.name, "combine", 0, time_loop(m, sh, iters, [&] { combine(0); }), c_bytes, c_remote);
    add_figure(rank, sz.name, "combine (send, then reduce)", 0, time_loop(m, sh, iters, [&] { combine(0, 0); }),
               c_bytes, c_remote);
    std::vector<int> sweep;
    if (sz.tokens == 4096 && !sz.fp8) sweep = {8, 16, 24, 32, 48, 64, 96, 132};
    if (sz.tokens < 4096) sweep = {8, 16, 32, 64};
    for (int sms : sweep) {
      if (sms > all_sms) continue;
      add_figure(rank, sz.name, "dispatch (cached, outputs in buffer)", sms,
                 time_loop(m, sh, iters, [&] { dispatch_cached(sms, false); }), d_bytes, d_remote);
      add_figure(rank, sz.name, "dispatch (no CPU sync, outputs in buffer)", sms,
                 time_loop(m, sh, iters, [&] { dispatch_no_sync(sms); }), d_bytes, d_remote);
      add_figure(rank, sz.name, "combine", sms, time_loop(m, sh, iters, [&] { combine(sms); }), c_bytes, c_remote);
      add_figure(rank, sz.name, "combine (send, then reduce)", sms, time_loop(m, sh, iters, [&] { combine(sms, 0); }),
                 c_bytes, c_remote);
      if (sz.tokens == 4096 && (sms == 24 || sms == 132))
        for (int twelfths : {3, 5, 6}) {
          const std::string op = "combine (" + std::to_string(twelfths) + "/12 of the blocks send)";
          add_figure(rank, sz.name, op, sms,
                     time_loop(m, sh, iters, [&] { combine(sms, std::max(1, sms * twelfths / 12)); }), c_bytes, c_remote);
        }
    }
    // NCCL all-to-all of the same bytes: every rank sends tokens x row bytes to every rank (itself too).
    const int64_t per_peer = sz.tokens * row_bytes;
    if (with_nccl) {
      auto a2a = [&] {
        RF_NCCL(ncclAlltoAll, reinterpret_cast<const void*>(a2a_send.ptr), reinterpret_cast<void*>(a2a_recv.ptr),
                size_t(per_peer), ncclUint8, comm, s);
      };
      for (int i = 0; i < 3; ++i) a2a();
      add_figure(rank, sz.name, "NCCL all-to-all", 0, time_loop(m, sh, iters, a2a), double(kWorld * per_peer),
                 double((kWorld - 1) * per_peer));
    }
    // Copy engine into the peer's window (its buffer), both ways at once, then one way (rank 0 only).
    const int peer = (rank + 1) % kWorld;
    const int64_t ce_bytes = remote_send * row;
    auto ce = [&] { RF_CU(cuMemcpyAsync, m.peer_buffer(peer), x.ptr, size_t(ce_bytes), s); };
    for (int i = 0; i < 3; ++i) ce();
    add_figure(rank, sz.name, "copy engine, both ways", 0, time_loop(m, sh, iters, ce), 0, double(ce_bytes));
    const double one_way = time_loop(m, sh, iters, [&] {
      if (rank == 0) ce();
    });
    if (rank == 0) add_figure(rank, sz.name, "copy engine, one way", 0, one_way, 0, double(ce_bytes));
    RF_CU(cuStreamSynchronize, s);
    sh.rv.arrive();
  }
  if (comm != nullptr) RF_NCCL(ncclCommDestroy, comm);
  sh.rv.arrive();
}

void print_results() {
  // DeepEP V1 (24 SMs) and NCCL from shared/device/README.md, for the table's last column.
  const std::map<std::string, double> deepep_us = {
      {"4096 bf16/dispatch", 336}, {"4096 fp8/dispatch", 255}, {"4096 bf16/combine", 390},
      {"512 bf16/dispatch", 62.3}, {"512 bf16/combine", 72.2}, {"128 bf16/dispatch", 33.9},
      {"128 bf16/combine", 42.2}};
  info("\n%-10s %-44s %4s %9s %9s %9s %7s %7s %9s", "size", "op", "SMs", "us", "GB/s*", "remote", "xNCCL", "xCE",
       "xDeepEP");
  for (const Figure& f : g_figs) {
    const Figure* nccl = find(f.size, "NCCL all-to-all");
    const Figure* ce = find(f.size, "copy engine, both ways");
    const double us = avg_us(f);
    const bool data = f.op.rfind("dispatch (", 0) == 0 || f.op.rfind("combine", 0) == 0;
    const std::string kind = f.op.rfind("combine", 0) == 0 ? "combine" : "dispatch";
    char xn[32] = "", xc[32] = "", xd[32] = "";
    if (data && nccl != nullptr) std::snprintf(xn, sizeof(xn), "%.2f", avg_us(*nccl) / us);
    if (data && ce != nullptr) std::snprintf(xc, sizeof(xc), "%.2f", remote_gbps(f) / remote_gbps(*ce));
    const std::string key = f.size.substr(0, f.size.find(' ')) + (f.size.find("fp8") != std::string::npos ? " fp8/" : " bf16/") + kind;
    const auto it = deepep_us.find(key);
    if (data && it != deepep_us.end()) std::snprintf(xd, sizeof(xd), "%.2f", it->second / us);
    info("%-10s %-44s %4s %9.1f %9.1f %9.1f %7s %7s %9s", f.size.c_str(), f.op.c_str(),
         f.sms ? std::to_string(f.sms).c_str() : "all", us, gbps(f), remote_gbps(f), xn, xc, xd);
  }
  info("GB/s* = DeepEP's metric: bytes received incl. local / time (rank average); remote = bytes over the link per "
       "direction / time; xNCCL = NCCL all-to-all time of the same bytes / this time; xCE = remote GB/s / copy engine "
       "both-ways GB/s per direction; xDeepEP = DeepEP V1 (24 SMs, shared/device/README.md) time / this time.");
  std::ostringstream js;
  js << "{\"figures\": [\n";
  for (size_t i = 0; i < g_figs.size(); ++i) {
    const Figure& f = g_figs[i];
    char line[1024];
    std::snprintf(line, sizeof(line),
                  "  {\"size\": \"%s\", \"op\": \"%s\", \"sms\": %d, \"us\": %.2f, \"us_rank\": [%.2f, %.2f], "
                  "\"gbps_deepep_metric\": %.1f, \"gbps_remote\": %.1f, \"bytes_rank\": [%.0f, %.0f], "
                  "\"remote_bytes_rank\": [%.0f, %.0f]}%s\n",
                  f.size.c_str(), f.op.c_str(), f.sms, avg_us(f), f.us[0], f.us[1], gbps(f), remote_gbps(f), f.bytes[0],
                  f.bytes[1], f.remote_bytes[0], f.remote_bytes[1], i + 1 < g_figs.size() ? "," : "");
    js << line;
  }
  js << "]}\n";
  std::printf("JSON %s", js.str().c_str());
  if (const char* out = std::getenv("OUT")) {
    const std::string path = std::string(out) + "/moe_bench.json";
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::fputs(js.str().c_str(), f);
      std::fclose(f);
    }
  }
}

}  // namespace

int main() {
  std::string why;
  if (!driver_available(&why) || driver().device_count < kWorld) {
    report(false, "need %d GPUs: %s", kWorld, why.c_str());
    return 1;
  }
  EpConfig ep;
  ep.world_size = kWorld;
  ep.max_tokens_per_rank = kMaxTokens;
  ep.hidden = kHidden;
  ep.topk = kTopk;
  ep.num_experts = kExperts;
  ep.fp8 = true;
  Shared shared(kWorld);
  run_ranks(kWorld, "bench", shared.world.rv, [&](int rank) { bench_rank(rank, ep, shared); });
  if (g_failed != 0) return 1;
  print_results();
  return 0;
}
