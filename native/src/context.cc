// Context construction (domains, layouts, memory) and the protocol steps every op is made of.
#include "context.hpp"

namespace rankflow {

const char* phase_name(uint64_t phase) {
  switch (phase) {
    case kPhaseBarrier: return "barrier";
    case kPhaseCpuBarrier: return "barrier (CPU sync)";
    case kPhaseEnter: return "enter";
    case kPhaseNotify: return "dispatch notify";
    case kPhaseDispatchData: return "dispatch data";
    case kPhaseCombineData: return "combine data";
    case kPhaseAllGather: return "allGather";
    case kPhaseSessionOpen: return "session open";
    case kPhaseSessionClose: return "session close";
    case kPhaseSessionGather: return "session allGather";
    case kPhaseSessionReduce: return "session reduceScatter";
    case kPhasePipeline: return "pipeline send/recv";
    case kPhaseEngram: return "engram";
    default: return "none";
  }
}

namespace {
DeviceBackendFactory g_device_factory = nullptr;
}

void set_device_backend_factory(DeviceBackendFactory f) { g_device_factory = f; }

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

Context::Context(const ContextConfig& c) : cfg(c) {
  RF_CHECK(c.world_size >= 1 && c.world_size <= kMaxRanks, "EINVAL", "world size must be in [1, 64]");
  RF_CHECK(c.rank >= 0 && c.rank < c.world_size, "EINVAL", "rank out of range");
  RF_CHECK(c.ep.world_size == c.world_size, "EINVAL", "ep config names another world size");
  dom = Domains::make(c.rank, c.world_size, c.ranks_per_node, c.hybrid);
  ws = WorkspaceLayout::make(c.world_size, int32_t(c.ep.num_experts / c.world_size));
  buf = BufferLayout::make(c.ep);
  const int64_t hint = size_hint(c.ep);
  sym_bytes = c.num_bytes > 0 ? align_up(c.num_bytes, kAlignment) : hint;
  RF_CHECK(sym_bytes >= ws.bytes + kAlignment, "EINVAL",
           "buffer.bytes (" + std::to_string(c.num_bytes) + ") leaves no room after the " + std::to_string(ws.bytes) +
               "-byte workspace");
  cpu_bytes = align_up(c.cpu_bytes, kAlignment);
  if (c.backend == Backend::Cuda) {
    RF_CHECK(g_device_factory != nullptr, "BACKEND_UNAVAILABLE",
             "backend 'cuda' is unavailable: this build of the addon has no CUDA backend (cuda.h was not found "
             "at build time; set CUDA_HOME and rebuild with `npm run build`)");
    device = g_device_factory(*this);  // on the rank's executor thread: its CUDA context becomes current
    return;
  }
  mem.create(c.rank, c.world_size, sym_bytes, cpu_bytes, choose_memory_kind(cpu_bytes, c.hybrid), dom.num_scaleup_ranks);
}

void Context::destroy() {
  abort.stopping = true;
  layouts.clear();
  if (device) device->destroy();
  mem.destroy();
}

void Context::signal_all(int64_t array, uint64_t value, bool include_self) {
  for (int p = 0; p < world(); ++p)
    if (include_self || p != rank()) store_release(peer_slot(p, array), value);
}

uint64_t Context::wait_for(const void* slot, uint32_t s, const WaitSite& site, WaitKind kind, bool exact) const {
  const double timeout = kind == WaitKind::Cpu ? cfg.cpu_timeout_s : cfg.gpu_timeout_s;
  if (exact)
    return wait_slot(slot, [s](uint64_t v) { return signal_seq(v) == s && signal_has_payload(v); }, site, kind,
                     timeout, rank(), abort);
  return wait_slot(slot, [s](uint64_t v) { return seq_reached(v, s); }, site, kind, timeout, rank(), abort);
}

void Context::wait_all(int64_t array, uint32_t s, Phase phase, const char* name, WaitKind kind) const {
  for (int p = 0; p < world(); ++p)
    if (p != rank()) wait_for(my_slot(array, p), s, WaitSite{phase, p, name}, kind);
}

void Context::wait_entered(int p, uint32_t s) const {
  if (p != rank()) wait_for(my_slot(ws.enter, p), s, WaitSite{kPhaseEnter, p, "enter"}, WaitKind::Device);
}

std::shared_ptr<DispatchLayout> Context::layout(uint32_t id) const {
  const auto it = layouts.find(id);
  return it == layouts.end() ? nullptr : it->second;
}

std::shared_ptr<DispatchLayout> Context::add_layout() {
  auto l = std::make_shared<DispatchLayout>();
  l->id = next_layout_id++;
  layouts[l->id] = l;
  while (layouts.size() > kMaxLiveHandles) layouts.erase(layouts.begin());  // oldest handles expire
  return l;
}

}  // namespace rankflow
