// MoE combine of the cuda backend in a world whose nodes share no memory (the dispatch that made the
// handle: two_level_moe.cc), with the host backend's algorithm (backends/host/two_level_combine.cc)
// and the flat combine's sums bit for bit.
//   1. Between two node barriers (slot arrays `barrier`, then `cpu_barrier`, at the op's seq) every
//      rank copies its row for (source p, token t) into the combine region of the forwarder of p's
//      rail on its node, at slot (node(p) * R + its local index) * maxT + t (a copy list).
//   2. The flat sum is fp32, from 0, in ascending rank order; ranks of a node are consecutive and nodes
//      are in rank order, so it is a fold along the token's destination nodes in ascending order: the
//      first adds its ranks' rows to 0 and sends the fp32 partial on its rail to the next, which goes
//      on from it, ...; the last sends it home. Per rail: NCCL receives of what the nodes below send;
//      the fold kernel (each entry: its partial or 0, then its rows in local order); NCCL sends of one
//      frame to every other node and receives from the nodes above; the fold kernel again for the
//      sums of my tokens that came from above. Frames hold entries {hidden fp32, topk fp32} in
//      (source node, token) order, which both ends derive from the routing, so the host sizes every
//      transfer exactly. A header {seq, entry bytes} goes to and from every rail peer before them.
//   3. The finish kernel: bias0, then bias1, added to each sum, rounded to bf16 (RNE); the weights.
#include <cstring>

#include "two_level.hpp"
#include "driver.hpp"
#include "faults.hpp"

