// MoE dispatch and combine on GPUs: the host executor's steps (backends/host/moe.cc) on the kernels of
// kernels/notify.cu, dispatch.cu and combine.cu:
//   notify  rf_dispatch_notify: routing into the layout's device state, counts into every peer, the
//           peers' counts mirrored into mapped host memory
//   counts  the CPU-sync wait: a spin on that mirror (cpuSeconds -> TIMEOUT_CPU naming the rank and
//           counter; an abort -> RANK_FAILED once the kernels let go)
//   data    rf_dispatch_data (with a handle's routing: the kernel announces `enter` itself)
// Without a CPU sync (device inputs, outputs in the buffer) notify and data are one kernel,
// rf_dispatch_fused, launched by dispatch_data (RANKFLOW_FUSED_DISPATCH=0: the two kernels).
// Each layout owns its receive state, but a cached dispatch that sends the origin's weights shares the
// origin's (the same routing and weights give the same source tokens, weights and offsets: the data
// kernel leaves it as it is, instead of copying the other ranks' rows' tokens and weights after `done`);
// its routing (and the topk it was made from) is shared with the cached dispatches that replay it.
// Driver mode stages host tensors in device memory and copies the results back; rank programs pass
// device addresses and nothing waits at the end.
#include <algorithm>
#include <string>

#include "backend.hpp"
#include "driver.hpp"
#include "faults.hpp"

