// MoE dispatch and combine of a CUDA rank: the host executor's three dispatch phases (ops/dispatch.cc)
// on the kernels of kernels/dispatch.cu and combine.cu through their launchers (cuda/moe_launch.hpp):
//   notify   launch_dispatch_notify: routing into the layout's device state, counts into every peer,
//            peers' counts mirrored into mapped host memory
//   cpuSync  poll_dispatch_counts on that mirror until ready (cpuSeconds -> TIMEOUT_CPU naming the
//            rank and counter; a peer's failure or teardown -> RANK_FAILED)
//   data     launch_dispatch_data (or launch_dispatch_cached for a handle's routing)
// Each dispatch layout (what a handle names) owns one device allocation: the kernels' state
// (MoeStateLayout), then its topk_idx and topk_weights (cached dispatch replays them). It lives as
// long as the Context keeps the layout (Context::kMaxLiveHandles) and is freed when the layout is
// evicted or dropped, or at destroy.
// Driver mode stages host tensors in device memory (combine's x never in the symmetric buffer) and
// copies results back; rank programs pass device addresses and nothing is synchronised at the end.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "../cuda/driver.hpp"
#include "../cuda/host_workspace.hpp"
#include "../cuda/moe_launch.hpp"
#include "../cuda/nccl.hpp"
#include "rank_gpu.hpp"

namespace rankflow::gpu {
namespace {

using cuda::driver;

std::string hex(uint64_t v) {
  char s[32];
  snprintf(s, sizeof s, "0x%016llx", static_cast<unsigned long long>(v));
  return s;
}

CUdeviceptr dev(const void* p) { return CUdeviceptr(reinterpret_cast<uintptr_t>(p)); }

// The device part of one dispatch layout.
struct DeviceLayout {
  CUdeviceptr base = 0;     // state, then topk_idx [maxT * K] int32, then topk_weights [maxT * K] fp32
  CUdeviceptr idx = 0, weights = 0;
  bool cached = false;      // made from a handle: the data kernel announces `enter` itself
  bool counts_known = false;
};

class CudaMoe final : public MoeDevice {
 public:
  explicit CudaMoe(RankGpu& g) : g_(g), c_(g.ctx()) {
    kernels_ = std::make_unique<cuda::MoeKernels>();
    const moe::MoeArgs a = args(1);
    state_ = cuda::moe_state_layout(a);
    topk_bytes_ = align_up(std::max<int64_t>(1, c_.cfg.ep.max_tokens_per_rank * c_.cfg.ep.topk * 4), kRegionAlignment);
    layout_bytes_ = align_up(state_.bytes, kRegionAlignment) + 2 * topk_bytes_;
    counts_.create(cuda::host_counts_bytes(a));  // zeroed once; each op's seq tells its counts apart
    RF_CU(cuEventCreate, &op_start_, CU_EVENT_DEFAULT);
    RF_CU(cuEventCreate, &op_end_, CU_EVENT_DEFAULT);
  }
  ~CudaMoe() override { destroy(); }

