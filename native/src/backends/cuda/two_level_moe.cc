// MoE dispatch of the cuda backend in a world whose nodes share no memory (two levels), with the
// algorithm and outputs of the host backend's (backends/host/two_level_moe.cc): a token crosses the
// network at most once per destination node, to the rank of its source's local index there (its
// rail peer), which writes it into its node's ranks' receive regions as if its source had. The
// receive region is then exactly the flat one (rows by global source rank, then source token).
// Only the dispatch with a CPU sync runs here: NCCL posts transfers of exact sizes, so the host must
// know every count first; the host also plans every copy (the kernels of two_level.cu carry them out).
//   notify : my topk on the host (routing: destination ranks, nodes, local experts); NCCL on my rail:
//            the header {seq, record bytes} and my record count per node, then the records' routing
//            part {token, k global expert ids, k weights}; from what came, every source of my rail
//            has its rows and expert counts per rank of my node: one table per forwarder, gathered
//            in the node by the all_gather kernel (its enter round orders it after the peers'
//            earlier ops). The CPU then knows every count of every rank of the node, and every
//            receive offset: the CPU sync (dispatch_counts) has nothing left to wait for.
//   data   : my records' data part {x row, scales} packed on the device (a cached dispatch: the
//            routing part too, with its weights) and exchanged on the rail; the node's barrier (slot
//            array `barrier`: every node peer read its table, and its earlier work is done); my
//            tokens and those of my rail peers into every rank of my node (a copy list: x rows,
//            scales, then per source the local expert ids, weights, source tokens and ranks);
//            the node's barrier again (array `cpu_barrier`: every row of my region is there).
// Slots: the node's workspace layout (kws_), its enter and done arrays at the notify's all_gather,
// barrier and cpu_barrier at the data phase, all at the op's seq; no array is written with another
// layout. Per-source counts never go through slots: they travel in the gathered tables.
#include <cstring>

#include "two_level.hpp"
#include "driver.hpp"
#include "faults.hpp"