namespace rankflow::cuda {

kargs::MoeShape CudaBackend::moe_shape() const {
  const EpConfig& ep = c_.cfg.ep;
  kargs::MoeShape m;
  m.hidden = int32_t(ep.hidden);
  m.topk = int32_t(ep.topk);
  m.num_experts = int32_t(ep.num_experts);
  m.experts_per_rank = int32_t(c_.experts_per_rank());
  m.max_tokens = ep.max_tokens_per_rank;
  m.buf = c_.buf;
  return m;
}

kargs::MoeState CudaBackend::state_of(const CudaLayout& l) const {
  const kargs::MoeStateLayout& L = state_layout_;
  kargs::MoeState s = L.at(uint64_t(l.routing->ptr));
  const uint64_t recv = uint64_t(l.recv->ptr);
  s.recv_src_token = reinterpret_cast<int32_t*>(recv + uint64_t(L.recv_src_token - L.routing_bytes));
  s.recv_topk_weights = reinterpret_cast<float*>(recv + uint64_t(L.recv_topk_weights - L.routing_bytes));
  s.send_offset = reinterpret_cast<int32_t*>(recv + uint64_t(L.send_offset - L.routing_bytes));
  return s;
}

CudaLayout& CudaBackend::layout_of(DispatchLayout& l) const {
  RF_CHECK(l.state != nullptr, "EINVAL", "dispatch layout " + std::to_string(l.id) + " has no device state");
  return static_cast<CudaLayout&>(*l.state);
}

std::unique_ptr<CudaLayout> CudaBackend::new_layout_state(DispatchLayout& l, bool own_routing, std::shared_ptr<DeviceBlock> shared_recv,
                                                          bool own_weights) {
  std::unique_ptr<CudaLayout> st(static_cast<CudaLayout*>(l.state.release()));
  std::shared_ptr<DeviceBlock> routing, recv, weights;
  if (st != nullptr) {
    if (st->recv.use_count() == 1) recv = std::move(st->recv);
    if (own_routing && st->routing.use_count() == 1) routing = std::move(st->routing);
    if (own_weights && st->weights_block.use_count() == 1) weights = std::move(st->weights_block);
    *st = CudaLayout{};
  } else {
    st = std::make_unique<CudaLayout>();
  }
  // Every block of a kind has the same size: the rank's MoeStateLayout, its topk copies and its scratch.
  st->recv = shared_recv != nullptr ? std::move(shared_recv)
             : recv != nullptr          ? std::move(recv)
                               : std::make_shared<DeviceBlock>(pool_, state_layout_.bytes - state_layout_.routing_bytes,
                                                               "dispatch receive state");
  if (own_weights)
    st->weights_block = weights != nullptr ? std::move(weights) : std::make_shared<DeviceBlock>(pool_, topk_bytes_, "cached dispatch weights");
  if (own_routing) {
    // The routing state, the topk copies, then the notify grid's scratch (used inside the kernel only).
    st->routing = routing != nullptr ? std::move(routing)
                                     : std::make_shared<DeviceBlock>(pool_,
                                                                     align_up(state_layout_.routing_bytes, kRegionAlignment) +
                                                                         2 * topk_bytes_ + notify_scratch_.bytes,
                                                                     "dispatch routing");
  }
  return st;
}

void CudaBackend::keep_for_graph(const CudaLayout& l) {
  if (!capturing_) return;
  capture_.keep.push_back(l.routing);
  capture_.keep.push_back(l.recv);
  if (l.weights_block != nullptr) capture_.keep.push_back(l.weights_block);
}

void CudaBackend::dispatch_notify(uint64_t seq, DispatchLayout& l, const DispatchInput& in) {
  const int64_t K = c_.cfg.ep.topk, T = in.num_tokens;
  const size_t tk = size_t(T * K * 4);
  std::unique_ptr<CudaLayout> st;
  translating(rank(), [&] {
    st = new_layout_state(l, /*own_routing=*/true);
    st->idx = st->routing->ptr + CUdeviceptr(align_up(state_layout_.routing_bytes, kRegionAlignment));
    st->weights = st->idx + CUdeviceptr(topk_bytes_);
    // The handle keeps the topk it was made from (a cached dispatch without weights replays them): the
    // notify kernel copies device tensors as it reads them; host tensors are staged into the copies.
    // Fused (below), the op's first device work is dispatch_data's launch: the events go around that.
    const bool fused = fuses() && !in.cpu_sync && in.x.device && (tk == 0 || (in.topk_idx.device && in.topk_weights.device));
    if (!fused) time_start();
    kargs::NotifyArgs a;
    if (tk > 0) {
      if (in.topk_idx.device) {
        a.topk_idx = in.topk_idx.as<const int32_t>();
        a.keep_idx = reinterpret_cast<int32_t*>(st->idx);
      } else {
        from_host(st->idx, in.topk_idx.ptr, int64_t(tk));
        a.topk_idx = reinterpret_cast<const int32_t*>(st->idx);
      }
      if (in.topk_weights.device) {
        a.topk_weights = in.topk_weights.as<const float>();
        a.keep_weights = reinterpret_cast<float*>(st->weights);
      } else {
        from_host(st->weights, in.topk_weights.ptr, int64_t(tk));
      }
    }
    a.r = rank_args(seq);
    a.m = moe_shape();
    a.st = state_of(*st);
    a.num_tokens = T;
    // Counts for the CPU only when it will wait for them: a dispatch without a CPU sync skips the
    // mapped-memory writes and their system fences (~2 us of a notify).
    a.host_counts = in.cpu_sync ? reinterpret_cast<uint64_t*>(counts_dev_) : nullptr;
    st->mirrored = in.cpu_sync;
    a.fingerprint = l.fingerprint;
    // Elastic: the slots dropped for a dead rank's expert are counted by the kernel; the CPU learns
    // them with the counts (dispatch_counts), and without a CPU sync does not (-1) unless none can be.
    l.masked_slots = c_.whole() ? 0 : -1;
    if (notify_scratch_.bytes > 0) {
      a.scratch = reinterpret_cast<uint8_t*>(st->weights + CUdeviceptr(topk_bytes_));
      a.scratch_blocks = notify_scratch_.blocks;
    }
    // Without a CPU sync nothing comes between the notify and the data phase: with device inputs both
    // run as one kernel, launched by dispatch_data (the copies start as soon as the offsets are known,
    // instead of after the notify kernel's end).
    if (fused) {
      a.fused_scratch = reinterpret_cast<uint8_t*>(fused_scratch_);
      a.fused_blocks = fused_blocks_;
      st->fused = true;
      st->notify = a;
    } else {
      launch_->dispatch_notify(stream_, a);
    }
  });
  l.state = std::move(st);
}

// A cached dispatch: the origin's routing and topk ids. Its weights: new ones, which the data kernel
// keeps in a block of this layout as it sends them (a cached dispatch of this handle replays them);
// or the origin's, with the origin's receive state (new_layout_state).
void CudaBackend::adopt_routing(DispatchLayout& l, const DispatchLayout& from, bool new_weights) {
  const auto& origin = static_cast<const CudaLayout&>(*from.state);
  std::unique_ptr<CudaLayout> st;
  translating(rank(), [&] { st = new_layout_state(l, /*own_routing=*/false, new_weights ? nullptr : origin.recv, new_weights); });
  st->routing = origin.routing;
  st->idx = origin.idx;
  st->keeps_weights = new_weights;
  if (!new_weights) st->weights_block = origin.weights_block;
  st->weights = new_weights ? st->weights_block->ptr : origin.weights;
  st->cached = true;
  keep_for_graph(*st);
  l.state = std::move(st);
}

bool CudaBackend::dispatch_counts(DispatchLayout& l, bool block) {
  RF_CHECK(layout_of(l).mirrored, "STATE",
           "dispatch: its counts are unknown to the CPU (the dispatch that made its handle ran without a CPU sync); "
           "dispatch with outputsInBuffer, or make the handle with a dispatch that syncs");
  const int W = world();
  const int64_t epr = c_.experts_per_rank();
  const uint64_t* words = counts_host_;
  auto seq_of = [&](int64_t pair) { return __atomic_load_n(words + 2 * pair, __ATOMIC_ACQUIRE); };
  // Rank counts are written last: once they are all there, so are the expert counts. Elastic: only
  // the live ranks' (the notify kernel writes a dead rank's as 0, but nothing here waits for it).
  const uint64_t live = c_.live_mask;
  auto arrived = [&] {
    for (int p = 0; p < W; ++p)
      if (rank_live(live, p) && seq_of(p) != l.seq) return false;
    return true;
  };
  if (!block && !spin_for(c_.rules.spin_ns, arrived)) return false;
  if (!arrived()) {
    const Driver& d = driver();
    bool aborted = false, finished = false, released = false, left = false;
    uint32_t polls = 0;
    WaitRules r = c_.rules;
    r.abort = nullptr;  // passed on to the kernels below
    try {
      wait_until(r, WaitSite{kPhaseNotify, -1, "rank_count"}, WaitKind::Cpu, [&] {
        if (arrived()) return true;
        if (!aborted && abort_raised()) {
          aborted = true;
          mirror_abort();
        }
        if (!released && released_now()) {
          released = true;
          mirror_abort();
        }
        if (!left && c_.abort.left_rank() >= 0) {  // elastic: a peer left; the op ends (wait_stream says so)
          left = true;
          mirror_abort();
        }
        if ((++polls & 63) == 0) {  // the notify kernel finished without the counts: it gave up
          const CUresult q = d.cuStreamQuery(stream_);
          if (q == CUDA_SUCCESS) return finished = true;
          if (q != CUDA_ERROR_NOT_READY) fail_stream(q);
        }
        return false;
      }, [] { return uint64_t(0); });
    } catch (const Error& e) {
      if (e.code != "TIMEOUT_CPU") throw;
      // Name the first counter that is missing: rank counts go last, so look at those first.
      int peer = 0;
      std::string counter = "rank_count";
      uint64_t last = 0;
      bool found = false;
      for (int p = 0; p < W && !found; ++p)
        if (rank_live(live, p) && (last = seq_of(p)) != l.seq) peer = p, found = true;
      for (int64_t i = 0; i < int64_t(W) * epr && !found; ++i)
        if (rank_live(live, int(i / epr)) && (last = seq_of(W + i)) != l.seq) peer = int(i / epr), counter = "expert_count[" + std::to_string(i % epr) + "]", found = true;
      // The notify kernel may still wait for the peer: let it go, and the rank's protocol state is gone.
      mark_dead("a dispatch's CPU-sync wait timed out while its notify kernel still waited");
      c_.abort.stop();
      mirror_abort();
      throw Error("TIMEOUT_CPU",
                  "CPU-sync wait of rank " + std::to_string(rank()) + " in " + phase_name(kPhaseNotify) + " timed out after " +
                      seconds_text(c_.cfg.cpu_timeout_s) + " s on counter " + counter + "[from rank " +
                      std::to_string(peer) + "] (last value " + hex_text(last) + ")",
                  peer, phase_name(kPhaseNotify));
    }
    if (aborted || finished || released || left) {
      wait_stream(WaitSite{kPhaseNotify, -1, "rank_count"});  // throws: the abort, the release, or the notify's timeout
      if (!arrived()) {
        if (abort_raised()) throw abort_error(c_.rules, WaitSite{kPhaseNotify, -1, "rank_count"});
        mark_dead("a dispatch notify ended without the peers' counts");
        throw Error("TIMEOUT_GPU", "rank " + std::to_string(rank()) + "'s dispatch notify ended without the peers' counts",
                    rank(), phase_name(kPhaseNotify));
      }
    }
  }
  // A bad expert id is reported once the op has run to its end (dispatch_data): the peers' data
  // phases wait for this rank's, so refusing here would leave them hanging.
  check_gave_up();
  auto k = std::make_shared<RecvCounts>();
  k->per_rank.assign(size_t(W), 0);
  k->per_expert.assign(size_t(epr), 0);
  for (int p = 0; p < W; ++p) {
    if (!rank_live(live, p)) continue;
    k->per_rank[size_t(p)] = int64_t(words[2 * p + 1]);
    for (int64_t e = 0; e < epr; ++e) k->per_expert[size_t(e)] += int64_t(words[2 * (W + p * epr + e) + 1]);
  }
  // The notify counted the slots it dropped for a dead rank's expert (kargs::host_counts_words).
  l.masked_slots = int64_t(words[2 * (W + W * epr) + 1]);
  l.set_counts(std::move(k));
  return true;
}

void CudaBackend::dispatch_data(uint64_t seq, DispatchLayout& l, const DispatchInput& in, DispatchOutput& out) {
  CudaLayout& st = layout_of(l);
  const EpConfig& ep = c_.cfg.ep;
  const int64_t T = l.num_tokens, K = ep.topk, row = ep.hidden * in.x_elem_bytes, S = c_.buf.scales_per_token;
  const bool with_scales = bool(in.scales);
  kargs::DispatchIn din;
  // Fused with its notify (dispatch_notify fuses only a dispatch without a CPU sync, of device inputs,
  // whose outputs stay in the buffer; the launcher checks the outputs), the data phase reads the
  // inputs' topk: the routing's copies are being written by the other blocks of the same kernel.
  const bool fuse = st.fused;
  din.topk_idx = fuse ? st.notify.topk_idx : reinterpret_cast<const int32_t*>(st.idx);
  din.topk_weights = fuse ? st.notify.topk_weights : reinterpret_cast<const float*>(st.weights);
  din.num_tokens = T;
  din.x_elem_bytes = int32_t(in.x_elem_bytes);
  kargs::DispatchOut dout;
  translating(rank(), [&] {
    if (st.cached || fuse) time_start();  // a cached or fused dispatch's first device work is here
    if (!in.x.device) {
      // Driver mode: x, scales and new weights staged; the outputs stay in the buffer, copied out below.
      const int64_t xb = align_up(T * row, kRegionAlignment), sb = align_up(T * S * 4, kRegionAlignment);
      staging(xb + sb + T * K * 4 + 16);
      din.x = stage_in(in.x, T * row, 0).ptr;
      din.scales = with_scales ? stage_in(in.scales, T * S * 4, xb).as<const float>() : nullptr;
      if (in.topk_weights && st.cached) din.topk_weights = stage_in(in.topk_weights, T * K * 4, xb + sb).as<const float>();
    } else {
      din.x = in.x.ptr;
      din.scales = in.scales.as<const float>();
      if (in.topk_weights && st.cached) din.topk_weights = in.topk_weights.as<const float>();
      if (!out.in_buffer) {
        dout.x = out.x.ptr;
        dout.scales = out.scales.as<float>();
        dout.topk_idx = out.topk_idx.as<int32_t>();
        dout.topk_weights = out.topk_weights.as<float>();
        dout.src_rank = out.src_rank.as<int32_t>();
        dout.src_token = out.src_token.as<int32_t>();
      }
    }
    kargs::DispatchArgs a;
    a.r = rank_args(seq);
    a.m = moe_shape();
    a.st = state_of(st);
    a.in = din;
    a.out = dout;
    a.fingerprint = l.fingerprint;
    a.announce = st.cached ? 1 : 0;
    a.keep_state = st.cached && !st.keeps_weights ? 1 : 0;  // the origin's recv (adopt_routing)
    a.keep_weights = st.keeps_weights ? reinterpret_cast<float*>(st.weights) : nullptr;
    if (fuse) {
      kargs::FusedDispatchArgs f;
      f.notify = st.notify;
      f.data = a;
      launch_->dispatch_fused(stream_, f, in.num_sms);
      ++fused_dispatches_;
    } else {
      launch_->dispatch_data(stream_, a, in.num_sms);
    }
    time_end();
  });
  keep_for_graph(st);
  if (!capturing_ && l.counts_known) check_refused();  // the notify that saw it finished: its report is there
  const uint64_t b = uint64_t(mem_.window()) + uint64_t(c_.ws.bytes);
  auto region = [&](int64_t off) { return Mem{ptr(CUdeviceptr(b + uint64_t(off))), true}; };
  if (in.x.device) {
    if (out.in_buffer) {  // the outputs are the buffer's regions: the same addresses after every dispatch
      out.x = region(c_.buf.x);
      out.scales = with_scales ? region(c_.buf.scales) : Mem{};
      out.topk_idx = region(c_.buf.topk_idx);
      out.topk_weights = region(c_.buf.topk_weights);
      out.src_rank = region(c_.buf.src_rank);
      out.src_token = region(c_.buf.src_token);
    }
    return;
  }
  wait_stream(WaitSite{kPhaseDispatchData, -1, "done"});
  const int64_t R = l.num_recv;
  translating(rank(), [&] {
    auto down = [&](Mem dst, int64_t off, int64_t n) {
      if (n > 0 && dst) RF_CU(cuMemcpyDtoHAsync, dst.ptr, CUdeviceptr(b + uint64_t(off)), size_t(n), stream_);
    };
    down(out.x, c_.buf.x, R * row);
    if (with_scales) down(out.scales, c_.buf.scales, R * S * 4);
    down(out.topk_idx, c_.buf.topk_idx, R * K * 4);
    down(out.topk_weights, c_.buf.topk_weights, R * K * 4);
    down(out.src_rank, c_.buf.src_rank, R * 4);
    down(out.src_token, c_.buf.src_token, R * 4);
  });
  wait_stream(WaitSite{kPhaseDispatchData, -1, "done"});
}

void CudaBackend::combine(uint64_t seq, DispatchLayout& l, const CombineInput& in, const CombineOutput& out) {
  CudaLayout& st = layout_of(l);
  const EpConfig& ep = c_.cfg.ep;
  const int64_t H = ep.hidden, K = ep.topk, T = l.num_tokens;
  kargs::CombineIn cin;
  cin.num_tokens = T;
  kargs::CombineOut cout;
  const bool device = in.x.device;
  if (device) {
    const CUdeviceptr lo = mem_.peer_base(0), hi = mem_.peer_base(world() - 1) + CUdeviceptr(mem_.stride());
    const CUdeviceptr x = dev(in.x.ptr);
    RF_CHECK(x == 0 || x < lo || x >= hi, "EINVAL",
             "combine: x lies in the symmetric buffer (peers write there during the combine); copy it into a "
             "tensor of its own first (e.g. from an outputsInBuffer dispatch)");
    cin.x = in.x.as<const uint16_t>();
    cin.topk_weights = in.topk_weights.as<const float>();
    cin.bias0 = in.bias[0].as<const uint16_t>();
    cin.bias1 = in.bias[1].as<const uint16_t>();
    cout.x = out.x.as<uint16_t>();
    cout.topk_weights = out.topk_weights.as<float>();
  } else {
    const int64_t R = l.num_recv;
    const int64_t xb = align_up(R * H * 2, kRegionAlignment), wb = align_up(R * K * 4, kRegionAlignment),
                  bb = align_up(T * H * 2, kRegionAlignment), ob = align_up(T * H * 2, kRegionAlignment);
    const CUdeviceptr s = staging(xb + wb + 2 * bb + ob + T * K * 4 + 16);
    cin.x = stage_in(in.x, R * H * 2, 0).as<const uint16_t>();
    cin.topk_weights = stage_in(in.topk_weights, R * K * 4, xb).as<const float>();
    cin.bias0 = stage_in(in.bias[0], T * H * 2, xb + wb).as<const uint16_t>();
    cin.bias1 = stage_in(in.bias[1], T * H * 2, xb + wb + bb).as<const uint16_t>();
    cout.x = reinterpret_cast<uint16_t*>(s + CUdeviceptr(xb + wb + 2 * bb));
    cout.topk_weights = reinterpret_cast<float*>(s + CUdeviceptr(xb + wb + 2 * bb + ob));
  }
  translating(rank(), [&] {
    time_start();
    kargs::CombineArgs a;
    a.r = rank_args(seq);
    a.m = moe_shape();
    a.st = state_of(st);
    a.in = cin;
    a.out = cout;
    a.fingerprint = l.fingerprint;
    // Every rank of the world a rank of this process on this GPU, x a device tensor: the reduce reads
    // the peers' rows where they lie (their addresses are valid here), with no send (kernels/combine.cu).
    a.pull = device && world() > 1 && c_.cfg.device_share == world() ? 1 : 0;
    launch_->combine(stream_, a, in.num_sms);
    time_end();
  });
  keep_for_graph(st);
  if (device) return;
  wait_stream(WaitSite{kPhaseCombineData, -1, "done"});
  translating(rank(), [&] {
    if (T > 0) {
      RF_CU(cuMemcpyDtoHAsync, out.x.ptr, dev(cout.x), size_t(T * H * 2), stream_);
      RF_CU(cuMemcpyDtoHAsync, out.topk_weights.ptr, dev(cout.topk_weights), size_t(T * K * 4), stream_);
    }
  });
  wait_stream(WaitSite{kPhaseCombineData, -1, "done"});
}

}  // namespace rankflow::cuda