  uint32_t dispatch_notify(const ops::DispatchInput& in) override {
    g_.check_alive("dispatch");
    const auto& ep = c_.cfg.ep;
    const int64_t K = ep.topk, T = in.num_tokens;
    RF_CHECK(T <= ep.max_tokens_per_rank, "EINVAL",
             "x has " + std::to_string(T) + " tokens, above buffer.maxTokensPerRank (" +
                 std::to_string(ep.max_tokens_per_rank) + ")");
    RF_CHECK(c_.buf.bytes <= c_.buffer_bytes(), "EINVAL",
             "dispatch needs a buffer of " + std::to_string(c_.buf.bytes) + " bytes after the workspace; buffer.bytes gives " +
                 std::to_string(c_.buffer_bytes()) + " (use sizeHint(), " + std::to_string(size_hint(ep)) + " bytes)");
    std::shared_ptr<DispatchLayout> cached;
    if (in.cached_handle != 0) {
      cached = c_.layout(in.cached_handle);
      RF_CHECK(cached && cached->complete && layouts_.count(in.cached_handle), "EINVAL",
               "handle " + std::to_string(in.cached_handle) + " is unknown or expired on rank " + std::to_string(c_.rank()));
      RF_CHECK(cached->num_tokens == T, "EINVAL", "x has " + std::to_string(T) +
               " tokens but the handle was made for " + std::to_string(cached->num_tokens));
    }
    auto l = c_.add_layout();
    DeviceLayout d;
    translating(c_.rank(), [&] {
      d.base = alloc(layout_bytes_);
      d.idx = d.base + CUdeviceptr(align_up(state_.bytes, kRegionAlignment));
      d.weights = d.idx + CUdeviceptr(topk_bytes_);
    });
    layouts_[l->id] = d;
    l->seq = c_.next_seq();
    l->expert_alignment = in.expert_alignment;
    l->num_tokens = T;
    DeviceLayout& dl = layouts_[l->id];
    const CUstream s = g_.stream();
    const size_t tk = size_t(T * K * 4);
    translating(c_.rank(), [&] {
      RF_CU(cuEventRecord, op_start_, s);
      if (cached) {
        // Cached mode (seed 6.1): the routing part of the handle's state and its topk_idx; counts known.
        DeviceLayout& from = layouts_[in.cached_handle];
        learn_counts(*cached, from);
        l->recv_count = cached->recv_count;
        l->tokens_per_expert = cached->tokens_per_expert;
        l->num_recv = cached->num_recv;
        dl.cached = dl.counts_known = true;
        RF_CU_FOR("cached dispatch: routing of the handle", cuMemcpyAsync, dl.base, from.base, size_t(state_.routing_bytes), s);
        if (tk > 0) {
          RF_CU(cuMemcpyAsync, dl.idx, from.idx, tk, s);
          if (in.topk_weights == nullptr) RF_CU(cuMemcpyAsync, dl.weights, from.weights, tk, s);
          else copy_in(dl.weights, in.topk_weights, tk, in.device);
        }
        sweep();
        return;
      }
      if (tk > 0) {
        copy_in(dl.idx, in.topk_idx, tk, in.device);
        if (in.topk_weights != nullptr) copy_in(dl.weights, in.topk_weights, tk, in.device);
        else RF_CU(cuMemsetD8Async, dl.weights, 0, tk, s);
      }
      cuda::launch_dispatch_notify(*kernels_, s, args(l->seq), dl.base, dl.idx, T, counts_.device());
    });
    sweep();  // after the cached handle (possibly just evicted) was read
    return l->id;
  }

  ops::DispatchCounts dispatch_wait(uint32_t id) override {
    auto l = c_.layout(id);
    RF_CHECK(l != nullptr && layouts_.count(id), "EINVAL", "dispatch layout " + std::to_string(id) + " is unknown");
    DeviceLayout& d = layouts_[id];
    if (!d.counts_known) {
      wait_counts(*l);
      d.counts_known = true;
    }
    ops::DispatchCounts out;
    out.num_recv = l->num_recv;
    for (const int64_t n : l->tokens_per_expert) out.tokens_per_expert.push_back(align_up(n, l->expert_alignment));
    return out;
  }