namespace rankflow::cuda {

namespace {
// A record's routing part: {int32 token, int32 ids[K], fp32 weights[K]}; its data part: {x row, scales}.
int64_t meta_bytes(int64_t K) { return (1 + 2 * K) * 4; }

[[noreturn]] void broken_frame(int rank, int peer, const std::string& what) {
  throw Error("RANK_FAILED",
              "rank " + std::to_string(peer) + " sent rank " + std::to_string(rank) + " dispatch records that do not fit the protocol: " + what,
              peer, phase_name(kPhaseNotify));
}

}  // namespace

CUdeviceptr CudaTwoLevel::tl_block(CudaLayout& st, int64_t bytes, const char* what) {
  st.keep.push_back(std::make_shared<DeviceBlock>(pool_, std::max<int64_t>(align_up(bytes, kRegionAlignment), kRegionAlignment), what));
  return st.keep.back()->ptr;
}

CUdeviceptr CudaTwoLevel::tl_upload(CudaLayout& st, const void* src, int64_t bytes, const char* what) {
  const CUdeviceptr p = tl_block(st, bytes, what);
  from_host(p, src, bytes);
  return p;
}

void CudaTwoLevel::node_barrier(uint64_t seq, int64_t array, Phase phase) {
  kargs::BarrierArgs a;
  a.r = rank_args(seq);
  a.array = array;
  a.phase = phase;
  a.complete = 0;
  launch_->barrier(stream_, a);
}

CudaLayout& CudaTwoLevel::two_level_layout(DispatchLayout& l, const char* op) {
  CudaLayout& st = layout_of(l);
  RF_CHECK(st.two != nullptr, "STATE", std::string(op) + ": this handle's dispatch did not run in two levels");
  check_rails(op);
  return st;
}

void CudaTwoLevel::dispatch_notify(uint64_t seq, DispatchLayout& l, const DispatchInput& in) {
  const Nodes& nd = c_.nodes;
  const EpConfig& ep = c_.cfg.ep;
  const int W = world(), N = nd.num_nodes, R = nd.ranks_per_node;
  const int64_t K = ep.topk, E = ep.num_experts, epr = c_.experts_per_rank(), T = in.num_tokens, maxT = ep.max_tokens_per_rank;
  RF_CHECK(in.cpu_sync, "BACKEND_UNAVAILABLE",
           "dispatch without a CPU sync (outputsInBuffer) does not run across nodes on backend 'cuda' yet: this world spans " +
               std::to_string(N) + " nodes, where cuda's dispatch needs the CPU to size its NCCL transfers; dispatch with a "
               "CPU sync (the default), or use backend 'host'; the rank stays usable");
  check_rails("dispatch");
  auto st = std::make_unique<CudaLayout>();
  auto two = std::make_shared<TwoLevelRouting>();
  st->mirrored = true;
  two->rail.resize(size_t(N));
  two->send_records.assign(size_t(N), 0);
  // 1. My topk on the host (device tensors: once the stream ran the work that wrote them).
  std::vector<int32_t> idx(size_t(T * K));
  std::vector<float> w(size_t(T * K));
  if (T > 0 && (in.topk_idx.device || in.topk_weights.device)) wait_stream(WaitSite{kPhaseNotify, -1, "inputs"});
  translating(rank(), [&] {
    if (T == 0) return;
    if (in.topk_idx.device) RF_CU(cuMemcpyDtoH, idx.data(), dev(in.topk_idx.ptr), idx.size() * 4);
    else std::memcpy(idx.data(), in.topk_idx.ptr, idx.size() * 4);
    if (in.topk_weights.device) RF_CU(cuMemcpyDtoH, w.data(), dev(in.topk_weights.ptr), w.size() * 4);
    else std::memcpy(w.data(), in.topk_weights.ptr, w.size() * 4);
  });
  RailSource& own = two->rail[size_t(nd.node)];
  std::vector<uint8_t> meta;  // my records' routing parts, node after node
  const int64_t mb = meta_bytes(K);
  std::vector<std::vector<int32_t>> to(static_cast<size_t>(N));  // my tokens per destination node
  for (int64_t t = 0; t < T; ++t) {
    uint64_t mask = 0;
    for (int64_t k = 0; k < K; ++k) {
      int32_t& e = idx[size_t(t * K + k)];
      if (e == -1) continue;
      if (e < 0 || e >= E) {  // dropped as the flat notify kernel drops it; reported once the op ran
        if (two->bad_index < 0) two->bad_index = t * K + k, two->bad_value = e;
        e = -1;
        continue;
      }
      mask |= uint64_t(1) << (e / epr);
    }
    const uint64_t nodes = nd.nodes_of(mask);
    own.token.push_back(int32_t(t));
    own.nodes.push_back(nodes);
    own.locals.push_back(nd.locals_of(mask));
    own.idx.insert(own.idx.end(), idx.begin() + t * K, idx.begin() + (t + 1) * K);
    own.weights.insert(own.weights.end(), w.begin() + t * K, w.begin() + (t + 1) * K);
    for (int k = 0; k < N; ++k)
      if (k != nd.node && ((nodes >> k) & 1)) to[size_t(k)].push_back(int32_t(t));
  }
  for (int k = 0; k < N; ++k) {
    two->send_records[size_t(k)] = int64_t(to[size_t(k)].size());
    for (const int32_t t : to[size_t(k)]) {
      const size_t at = meta.size();
      meta.resize(at + size_t(mb));
      std::memcpy(meta.data() + at, &t, 4);
      std::memcpy(meta.data() + at + 4, idx.data() + t * K, size_t(K * 4));
      std::memcpy(meta.data() + at + 4 + K * 4, w.data() + t * K, size_t(K * 4));
    }
  }
  // 2. The header and the record counts on my rail; then the routing parts of the records.
  const int64_t row = ep.hidden * in.x_elem_bytes, S = in.scales ? c_.buf.scales_per_token : 0, rec = mb + row + S * 4;
  std::vector<int64_t> theirs(size_t(N), 0);
  translating(rank(), [&] {
    const CUdeviceptr mine = tl_upload(*st, two->send_records.data(), N * 8, "dispatch record counts");
    const CUdeviceptr got = tl_block(*st, N * 8, "dispatch record counts");
    std::vector<RailTransfer> sends, recvs;
    rail_headers(seq, rec, sends, recvs);
    rails_->to_every_peer(mine, 8, got, 8, 8, sends, recvs);
    rails_->exchange(sends, recvs);
    wait_stream(WaitSite{kPhaseNotify, -1, "rail"});
    check_rail_headers(seq, rec, "dispatch", kPhaseNotify);
    RF_CU(cuMemcpyDtoH, theirs.data(), got, size_t(N * 8));
  });
  theirs[size_t(nd.node)] = 0;
  int64_t in_records = 0;
  for (int k = 0; k < N; ++k) {
    if (theirs[size_t(k)] < 0 || theirs[size_t(k)] > maxT) broken_frame(rank(), nd.rail_peer(k), "a record count outside [0, maxTokensPerRank]");
    in_records += theirs[size_t(k)];
  }
  two->recv_records = theirs;
  std::vector<uint8_t> got(size_t(in_records * mb));
  translating(rank(), [&] {
    const CUdeviceptr send = tl_upload(*st, meta.data(), int64_t(meta.size()), "dispatch records");
    const CUdeviceptr recv = tl_block(*st, in_records * mb, "dispatch records");
    auto tr = rails_->record_transfers(two->send_records, two->recv_records, mb, send, recv);
    rails_->exchange(tr.first, tr.second);
    c_.traffic.out(int64_t(meta.size()));
    wait_stream(WaitSite{kPhaseNotify, -1, "records"});
    if (in_records > 0) RF_CU(cuMemcpyDtoH, got.data(), recv, got.size());
  });
  // 3. The sources of my rail: what their records say (checked before anything acts on it).
  const uint8_t* d = got.data();
  for (int k = 0; k < N; ++k) {
    RailSource& rs = two->rail[size_t(k)];
    const int s = nd.rail_peer(k);
    int32_t last = -1;
    for (int64_t i = 0; k != nd.node && i < two->recv_records[size_t(k)]; ++i, d += mb) {
      int32_t t;
      std::memcpy(&t, d, 4);
      if (t <= last || t >= maxT) broken_frame(rank(), s, "its token ids are not ascending below maxTokensPerRank");
      last = t;
      const size_t base = rs.token.size() * size_t(K);
      rs.idx.resize(base + size_t(K));
      rs.weights.resize(base + size_t(K));
      std::memcpy(rs.idx.data() + base, d + 4, size_t(K * 4));
      std::memcpy(rs.weights.data() + base, d + 4 + K * 4, size_t(K * 4));
      uint64_t mask = 0;
      for (int64_t kk = 0; kk < K; ++kk) {
        const int32_t e = rs.idx[base + size_t(kk)];
        if (e == -1) continue;
        if (e < 0 || e >= E) broken_frame(rank(), s, "an expert id outside [0, numExperts)");
        mask |= uint64_t(1) << (e / epr);
      }
      const uint64_t locals = nd.locals_of(mask);
      if (locals == 0) broken_frame(rank(), s, "a token with no expert on this node");
      rs.token.push_back(t);
      rs.nodes.push_back(nd.nodes_of(mask));
      rs.locals.push_back(locals);
    }
  }
  // 4. My table: for every rank j of my node and every node k, the rows that rail peer k's tokens
  //    (mine at my node) bring j, then per local expert of j the topk entries naming it. Gathered in
  //    the node (rank i's table at i * padded in every node peer's buffer), read back by the CPU.
  const int64_t cols = 1 + epr, tbytes = int64_t(R) * N * cols * 4, padded = align_up(tbytes, 16);
  RF_CHECK(padded * R <= c_.buffer_bytes(), "EINVAL",
           "dispatch across " + std::to_string(N) + " nodes needs " + std::to_string(padded * R) + " buffer bytes for its count tables");
  std::vector<int32_t> table(size_t(padded / 4), 0);
  for (int k = 0; k < N; ++k) {
    const RailSource& rs = two->rail[size_t(k)];
    for (size_t i = 0; i < rs.token.size(); ++i)
      for (int j = 0; j < R; ++j) {
        if (((rs.locals[i] >> j) & 1) == 0) continue;
        int32_t* c = table.data() + (int64_t(j) * N + k) * cols;
        ++c[0];
        const int p = nd.rank_of(nd.node, j);
        for (int64_t kk = 0; kk < K; ++kk) {
          const int32_t e = rs.idx[i * size_t(K) + size_t(kk)];
          if (e >= 0 && e / epr == p) ++c[1 + e % epr];
        }
      }
  }
  std::vector<int32_t> tables(size_t(padded / 4 * R));
  translating(rank(), [&] {
    kargs::AllGatherArgs a;
    a.r = rank_args(seq);
    a.src = reinterpret_cast<const void*>(tl_upload(*st, table.data(), padded, "dispatch count table"));
    a.bytes = padded;
    a.dst_offset = c_.ws.bytes;
    launch_->all_gather(stream_, a);
    c_.traffic.up(padded * (R - 1));
    wait_stream(WaitSite{kPhaseNotify, -1, "rank_count"});
    RF_CU(cuMemcpyDtoH, tables.data(), mem_.window() + CUdeviceptr(c_.ws.bytes), size_t(padded * R));
  });
  // 5. Every rank of my node: its rows from every source of the world, and where they start.
  two->count.assign(size_t(R * W), 0);
  two->offset.assign(size_t(R * W), 0);
  two->tokens_per_expert.assign(size_t(epr), 0);
  for (int j = 0; j < R; ++j) {
    int64_t o = 0;
    for (int s = 0; s < W; ++s) {
      const int32_t* c = tables.data() + int64_t(nd.local_of(s)) * (padded / 4) + (int64_t(j) * N + nd.node_of(s)) * cols;
      two->count[size_t(j * W + s)] = c[0];
      two->offset[size_t(j * W + s)] = o;
      o += c[0];
      if (j == nd.local)
        for (int64_t e = 0; e < epr; ++e) two->tokens_per_expert[size_t(e)] += c[1 + e];
    }
    RF_CHECK(o <= W * maxT, "STATE", "dispatch: the gathered count tables give more rows than the receive region holds");
  }
  st->two = std::move(two);
  st->keep.clear();  // the stream ran all of it
  l.state = std::move(st);
}

bool CudaTwoLevel::dispatch_counts(DispatchLayout& l, bool) {  // the notify left every count on the host
  const TwoLevelRouting& two = *layout_of(l).two;
  const int W = world(), j = c_.nodes.local;
  auto k = std::make_shared<RecvCounts>();
  k->per_rank.assign(size_t(W), 0);
  for (int s = 0; s < W; ++s) k->per_rank[size_t(s)] = two.count[size_t(j * W + s)];
  k->per_expert = two.tokens_per_expert;
  l.set_counts(std::move(k));
  return true;
}

// A cached dispatch: the host's plan is the routing; nothing on the device.
void CudaTwoLevel::adopt_routing(DispatchLayout& l, const DispatchLayout& from, bool /*new_weights*/) {
  const auto& origin = static_cast<const CudaLayout&>(*from.state);
  auto st = std::make_unique<CudaLayout>();
  st->two = origin.two;
  st->mirrored = origin.mirrored;
  st->cached = true;
  l.state = std::move(st);
}

}  // namespace rankflow::cuda