namespace rankflow::cuda {

void CudaTwoLevel::combine(uint64_t seq, DispatchLayout& l, const CombineInput& in, const CombineOutput& out) {
  CudaLayout& st = two_level_layout(l, "combine");
  const TwoLevelRouting& two = *st.two;
  const Nodes& nd = c_.nodes;
  const EpConfig& ep = c_.cfg.ep;
  const int N = nd.num_nodes, n = nd.node, R = nd.ranks_per_node;
  const int64_t H = ep.hidden, K = ep.topk, T = l.num_tokens, maxT = ep.max_tokens_per_rank, Z = H + K, entry = Z * 4;
  const int64_t num = l.num_recv;
  RF_CHECK(int64_t(st.src_rank.size()) == num, "STATE", "combine: the handle's dispatch kept no receive order");
  const bool device = in.x.device;
  if (device) {
    const CUdeviceptr x = dev(in.x.ptr);
    for (int j = 0; j < R; ++j) {
      const CUdeviceptr lo = mem_.peer_base(nd.rank_of(n, j)), hi = lo + CUdeviceptr(mem_.stride());
      RF_CHECK(x == 0 || x < lo || x >= hi, "EINVAL",
               "combine: x lies in the symmetric buffer (peers write there during the combine); copy it into a "
               "tensor of its own first (e.g. from an outputsInBuffer dispatch)");
    }
  }
  CUdeviceptr x = 0, w = 0, b0 = 0, b1 = 0, ox = 0, ow = 0;
  translating(rank(), [&] {
    if (device) {
      x = dev(in.x.ptr), w = dev(in.topk_weights.ptr), b0 = dev(in.bias[0].ptr), b1 = dev(in.bias[1].ptr);
      ox = dev(out.x.ptr), ow = dev(out.topk_weights.ptr);
    } else {  // driver mode: staged in, and the outputs in a block of the op
      const int64_t xb = align_up(num * H * 2, kRegionAlignment), wb = align_up(num * K * 4, kRegionAlignment),
                    bb = align_up(T * H * 2, kRegionAlignment);
      staging(xb + wb + 2 * bb + 16);
      x = dev(stage_in(in.x, num * H * 2, 0).ptr);
      w = dev(stage_in(in.topk_weights, num * K * 4, xb).ptr);
      b0 = dev(stage_in(in.bias[0], T * H * 2, xb + wb).ptr);
      b1 = dev(stage_in(in.bias[1], T * H * 2, xb + wb + bb).ptr);
      ox = tl_block(st, T * H * 2, "combine output");
      ow = tl_block(st, T * K * 4, "combine output");
    }
    if (w == 0 && num > 0) w = tl_upload(st, st.recv_weights.data(), num * K * 4, "combine dispatched weights");
  });
  // 1. My rows into the forwarders of their sources' rails on my node.
  std::vector<kargs::CopyItem> rows;
  for (int64_t q = 0; q < num; ++q) {
    const int p = st.src_rank[size_t(q)], f = nd.local_of(p);
    const int64_t slot = (int64_t(nd.node_of(p)) * R + nd.local) * maxT + st.src_token[size_t(q)];
    const CUdeviceptr fb = mem_.peer_base(nd.rank_of(n, f)) + CUdeviceptr(c_.ws.bytes);
    rows.push_back({uint64_t(x + CUdeviceptr(q * H * 2)), uint64_t(fb + CUdeviceptr(c_.buf.combine_x + slot * H * 2)), H * 2});
    rows.push_back({uint64_t(w + CUdeviceptr(q * K * 4)), uint64_t(fb + CUdeviceptr(c_.buf.combine_weights + slot * K * 4)), K * 4});
    if (f != nd.local) c_.traffic.up(H * 2 + K * 4);
  }
  // 2. The folds along my rail (file header): how many entries each node sends me and I send it,
  //    then the fold items (a partial from the frame of node k at its cursor, or 0; rows; where the
  //    sum goes: the frame to the next node, or my finals).
  std::vector<int64_t> below(size_t(N), 0), above(size_t(N), 0), outgoing(size_t(N), 0);
  auto walk = [&](auto&& visit) {
    for (int sn = 0; sn < N; ++sn) {
      const RailSource& rs = two.rail[size_t(sn)];
      for (size_t e = 0; e < rs.token.size(); ++e) {
        const uint64_t D = rs.nodes[e];
        const int64_t t = rs.token[e];
        if ((D >> n) & 1) {
          const int prev = highest_below(D, n);
          int next = lowest_above(D, n);
          if (next < 0 && sn != n) next = sn;  // the last destination node sends the sum home
          visit(prev, next, sn, e, t, false);
        }
        const int last = highest(D);
        if (sn == n && last >= 0 && last != n) visit(last, -1, sn, e, t, true);  // my token's sum comes home
      }
    }
  };
  walk([&](int from, int to, int, size_t, int64_t, bool) {
    if (from >= 0) (from < n ? below : above)[size_t(from)]++;
    if (to >= 0) outgoing[size_t(to)]++;
  });
  std::vector<int64_t> below_at(size_t(N), 0), above_at(size_t(N), 0), out_at(size_t(N), 0);
  int64_t nb = 0, na = 0, no = 0;
  for (int k = 0; k < N; ++k) {
    below_at[size_t(k)] = nb, above_at[size_t(k)] = na, out_at[size_t(k)] = no;
    nb += below[size_t(k)], na += above[size_t(k)], no += outgoing[size_t(k)];
  }
  translating(rank(), [&] {
    const CUdeviceptr bbuf = tl_block(st, nb * entry, "combine partials"), abuf = tl_block(st, na * entry, "combine partials"),
                      obuf = tl_block(st, no * entry, "combine partials"), finals = tl_block(st, T * entry, "combine sums");
    std::vector<kargs::FoldItem> first, second;
    std::vector<int32_t> slots;
    std::vector<int64_t> bcur = below_at, acur = above_at, ocur = out_at;
    walk([&](int from, int to, int sn, size_t e, int64_t t, bool home) {
      kargs::FoldItem it;
      if (from >= 0) {
        const bool low = from < n;
        int64_t& cur = (low ? bcur : acur)[size_t(from)];
        it.partial = uint64_t((low ? bbuf : abuf) + CUdeviceptr(cur++ * entry));
      }
      it.dst = uint64_t(to >= 0 ? obuf + CUdeviceptr(ocur[size_t(to)]++ * entry) : finals + CUdeviceptr(t * entry));
      it.first = int32_t(slots.size());
      if (!home) {
        const uint64_t locals = two.rail[size_t(sn)].locals[e];
        for (int j = 0; j < R; ++j)
          if ((locals >> j) & 1) slots.push_back(int32_t((int64_t(sn) * R + j) * maxT + t));
      }
      it.count = int32_t(slots.size()) - it.first;
      (from > n ? second : first).push_back(it);
    });
    const CUdeviceptr b = mem_.window() + CUdeviceptr(c_.ws.bytes);
    kargs::FoldArgs fa;
    fa.rows = reinterpret_cast<const int32_t*>(tl_upload(st, slots.data(), int64_t(slots.size() * 4), "combine fold rows"));
    fa.combine_x = reinterpret_cast<const uint16_t*>(b + CUdeviceptr(c_.buf.combine_x));
    fa.combine_weights = reinterpret_cast<const float*>(b + CUdeviceptr(c_.buf.combine_weights));
    fa.hidden = int32_t(H);
    fa.topk = int32_t(K);
    const CUdeviceptr first_at = tl_upload(st, first.data(), int64_t(first.size() * sizeof(kargs::FoldItem)), "combine fold list");
    const CUdeviceptr second_at = tl_upload(st, second.data(), int64_t(second.size() * sizeof(kargs::FoldItem)), "combine fold list");
    kargs::CopyArgs c;
    c.items = reinterpret_cast<const kargs::CopyItem*>(tl_upload(st, rows.data(), int64_t(rows.size() * sizeof(kargs::CopyItem)), "combine row list"));
    c.count = int64_t(rows.size());
    if (T > 0) RF_CU(cuMemsetD32Async, finals, 0, size_t(T * Z), stream_);  // tokens that went nowhere sum to 0
    node_barrier(seq, kws_.barrier, kPhaseEnter);  // every node peer's combine region is free for this op
    launch_->tl_copy(stream_, c);
    node_barrier(seq, kws_.cpu_barrier, kPhaseCombineData);  // every row of my combine region is there
    // The header {seq, entry bytes} to and from every rail peer first, in a group of its own: NCCL
    // matches a pair's transfers in the order both post them, and the frames below go one way each.
    std::vector<RailTransfer> sends, recvs;
    rail_headers(seq, entry, sends, recvs);
    rails_->exchange(sends, recvs);
    sends.clear();
    recvs.clear();
    for (int k = 0; k < n; ++k) recvs.push_back({k, bbuf + CUdeviceptr(below_at[size_t(k)] * entry), size_t(below[size_t(k)] * entry)});
    rails_->exchange(sends, recvs);
    fa.items = reinterpret_cast<const kargs::FoldItem*>(first_at);
    fa.count = int64_t(first.size());
    launch_->tl_fold(stream_, fa);
    recvs.clear();
    for (int k = 0; k < N; ++k) {
      if (k == n) continue;
      sends.push_back({k, obuf + CUdeviceptr(out_at[size_t(k)] * entry), size_t(outgoing[size_t(k)] * entry)});
      if (k > n) recvs.push_back({k, abuf + CUdeviceptr(above_at[size_t(k)] * entry), size_t(above[size_t(k)] * entry)});
    }
    rails_->exchange(sends, recvs);
    c_.traffic.out(no * entry);
    fa.items = reinterpret_cast<const kargs::FoldItem*>(second_at);
    fa.count = int64_t(second.size());
    launch_->tl_fold(stream_, fa);
    // 3. My tokens: the sum, the biases, rounded once (as flat).
    kargs::FinishArgs fin;
    fin.sums = reinterpret_cast<const float*>(finals);
    fin.bias0 = reinterpret_cast<const uint16_t*>(b0);
    fin.bias1 = reinterpret_cast<const uint16_t*>(b1);
    fin.out_x = reinterpret_cast<uint16_t*>(ox);
    fin.out_weights = reinterpret_cast<float*>(ow);
    fin.num_tokens = T;
    fin.hidden = int32_t(H);
    fin.topk = int32_t(K);
    launch_->tl_finish(stream_, fin);
  });
  wait_stream(WaitSite{kPhaseCombineData, -1, "done"});
  check_rail_headers(seq, entry, "combine", kPhaseCombineData);
  if (!device && T > 0) {
    translating(rank(), [&] {
      RF_CU(cuMemcpyDtoH, out.x.ptr, ox, size_t(T * H * 2));
      RF_CU(cuMemcpyDtoH, out.topk_weights.ptr, ow, size_t(T * K * 4));
    });
  }
  st.keep.clear();
}

}  // namespace rankflow::cuda