  void dispatch_data(uint32_t id, const ops::DispatchInput& in, ops::DispatchOutput& out) override {
    g_.check_alive("dispatch");
    auto l = c_.layout(id);
    RF_CHECK(l != nullptr && layouts_.count(id), "EINVAL", "dispatch layout " + std::to_string(id) + " is unknown");
    DeviceLayout& d = layouts_[id];
    const auto& ep = c_.cfg.ep;
    const int64_t T = l->num_tokens, row = ep.hidden * in.x_elem_bytes, S = c_.buf.scales_per_token;
    const bool with_scales = in.scales != nullptr;
    RF_CHECK(in.device || d.counts_known, "EINVAL", "dispatch data before the CPU-sync wait (driver mode needs the counts)");
    const CUstream s = g_.stream();
    const moe::MoeArgs a = args(l->seq);
    moe::DispatchIn din;
    din.topk_idx = reinterpret_cast<const int32_t*>(d.idx);
    din.topk_weights = reinterpret_cast<const float*>(d.weights);
    din.num_tokens = T;
    din.x_elem_bytes = int32_t(in.x_elem_bytes);
    moe::DispatchOut dout;
    translating(c_.rank(), [&] {
      if (in.device) {
        din.x = in.x;
        din.scales = in.scales;
        if (!out.in_buffer) {
          dout.x = out.x;
          dout.scales = out.scales;
          dout.topk_idx = out.topk_idx;
          dout.topk_weights = out.topk_weights;
          dout.src_rank = out.src_rank;
          dout.src_token = out.src_token;
        }
      } else {
        // Driver mode: x and scales staged; the outputs stay in the buffer and are copied out below.
        const int64_t xb = align_up(T * row, kRegionAlignment);
        const CUdeviceptr st = staging(xb + T * S * 4);
        if (T > 0) RF_CU(cuMemcpyHtoDAsync, st, in.x, size_t(T * row), s);
        if (with_scales && T > 0) RF_CU(cuMemcpyHtoDAsync, st + CUdeviceptr(xb), in.scales, size_t(T * S * 4), s);
        din.x = reinterpret_cast<const void*>(st);
        din.scales = with_scales ? reinterpret_cast<const float*>(st + CUdeviceptr(xb)) : nullptr;
      }
      if (d.cached)
        cuda::launch_dispatch_cached(*kernels_, s, a, d.base, d.base, din, dout, in.num_sms, g_.sms());
      else
        cuda::launch_dispatch_data(*kernels_, s, a, d.base, din, dout, in.num_sms, g_.sms());
      RF_CU(cuEventRecord, op_end_, s);
    });
    l->complete = true;
    if (in.device && !out.in_buffer) return;
    const moe::DispatchOut where = cuda::dispatch_outputs_in_buffer(a, g_.window_of(c_.rank()), d.base, with_scales);
    if (in.device) {  // outputs in the buffer: their addresses
      out.x = static_cast<uint8_t*>(where.x);
      out.scales = where.scales;
      out.topk_idx = where.topk_idx;
      out.topk_weights = where.topk_weights;
      out.src_rank = where.src_rank;
      out.src_token = where.src_token;
      return;
    }
    g_.sync_stream(l->seq);
    const int64_t R = l->num_recv, K = ep.topk;
    translating(c_.rank(), [&] {
      auto down = [&](void* dst, const void* src, int64_t n) {
        if (n > 0 && dst != nullptr) RF_CU(cuMemcpyDtoHAsync, dst, dev(src), size_t(n), s);
      };
      down(out.x, where.x, R * row);
      if (with_scales) down(out.scales, where.scales, R * S * 4);
      down(out.topk_idx, where.topk_idx, R * K * 4);
      down(out.topk_weights, where.topk_weights, R * K * 4);
      down(out.src_rank, where.src_rank, R * 4);
      down(out.src_token, where.src_token, R * 4);
    });
    g_.sync_stream(l->seq);
  }

