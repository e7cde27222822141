// The data phase of the cuda backend's dispatch across nodes (the plan: two_level_moe.cc). The
// records' data part {x row, scales} is packed on the device and exchanged on the rail (a cached
// dispatch sends the routing part again with it: its weights may be new); then between two node
// barriers every rank writes its own tokens and its rail peers' into every rank of its node, at the
// rows the gathered tables gave: the flat receive region, bit for bit.
#include <cstring>

#include "two_level.hpp"
#include "driver.hpp"
#include "faults.hpp"

namespace rankflow::cuda {

void CudaTwoLevel::dispatch_data(uint64_t seq, DispatchLayout& l, const DispatchInput& in, DispatchOutput& out) {
  CudaLayout& st = two_level_layout(l, "dispatch");
  const TwoLevelRouting& two = *st.two;
  const Nodes& nd = c_.nodes;
  const EpConfig& ep = c_.cfg.ep;
  const int W = world(), N = nd.num_nodes, R = nd.ranks_per_node;
  const int64_t K = ep.topk, epr = c_.experts_per_rank(), T = l.num_tokens;
  const int64_t row = ep.hidden * in.x_elem_bytes, S = in.scales ? c_.buf.scales_per_token : 0, drec = row + S * 4;
  const int64_t mb = (1 + 2 * K) * 4;
  std::vector<RailSource> rail = two.rail;  // its weights are replaced below where this dispatch brings new ones
  CUdeviceptr x = 0, scales = 0;
  translating(rank(), [&] {
    if (in.x.device) {
      x = dev(in.x.ptr);
      scales = dev(in.scales.ptr);
    } else {  // driver mode: staged
      const int64_t xb = align_up(T * row, kRegionAlignment);
      staging(xb + T * S * 4 + 16);
      x = dev(stage_in(in.x, T * row, 0).ptr);
      scales = S > 0 ? dev(stage_in(in.scales, T * S * 4, xb).ptr) : 0;
    }
  });
  const bool resend = st.cached;  // a cached dispatch: the records' routing part goes again, with the weights
  if (resend && in.topk_weights && T > 0) {
    std::vector<float>& w = rail[size_t(nd.node)].weights;
    if (in.topk_weights.device) {
      wait_stream(WaitSite{kPhaseDispatchData, -1, "inputs"});
      translating(rank(), [&] { RF_CU(cuMemcpyDtoH, w.data(), dev(in.topk_weights.ptr), w.size() * 4); });
    } else {
      std::memcpy(w.data(), in.topk_weights.ptr, w.size() * 4);
    }
  }
  // 1. My records, node after node: the data part packed from x (and scales), the routing part from the host.
  int64_t out_records = 0, in_records = 0;
  for (int k = 0; k < N; ++k) out_records += two.send_records[size_t(k)], in_records += two.recv_records[size_t(k)];
  const RailSource& own = rail[size_t(nd.node)];
  std::vector<kargs::CopyItem> pack;
  std::vector<uint8_t> meta;
  translating(rank(), [&] {
    const CUdeviceptr send = tl_block(st, out_records * drec, "dispatch records"), recv = tl_block(st, in_records * drec, "dispatch records");
    int64_t i = 0;
    for (int k = 0; k < N; ++k)
      for (int64_t t = 0; k != nd.node && t < T; ++t) {
        if (((own.nodes[size_t(t)] >> k) & 1) == 0) continue;
        const CUdeviceptr d = send + CUdeviceptr(i++ * drec);
        pack.push_back({uint64_t(x + CUdeviceptr(t * row)), uint64_t(d), row});
        if (S > 0) pack.push_back({uint64_t(scales + CUdeviceptr(t * S * 4)), uint64_t(d + CUdeviceptr(row)), S * 4});
        if (!resend) continue;
        const size_t at = meta.size();
        const int32_t tok = int32_t(t);
        meta.resize(at + size_t(mb));
        std::memcpy(meta.data() + at, &tok, 4);
        std::memcpy(meta.data() + at + 4, own.idx.data() + t * K, size_t(K * 4));
        std::memcpy(meta.data() + at + 4 + K * 4, own.weights.data() + t * K, size_t(K * 4));
      }
    kargs::CopyArgs c;
    c.items = reinterpret_cast<const kargs::CopyItem*>(tl_upload(st, pack.data(), int64_t(pack.size() * sizeof(kargs::CopyItem)), "dispatch pack list"));
    c.count = int64_t(pack.size());
    launch_->tl_copy(stream_, c);
    std::vector<RailTransfer> sends, recvs;
    rail_headers(seq, mb + drec, sends, recvs);
    CUdeviceptr mrecv = 0;
    if (resend) {
      const CUdeviceptr msend = tl_upload(st, meta.data(), int64_t(meta.size()), "dispatch records");
      mrecv = tl_block(st, in_records * mb, "dispatch records");
      auto m = rails_->record_transfers(two.send_records, two.recv_records, mb, msend, mrecv);
      sends.insert(sends.end(), m.first.begin(), m.first.end());
      recvs.insert(recvs.end(), m.second.begin(), m.second.end());
    }
    auto r = rails_->record_transfers(two.send_records, two.recv_records, drec, send, recv);
    sends.insert(sends.end(), r.first.begin(), r.first.end());
    recvs.insert(recvs.end(), r.second.begin(), r.second.end());
    rails_->exchange(sends, recvs);
    c_.traffic.out(out_records * (drec + (resend ? mb : 0)));
    wait_stream(WaitSite{kPhaseDispatchData, -1, "records"});
    check_rail_headers(seq, mb + drec, "dispatch", kPhaseDispatchData);
    if (resend && in_records > 0) {  // the rail peers' weights of this dispatch (their ids are the handle's)
      std::vector<uint8_t> got(size_t(in_records * mb));
      RF_CU(cuMemcpyDtoH, got.data(), mrecv, got.size());
      const uint8_t* d = got.data();
      for (int k = 0; k < N; ++k)
        for (int64_t q = 0; k != nd.node && q < two.recv_records[size_t(k)]; ++q, d += mb)
          std::memcpy(rail[size_t(k)].weights.data() + q * K, d + 4 + K * 4, size_t(K * 4));
    }
    // 2. Into every rank j of my node: per source of my rail (ascending global rank), its rows there.
    std::vector<kargs::CopyItem> fwd;
    std::vector<uint8_t> side;  // per (j, source): local ids, weights, source tokens, source ranks
    struct Run { size_t at; uint64_t dst; int64_t bytes; };
    std::vector<Run> runs;
    std::vector<CUdeviceptr> rec_base(size_t(N), recv);
    for (int k = 1; k < N; ++k) rec_base[size_t(k)] = rec_base[size_t(k - 1)] + CUdeviceptr(two.recv_records[size_t(k - 1)] * drec);
    for (int j = 0; j < R; ++j) {
      const int p = nd.rank_of(nd.node, j);
      const CUdeviceptr b = mem_.peer_base(p) + CUdeviceptr(c_.ws.bytes);
      int64_t rows = 0;
      for (int k = 0; k < N; ++k) {
        const int s = nd.rail_peer(k);
        const RailSource& rs = rail[size_t(k)];
        const int64_t o0 = two.offset[size_t(j * W + s)];
        std::vector<int32_t> ids, toks, ranks;
        std::vector<float> ws;
        for (size_t q = 0; q < rs.token.size(); ++q) {
          if (((rs.locals[q] >> j) & 1) == 0) continue;
          const int64_t o = o0 + int64_t(toks.size());
          const CUdeviceptr sx = k == nd.node ? x + CUdeviceptr(rs.token[q] * row) : rec_base[size_t(k)] + CUdeviceptr(int64_t(q) * drec);
          const CUdeviceptr ss = k == nd.node ? scales + CUdeviceptr(rs.token[q] * S * 4) : sx + CUdeviceptr(row);
          fwd.push_back({uint64_t(sx), uint64_t(b + CUdeviceptr(c_.buf.x + o * row)), row});
          if (S > 0) fwd.push_back({uint64_t(ss), uint64_t(b + CUdeviceptr(c_.buf.scales + o * S * 4)), S * 4});
          for (int64_t kk = 0; kk < K; ++kk) {  // as the flat data kernel: p's experts local, -1 and 0 elsewhere
            const int32_t e = rs.idx[q * size_t(K) + size_t(kk)];
            const bool mine = e >= 0 && e / epr == p;
            ids.push_back(mine ? int32_t(e - p * epr) : -1);
            ws.push_back(mine ? rs.weights[q * size_t(K) + size_t(kk)] : 0.0f);
          }
          toks.push_back(rs.token[q]);
          ranks.push_back(s);
        }
        const int64_t n = int64_t(toks.size());
        RF_CHECK(n == two.count[size_t(j * W + s)], "STATE", "dispatch: the rows of a source differ from its gathered count");
        if (n == 0) continue;
        rows += n;
        auto add = [&](const void* src, int64_t bytes, int64_t region) {
          const size_t at = side.size();
          side.resize(at + size_t(align_up(bytes, 16)));
          std::memcpy(side.data() + at, src, size_t(bytes));
          runs.push_back({at, uint64_t(b + CUdeviceptr(region)), bytes});
        };
        add(ids.data(), n * K * 4, c_.buf.topk_idx + o0 * K * 4);
        add(ws.data(), n * K * 4, c_.buf.topk_weights + o0 * K * 4);
        add(toks.data(), n * 4, c_.buf.src_token + o0 * 4);
        add(ranks.data(), n * 4, c_.buf.src_rank + o0 * 4);
      }
      if (p != rank()) c_.traffic.up(rows * (row + S * 4 + K * 8 + 8));
    }
    const CUdeviceptr sd = tl_upload(st, side.data(), int64_t(side.size()), "dispatch forward side");
    for (const Run& r2 : runs) fwd.push_back({uint64_t(sd + CUdeviceptr(r2.at)), r2.dst, r2.bytes});
    // Uploaded before the barrier: a copy from host memory never waits behind a kernel that waits on a peer.
    c.items = reinterpret_cast<const kargs::CopyItem*>(tl_upload(st, fwd.data(), int64_t(fwd.size() * sizeof(kargs::CopyItem)), "dispatch forward list"));
    c.count = int64_t(fwd.size());
    node_barrier(seq, kws_.barrier, kPhaseEnter);  // every node peer read its table; its earlier work is done
    launch_->tl_copy(stream_, c);
    node_barrier(seq, kws_.cpu_barrier, kPhaseDispatchData);  // every row of my region is there
  });
  wait_stream(WaitSite{kPhaseDispatchData, -1, "done"});
  // 3. What combine needs (my receive order, its weights), then the outputs.
  const int64_t num = l.num_recv;
  const CUdeviceptr b = mem_.window() + CUdeviceptr(c_.ws.bytes);
  st.src_rank.resize(size_t(num));
  st.src_token.resize(size_t(num));
  st.recv_weights.resize(size_t(num * K));
  translating(rank(), [&] {
    if (num == 0) return;
    RF_CU(cuMemcpyDtoH, st.src_rank.data(), b + CUdeviceptr(c_.buf.src_rank), size_t(num * 4));
    RF_CU(cuMemcpyDtoH, st.src_token.data(), b + CUdeviceptr(c_.buf.src_token), size_t(num * 4));
    RF_CU(cuMemcpyDtoH, st.recv_weights.data(), b + CUdeviceptr(c_.buf.topk_weights), size_t(num * K * 4));
  });
  auto region = [&](int64_t off) { return Mem{ptr(b + CUdeviceptr(off)), true}; };
  if (in.x.device && out.in_buffer) {
    out.x = region(c_.buf.x);
    out.scales = S > 0 ? region(c_.buf.scales) : Mem{};
    out.topk_idx = region(c_.buf.topk_idx);
    out.topk_weights = region(c_.buf.topk_weights);
    out.src_rank = region(c_.buf.src_rank);
    out.src_token = region(c_.buf.src_token);
  } else {
    translating(rank(), [&] {
      auto copy = [&](Mem dst, int64_t off, int64_t n) {
        if (n <= 0 || !dst) return;
        if (dst.device) RF_CU(cuMemcpyAsync, dev(dst.ptr), b + CUdeviceptr(off), size_t(n), stream_);
        else RF_CU(cuMemcpyDtoHAsync, dst.ptr, b + CUdeviceptr(off), size_t(n), stream_);
      };
      copy(out.x, c_.buf.x, num * row);
      if (S > 0) copy(out.scales, c_.buf.scales, num * S * 4);
      copy(out.topk_idx, c_.buf.topk_idx, num * K * 4);
      copy(out.topk_weights, c_.buf.topk_weights, num * K * 4);
      copy(out.src_rank, c_.buf.src_rank, num * 4);
      copy(out.src_token, c_.buf.src_token, num * 4);
    });
    wait_stream(WaitSite{kPhaseDispatchData, -1, "done"});
  }
  st.keep.clear();
  if (!st.cached && two.bad_index >= 0)  // as flat: reported once the op ran to its end
    throw Error("EINVAL", "topkIdx[" + std::to_string(two.bad_index) + "]: " + std::to_string(two.bad_value) + " is outside [0, " +
                              std::to_string(ep.num_experts) + ") and not -1",
                rank());
}

}  // namespace rankflow::cuda
