// Context construction (domains, layouts, sizes, the backend), its layout bookkeeping, and the
// refusals of the Backend methods a backend does not have.
#include "context.hpp"

namespace rankflow {

namespace {
BackendFactory g_cuda_factory = nullptr;
}

void set_cuda_backend_factory(BackendFactory f) { g_cuda_factory = f; }
BackendFactory cuda_backend_factory() { return g_cuda_factory; }

Domains Domains::make(int rank, int world, int nvl_ranks, bool hybrid) {
  Domains d{};
  d.num_nvl_ranks = nvl_ranks > 0 ? nvl_ranks : world;
  RF_CHECK(world % d.num_nvl_ranks == 0, "EINVAL",
           "ranksPerNode (" + std::to_string(d.num_nvl_ranks) + ") must divide the world size (" + std::to_string(world) + ")");
  d.num_rdma_ranks = world / d.num_nvl_ranks;
  d.nvl_rank_idx = rank % d.num_nvl_ranks;
  d.rdma_rank_idx = rank / d.num_nvl_ranks;
  if (hybrid) {  // seed 6.2: scale-up = the NVLink domain, scale-out = nodes
    d.num_scaleup_ranks = d.num_nvl_ranks, d.num_scaleout_ranks = d.num_rdma_ranks;
    d.scaleup_rank_idx = d.nvl_rank_idx, d.scaleout_rank_idx = d.rdma_rank_idx;
  } else {       // the whole group is one logical scale-up domain
    d.num_scaleup_ranks = world, d.num_scaleout_ranks = 1;
    d.scaleup_rank_idx = rank, d.scaleout_rank_idx = 0;
  }
  d.is_scaleup_nvlink = d.num_scaleup_ranks == d.num_nvl_ranks;
  return d;
}

Context::Context(const ContextConfig& c, int32_t* abort_words) : cfg(c) {
  RF_CHECK(c.world_size >= 1 && c.world_size <= kMaxRanks, "EINVAL", "world size must be in [1, 64]");
  RF_CHECK(c.rank >= 0 && c.rank < c.world_size, "EINVAL", "rank out of range");
  RF_CHECK(c.ep.world_size == c.world_size, "EINVAL", "ep config names another world size");
  if (abort_words != nullptr) abort.attach(abort_words);
  dom = Domains::make(c.rank, c.world_size, c.ranks_per_node, c.hybrid);
  if (c.scale_out && dom.num_rdma_ranks > 1) {
    // Nodes that share no memory: the scale-up domain is the node, whatever `hybrid` says.
    dom = Domains::make(c.rank, c.world_size, c.ranks_per_node, true);
    nodes = Nodes{dom.num_rdma_ranks, dom.num_nvl_ranks, dom.rdma_rank_idx, dom.nvl_rank_idx};
  } else {
    nodes = Nodes{1, c.world_size, 0, c.rank};
  }
  ws = WorkspaceLayout::make(c.world_size, int32_t(c.ep.num_experts / c.world_size));
  buf = BufferLayout::make(c.ep);
  sym_bytes = c.num_bytes > 0 ? align_up(c.num_bytes, kAlignment) : size_hint(c.ep);
  RF_CHECK(sym_bytes >= ws.bytes + kAlignment, "EINVAL",
           "buffer.bytes (" + std::to_string(c.num_bytes) + ") leaves no room after the " + std::to_string(ws.bytes) +
               "-byte workspace");
  cpu_bytes = align_up(c.cpu_bytes, kAlignment);
  seq = c.first_seq;
  live_mask = all_ranks_mask(c.world_size);
  rules.rank = c.rank;
  rules.abort = &abort;
  rules.op_seq = &seq;
  rules.cpu_timeout_s = c.cpu_timeout_s;
  rules.gpu_timeout_s = c.gpu_timeout_s;
  if (c.backend == BackendKind::Cuda) {
    RF_CHECK(g_cuda_factory != nullptr, "BACKEND_UNAVAILABLE",
             "backend 'cuda' is unavailable: this build of the addon has no CUDA backend (cuda.h was not found "
             "at build time; set CUDA_HOME and reinstall: npm rebuild rankflow)");
    backend_ = g_cuda_factory(*this);  // its CUDA context becomes current on this thread
  } else {
    backend_ = make_host_backend(*this);
  }
}

void Context::destroy() noexcept {
  abort.stop();
  layouts_.clear();  // layout states free their backend memory first
  use_order_.clear();
  if (backend_) backend_->destroy();
  backend_.reset();
  inflight.clear();  // after the backend: nothing runs on the ops' memory any more
}

std::shared_ptr<DispatchLayout> Context::layout(uint32_t id) const {
  const auto it = layouts_.find(id);
  if (it == layouts_.end()) return nullptr;
  use_order_.splice(use_order_.begin(), use_order_, it->second.use);  // now the most recently used
  return it->second.layout;
}

std::shared_ptr<DispatchLayout> Context::add_layout() {
  const uint32_t id = next_layout_id++;
  if (next_layout_id == 0) next_layout_id = 1;  // 0 means "no handle"
  if (const auto old = layouts_.find(id); old != layouts_.end()) {  // the id wrapped onto a live handle
    use_order_.erase(old->second.use);
    layouts_.erase(old);
  }
  std::shared_ptr<DispatchLayout> l;
  if (layouts_.size() < kMaxLiveHandles) {
    l = std::make_shared<DispatchLayout>();
    use_order_.push_front(id);
    layouts_.emplace(id, LiveLayout{l, use_order_.begin()});
  } else {
    // The least recently used handle expires, and the new one moves into its entry and list node.
    auto entry = layouts_.extract(use_order_.back());
    use_order_.splice(use_order_.begin(), use_order_, std::prev(use_order_.end()));
    use_order_.front() = id;
    l = std::move(entry.mapped().layout);
    if (l.use_count() == 1) l->reset_for_reuse();  // nothing else holds the expired layout
    else l = std::make_shared<DispatchLayout>();
    entry.key() = id;
    entry.mapped().layout = l;
    layouts_.insert(std::move(entry));
  }
  l->id = id;
  return l;
}

// ---- what a backend without devices answers ----
DeviceOps& Context::device(const char* what) const {
  if (DeviceOps* d = backend().device()) return *d;
  throw Error("EINVAL", std::string(what) + " needs backend 'cuda' (device tensors, streams and CUDA events)");
}

int Backend::scaleout_listen(const std::string&) {
  throw Error("BACKEND_UNAVAILABLE", "this rank's backend has no scale-out leg: its world cannot span nodes");
}
void Backend::scaleout_connect(const std::vector<ScaleoutEndpoint>&, const RailKey&, double) {
  throw Error("BACKEND_UNAVAILABLE", "this rank's backend has no scale-out leg: its world cannot span nodes");
}
void Backend::set_live(uint64_t, uint64_t) {
  throw Error("EINVAL", "elastic: this rank's backend does not mask ranks (elastic groups run on backend 'host', in one process)");
}
void Backend::import_peer(int, const ExportedSegments&) {
  throw Error("EINVAL", "elastic: this rank's backend cannot map a replacement rank (elastic groups run on backend 'host', in one process)");
}
void Backend::nccl_init(const std::vector<uint8_t>&) {
  throw Error("EINVAL", "ncclInit: this rank's backend makes no NCCL communicator");
}

}  // namespace rankflow