  void combine(const ops::CombineInput& in, uint16_t* out_x, float* out_w) override {
    g_.check_alive("combine");
    auto l = c_.layout(in.handle);
    RF_CHECK(l && l->complete && layouts_.count(in.handle), "EINVAL",
             "handle " + std::to_string(in.handle) + " is unknown or expired on rank " + std::to_string(c_.rank()));
    DeviceLayout& d = layouts_[in.handle];
    const auto& ep = c_.cfg.ep;
    const int64_t H = ep.hidden, K = ep.topk, T = l->num_tokens;
    const CUstream s = g_.stream();
    moe::CombineIn cin;
    cin.num_tokens = T;
    moe::CombineOut cout;
    if (in.device) {
      const CUdeviceptr lo = g_.window_of(0), hi = g_.window_of(c_.world() - 1) + CUdeviceptr(g_.window_stride());
      const CUdeviceptr x = dev(in.x);
      RF_CHECK(x == 0 || x < lo || x >= hi, "EINVAL",
               "combine: x lies in the symmetric buffer (peers write there during the combine); copy it into a "
               "tensor of its own first (e.g. from an outputsInBuffer dispatch)");
      cin.x = in.x;
      cin.topk_weights = in.topk_weights;
      cin.bias0 = in.bias[0];
      cin.bias1 = in.bias[1];
      cout.x = out_x;
      cout.topk_weights = out_w;
    } else {
      RF_CHECK(d.counts_known, "EINVAL", "combine: the handle's receive counts are unknown");
      const int64_t R = l->num_recv;
      const int64_t xb = align_up(R * H * 2, kRegionAlignment), wb = align_up(R * K * 4, kRegionAlignment),
                    bb = align_up(T * H * 2, kRegionAlignment), ob = align_up(T * H * 2, kRegionAlignment);
      const CUdeviceptr st = staging(xb + wb + 2 * bb + ob + T * K * 4);
      translating(c_.rank(), [&] {
        auto up = [&](CUdeviceptr dst, const void* src, int64_t n) {
          if (n > 0) RF_CU(cuMemcpyHtoDAsync, dst, src, size_t(n), s);
        };
        up(st, in.x, R * H * 2);
        if (in.topk_weights != nullptr) up(st + CUdeviceptr(xb), in.topk_weights, R * K * 4);
        for (int b = 0; b < 2; ++b)
          if (in.bias[b] != nullptr) up(st + CUdeviceptr(xb + wb + b * bb), in.bias[b], T * H * 2);
      });
      cin.x = reinterpret_cast<const uint16_t*>(st);
      cin.topk_weights = in.topk_weights != nullptr ? reinterpret_cast<const float*>(st + CUdeviceptr(xb)) : nullptr;
      cin.bias0 = in.bias[0] != nullptr ? reinterpret_cast<const uint16_t*>(st + CUdeviceptr(xb + wb)) : nullptr;
      cin.bias1 = in.bias[1] != nullptr ? reinterpret_cast<const uint16_t*>(st + CUdeviceptr(xb + wb + bb)) : nullptr;
      cout.x = reinterpret_cast<uint16_t*>(st + CUdeviceptr(xb + wb + 2 * bb));
      cout.topk_weights = reinterpret_cast<float*>(st + CUdeviceptr(xb + wb + 2 * bb + ob));
    }
    const uint32_t seq = c_.next_seq();
    translating(c_.rank(), [&] {
      RF_CU(cuEventRecord, op_start_, s);
      cuda::launch_combine(*kernels_, s, args(seq), d.base, cin, cout, in.num_sms, g_.sms());
      RF_CU(cuEventRecord, op_end_, s);
    });
    if (in.device) return;
    g_.sync_stream(seq);
    translating(c_.rank(), [&] {
      if (T > 0) {
        RF_CU(cuMemcpyDtoHAsync, out_x, dev(cout.x), size_t(T * H * 2), s);
        RF_CU(cuMemcpyDtoHAsync, out_w, dev(cout.topk_weights), size_t(T * K * 4), s);
      }
    });
    g_.sync_stream(seq);
  }

  uint64_t alloc(int64_t bytes) override {
    const int64_t n = align_up(std::max<int64_t>(bytes, 1), kRegionAlignment);
    auto it = pool_.find(n);
    CUdeviceptr p = 0;
    if (it != pool_.end()) {
      p = it->second;
      pool_.erase(it);
      pooled_bytes_ -= n;
    } else {
      translating(c_.rank(), [&] { RF_CU_FOR("device tensor of " + std::to_string(bytes) + " bytes", cuMemAlloc, &p, size_t(n)); });
    }
    live_[p] = n;
    return uint64_t(p);
  }

  // Freed memory goes back to a pool of its size (a later tensor of that size reuses it without
  // cuMemFree's device-wide synchronisation), up to 4 GiB; the rest is freed.
  void free(uint64_t ptr) override {
    auto it = live_.find(CUdeviceptr(ptr));
    RF_CHECK(it != live_.end(), "EINVAL", "free: not a live device tensor of rank " + std::to_string(c_.rank()));
    const int64_t n = it->second;
    live_.erase(it);
    if (pooled_bytes_ + n <= (int64_t(4) << 30)) {
      pool_.emplace(n, CUdeviceptr(ptr));
      pooled_bytes_ += n;
    } else {
      translating(c_.rank(), [&] { RF_CU(cuMemFree, CUdeviceptr(ptr)); });
    }
  }

  void upload(uint64_t dst, const void* src, int64_t bytes) override {
    g_.check_alive("tensor upload");
    if (bytes > 0) translating(c_.rank(), [&] { RF_CU(cuMemcpyHtoDAsync, CUdeviceptr(dst), src, size_t(bytes), g_.stream()); });
  }

  void download(void* dst, uint64_t src, int64_t bytes) override {
    g_.check_alive("tensor download");
    g_.sync_stream(c_.seq);
    if (bytes > 0) translating(c_.rank(), [&] { RF_CU(cuMemcpyDtoHAsync, dst, CUdeviceptr(src), size_t(bytes), g_.stream()); });
    g_.sync_stream(c_.seq);
  }

  void sync() override {
    g_.check_alive("sync");
    g_.sync_stream(c_.seq);
  }

  uint64_t record_event() override {
    g_.check_alive("event");
    CUevent e = nullptr;
    translating(c_.rank(), [&] {
      RF_CU(cuEventCreate, &e, CU_EVENT_DEFAULT);
      RF_CU(cuEventRecord, e, g_.stream());
    });
    events_.insert(e);
    return uint64_t(reinterpret_cast<uintptr_t>(e));
  }

  double elapsed_ms(uint64_t start, uint64_t end) override {
    auto* a = reinterpret_cast<CUevent>(uintptr_t(start));
    auto* b = reinterpret_cast<CUevent>(uintptr_t(end));
    RF_CHECK(events_.count(a) && events_.count(b), "EINVAL", "elapsedMs: not events of this rank");
    g_.sync_stream(c_.seq);
    float ms = 0;
    translating(c_.rank(), [&] { RF_CU(cuEventElapsedTime, &ms, a, b); });
    return double(ms);
  }

  void destroy_event(uint64_t event) override {
    auto* e = reinterpret_cast<CUevent>(uintptr_t(event));
    if (events_.erase(e)) driver().cuEventDestroy(e);
  }

  double bench_all_to_all(int64_t bytes, int iters, int warmup) override {
    g_.check_alive("benchAlltoAll");
    auto* comm = static_cast<cuda::ncclComm_t>(g_.nccl_comm());
    RF_CHECK(comm != nullptr, "EINVAL", "benchAlltoAll: this rank has no NCCL communicator");
    const int W = c_.world();
    const int64_t per_peer = align_up(std::max<int64_t>(bytes / W, 1), 16);
    const uint64_t send = alloc(per_peer * W), recv = alloc(per_peer * W);
    const CUstream s = g_.stream();
    auto one = [&] { RF_NCCL(ncclAlltoAll, reinterpret_cast<void*>(send), reinterpret_cast<void*>(recv), size_t(per_peer), cuda::ncclUint8, comm, s); };
    const double ms = timed(one, iters, warmup);
    free(send);
    free(recv);
    return ms;
  }

  double bench_peer_copy(int64_t bytes, int iters, int warmup) override {
    g_.check_alive("benchPeerCopy");
    const int peer = (c_.rank() + 1) % c_.world();
    RF_CHECK(bytes <= c_.buffer_bytes(), "EINVAL", "benchPeerCopy: more bytes than the peer's buffer");
    const uint64_t src = alloc(bytes);
    const CUdeviceptr dst = g_.window_of(peer) + CUdeviceptr(c_.ws.bytes);
    const CUstream s = g_.stream();
    translating(c_.rank(), [&] { RF_CU(cuMemsetD8Async, CUdeviceptr(src), 0, size_t(bytes), s); });
    auto one = [&] { RF_CU(cuMemcpyAsync, dst, CUdeviceptr(src), size_t(bytes), s); };
    const double ms = timed(one, iters, warmup);
    free(src);
    return ms;
  }

  int sm_count() const override { return g_.sms(); }

  double last_op_ms() override {
    g_.sync_stream(c_.seq);
    float ms = 0;
    translating(c_.rank(), [&] { RF_CU(cuEventElapsedTime, &ms, op_start_, op_end_); });
    return double(ms);
  }

  void destroy() noexcept override {
    const cuda::Driver* d = nullptr;
    try {
      d = &driver();
    } catch (...) {
      return;
    }
    for (CUevent e : events_) d->cuEventDestroy(e);
    events_.clear();
    for (CUevent* e : {&op_start_, &op_end_})
      if (*e != nullptr) d->cuEventDestroy(*e), *e = nullptr;
    for (auto& [id, l] : layouts_) live_.erase(l.base), d->cuMemFree(l.base);
    layouts_.clear();
    for (auto& [p, n] : live_) d->cuMemFree(p);
    live_.clear();
    for (auto& [n, p] : pool_) d->cuMemFree(p);
    pool_.clear();
    pooled_bytes_ = 0;
    if (staging_ != 0) d->cuMemFree(staging_);
    staging_ = 0;
    counts_.destroy();
    kernels_.reset();
  }

 private:
  moe::MoeArgs args(uint32_t seq) const {
    return cuda::moe_args(g_.peer_table(), 0, c_.ws, c_.buf, c_.cfg.ep, c_.rank(), seq,
                          uint64_t(c_.cfg.gpu_timeout_s * 1e9), g_.diag(), g_.arrivals());
  }

  void copy_in(CUdeviceptr dst, const void* src, size_t n, bool device) {
    if (device) RF_CU(cuMemcpyAsync, dst, dev(src), n, g_.stream());
    else RF_CU(cuMemcpyHtoDAsync, dst, src, n, g_.stream());
  }

  // Driver-mode staging in device memory (grown on demand; every driver-mode op syncs before returning).
  CUdeviceptr staging(int64_t bytes) {
    if (bytes > staging_bytes_) {
      translating(c_.rank(), [&] {
        if (staging_ != 0) RF_CU(cuMemFree, staging_);
        staging_ = 0;
        staging_bytes_ = 0;
        const int64_t n = align_up(bytes, kAlignment);
        RF_CU_FOR("driver-mode staging of " + std::to_string(n) + " bytes", cuMemAlloc, &staging_, size_t(n));
        staging_bytes_ = n;
      });
    }
    return staging_;
  }

  // Device state of layouts the Context no longer keeps (evicted past kMaxLiveHandles, abandoned).
  void sweep() {
    for (auto it = layouts_.begin(); it != layouts_.end();) {
      if (c_.layout(it->first) != nullptr) {
        ++it;
        continue;
      }
      free(uint64_t(it->second.base));
      it = layouts_.erase(it);
    }
  }

  // A handle whose dispatch skipped the CPU sync (outputs in the buffer): its counts from the state.
  void learn_counts(DispatchLayout& l, DeviceLayout& d) {
    if (d.counts_known) return;
    g_.sync_stream(l.seq);
    const int W = c_.world();
    const int64_t epr = c_.cfg.ep.num_experts / W;
    std::vector<int32_t> rc(static_cast<size_t>(W)), tpe(static_cast<size_t>(epr));
    RF_CU(cuMemcpyDtoH, rc.data(), d.base + CUdeviceptr(state_.recv_count), size_t(W * 4));
    RF_CU(cuMemcpyDtoH, tpe.data(), d.base + CUdeviceptr(state_.tokens_per_expert), size_t(epr * 4));
    l.recv_count.assign(rc.begin(), rc.end());
    l.tokens_per_expert.assign(tpe.begin(), tpe.end());
    l.num_recv = 0;
    for (const int32_t n : rc) l.num_recv += n;
    d.counts_known = true;
  }

  // The CPU-sync wait: polls the mapped mirror the notify kernel fills, with the CPU timeout.
  void wait_counts(DispatchLayout& l) {
    using clock = std::chrono::steady_clock;
    const int W = c_.world();
    const int epr = int(c_.cfg.ep.num_experts / W);
    const auto start = clock::now();
    cuda::HostDispatchCounts hc;
    for (uint64_t spin = 0;; ++spin) {
      if (cuda::poll_dispatch_counts(counts_.host(), W, epr, l.seq, &hc)) break;
      if ((spin & 63) == 63) {
        const CUresult r = driver().cuStreamQuery(g_.stream());
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) g_.sync_stream(l.seq);  // throws TIMEOUT_GPU / RANK_FAILED
      }
      const int failed = c_.abort.failed_rank.load(std::memory_order_relaxed);
      if (failed >= 0 || c_.abort.stopping.load(std::memory_order_relaxed)) {
        // The notify kernel may still wait for the peer: this rank's protocol state is gone.
        g_.mark_dead(failed >= 0 ? "rank " + std::to_string(failed) + " failed during a dispatch" : "shut down during a dispatch");
        if (failed >= 0)
          throw Error("RANK_FAILED",
                      "rank " + std::to_string(failed) + " failed while rank " + std::to_string(c_.rank()) +
                          " waited in dispatch (CPU sync) on its counts",
                      failed, phase_name(kPhaseNotify));
        throw Error("RANK_FAILED", "rank " + std::to_string(c_.rank()) + " is shutting down", c_.rank(), phase_name(kPhaseNotify));
      }
      const double waited = std::chrono::duration<double>(clock::now() - start).count();
      if (waited > c_.cfg.cpu_timeout_s) {
        // Name the first counter that is missing: rank counts go last, so look at those first.
        const auto* words = static_cast<const uint64_t*>(counts_.host());
        int peer = 0;
        std::string counter = "rank_count";
        uint64_t last = 0;
        bool found = false;
        for (int p = 0; p < W && !found; ++p) {
          last = __atomic_load_n(words + p, __ATOMIC_ACQUIRE);
          if (!(signal_seq(last) == l.seq && signal_has_payload(last))) peer = p, found = true;
        }
        for (int64_t i = 0; i < int64_t(W) * epr && !found; ++i) {
          last = __atomic_load_n(words + W + i, __ATOMIC_ACQUIRE);
          if (!(signal_seq(last) == l.seq && signal_has_payload(last)))
            peer = int(i / epr), counter = "expert_count[" + std::to_string(i % epr) + "]", found = true;
        }
        g_.mark_dead("a dispatch's CPU-sync wait timed out while its notify kernel still waits");
        throw Error("TIMEOUT_CPU",
                    "CPU-sync wait of rank " + std::to_string(c_.rank()) + " in " + phase_name(kPhaseNotify) +
                        " timed out after " + seconds_text(c_.cfg.cpu_timeout_s) + " s on counter " + counter +
                        "[from rank " + std::to_string(peer) + "] (last value " + hex(last) + ")",
                    peer, phase_name(kPhaseNotify));
      }
      if (spin < 2048) continue;
      if (waited < 0.002) sched_yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(waited > 0.05 ? 100 : 5));
    }
    l.recv_count = hc.recv_count;
    l.tokens_per_expert = hc.tokens_per_expert;
    l.num_recv = hc.num_recv;
  }

  template <typename F>
  double timed(F&& one, int iters, int warmup) {
    translating(c_.rank(), [&] {
      for (int i = 0; i < warmup; ++i) one();
    });
    const uint64_t b = record_event();
    translating(c_.rank(), [&] {
      for (int i = 0; i < iters; ++i) one();
    });
    const uint64_t e = record_event();
    const double ms = elapsed_ms(b, e) / std::max(1, iters);
    destroy_event(b);
    destroy_event(e);
    return ms;
  }

  RankGpu& g_;
  Context& c_;
  std::unique_ptr<cuda::MoeKernels> kernels_;
  moe::MoeStateLayout state_;
  int64_t topk_bytes_ = 0, layout_bytes_ = 0;
  cuda::HostWorkspace counts_;
  std::map<uint32_t, DeviceLayout> layouts_;
  std::map<CUdeviceptr, int64_t> live_;
  std::multimap<int64_t, CUdeviceptr> pool_;
  int64_t pooled_bytes_ = 0;
  CUdeviceptr staging_ = 0;
  int64_t staging_bytes_ = 0;
  std::set<CUevent> events_;
  CUevent op_start_ = nullptr, op_end_ = nullptr;
};

}  // namespace

std::unique_ptr<MoeDevice> make_cuda_moe(RankGpu& g) { return std::make_unique<CudaMoe>(g); }

}  // namespace rankflow::gpu
