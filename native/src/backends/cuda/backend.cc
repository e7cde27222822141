// The CUDA backend's lifecycle (backend.hpp): creating the rank's GPU side, importing its peers,
// NCCL, the window probes, teardown. Its waits are in waits.cc, device memory and events in
// memory.cc. Everything runs on the rank's thread, where the rank's primary context was made
// current when this object was built.
#include "backend.hpp"
#include "two_level.hpp"

#include <algorithm>
#include <cstring>

#include "driver.hpp"
#include "faults.hpp"
#include "runtime/wait.hpp"

namespace rankflow {

// A world of one node runs the node's protocol; one of several nodes, the two-level layer over it.
std::unique_ptr<Backend> make_cuda_backend(Context& c) {
  if (c.nodes.two_level()) return std::make_unique<cuda::CudaTwoLevel>(c);
  return std::make_unique<cuda::CudaBackend>(c);
}

namespace cuda {

namespace {
constexpr uintptr_t kPage = 4096;
constexpr int64_t kPinnedStagingBytes = int64_t(8) << 20;  // two 4 MiB halves
}  // namespace

CudaBackend::CudaBackend(Context& c) : c_(c) {
  // One rank per thread and cores to spare on a GPU host: spin a while before yielding.
  c.rules.spin_ns = 50000;
  translating(c.rank(), [&] {
    try {
      create();
    } catch (...) {
      destroy();
      throw;
    }
  });
}

void CudaBackend::create() {
  const Driver& d = driver();
  ordinal_ = c_.cfg.device >= 0 ? c_.cfg.device : rank() % d.device_count;
  dev_ = std::make_unique<DeviceContext>(ordinal_);  // retains the primary context, makes it current here
  mem_.create(rank(), world(), *dev_, c_.sym_bytes, c_.cpu_bytes, choose_memory_kind(c_.cpu_bytes, c_.cfg.hybrid),
              c_.dom.num_scaleup_ranks);
  modules_ = std::make_unique<Modules>();
  launch_ = std::make_unique<Launcher>(modules_->kernels(), dev_->sm_count(), c_.cfg.device_share, c_.cfg.cooperative,
                                        c_.cfg.graph_launch);
  ce_min_bytes_ = c_.cfg.ce_min_bytes;
  RF_CU(cuStreamCreate, &stream_, CU_STREAM_NON_BLOCKING);
  launch_->prepare(stream_);
  pool_.create(ordinal_, stream_);
  // Mapped host memory: the Control block, then the mirror of the dispatch counts (CPU-sync wait).
  const int64_t counts_words = kargs::host_counts_words(world(), c_.experts_per_rank());
  host_.create(int64_t(sizeof(Control)) + counts_words * 8);
  ctl_ = host_.host_at<Control>(0);
  ctl_dev_ = host_.device();
  {  // stream waits write a word into the Control block where the GPU can (wait_stream)
    CUdevice cu_dev = 0;
    int mem_ops = 0;
    RF_CU(cuDeviceGet, &cu_dev, ordinal_);
    RF_CU(cuDeviceGetAttribute, &mem_ops, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, cu_dev);
    stream_writes_ = mem_ops != 0;
  }
  counts_host_ = host_.host_at<uint64_t>(int64_t(sizeof(Control)));
  counts_dev_ = host_.device_at(int64_t(sizeof(Control)));
  pinned_.create(kPinnedStagingBytes);
  for (CUevent& e : pinned_done_) RF_CU(cuEventCreate, &e, CU_EVENT_DISABLE_TIMING);
  // The abort words' page, mapped into the GPU so that waiting kernels see an abort at once; where
  // that cannot be, the CPU copies the words into the Control block when it notices them.
  abort_dev_ = reinterpret_cast<const int32_t*>(ctl_dev_ + offsetof(Control, abort_mirror));
  int32_t* words = c_.abort.words();
  if (c_.abort.attached() && (reinterpret_cast<uintptr_t>(words) & (kPage - 1)) == 0 &&
      d.cuMemHostRegister(words, kPage, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS) {
    registered_ = words;
    CUdeviceptr p = 0;
    if (d.cuMemHostGetDevicePointer(&p, words, 0) == CUDA_SUCCESS) abort_dev_ = reinterpret_cast<const int32_t*>(p);
  }
  // Device scratch: the peer table kernels take, the stream's two arrival words, the graph epoch, the
  // rail headers of the two-level layer (a node's N + 1). The kernels' workspace layout is the node's:
  // in a world of one node, the world's (c_.ws).
  kws_ = WorkspaceLayout::make(c_.nodes.ranks_per_node, int32_t(c_.experts_per_rank()));
  const std::vector<uint64_t> table = kernel_peers();
  const int64_t table_bytes = align_up(int64_t(table.size() * sizeof(uint64_t)), 256);
  const int64_t frames_bytes = align_up(16 * int64_t(c_.nodes.num_nodes + 1), 256);
  scratch_ = pool_.alloc(table_bytes + 256 + frames_bytes, "the peer table");
  peers_ = scratch_;
  arrivals_ = scratch_ + CUdeviceptr(table_bytes);
  epoch_ = arrivals_ + 64;
  rail_frames_ = arrivals_ + 256;
  from_host(peers_, table.data(), int64_t(table.size() * sizeof(uint64_t)));
  RF_CU(cuMemsetD8Async, arrivals_, 0, size_t(256 + frames_bytes), stream_);
  // My workspace is zeroed before any peer can see my fds (they come from exported(), after this);
  // every rank of the kernels' view serves (an elastic group changes it: membership.cc).
  RF_CU(cuMemsetD8Async, mem_.window(), 0, size_t(c_.ws.bytes), stream_);
  write_live(all_ranks_mask(kernel_world()), 0);
  RF_CU(cuEventCreate, &op_start_, CU_EVENT_DEFAULT);
  RF_CU(cuEventCreate, &op_end_, CU_EVENT_DEFAULT);
  const EpConfig& ep = c_.cfg.ep;
  state_layout_ = kargs::MoeStateLayout::make(world(), ep.max_tokens_per_rank, ep.topk, c_.experts_per_rank());
  topk_bytes_ = align_up(std::max<int64_t>(1, ep.max_tokens_per_rank * ep.topk * 4), kRegionAlignment);
  notify_scratch_ = kargs::NotifyScratch::make(launch_->notify_blocks(ep.max_tokens_per_rank), world(), int32_t(ep.num_experts));
  if (fuses()) {  // the fused dispatch's rows and flags (one for the context: its kernels run in turn), zeroed
    fused_blocks_ = launch_->fused_blocks();
    // Rows asked of L2 ahead of the copies: under half of it (shared by the ranks on the GPU), so
    // that they are still there when copied while the copies' stores pass through it (30-45%
    // measured best on an H200 for 1 rank; 60-80% less).
    launch_->set_fused_prefetch(dev_->l2_bytes() * 45 / 100 / std::max(1, c_.cfg.device_share));
    const int64_t bytes = kargs::FusedScratch::make(fused_blocks_, world(), int32_t(ep.num_experts)).bytes;
    fused_scratch_ = pool_.alloc(bytes, "the fused dispatch's scratch");
    fused_scratch_bytes_ = bytes;
    RF_CU(cuMemsetD8Async, fused_scratch_, 0, size_t(bytes), stream_);
  }
  RF_CU(cuStreamSynchronize, stream_);
}

ExportedSegments CudaBackend::exported() const { return mem_.exported(); }

void CudaBackend::import_peers(const std::vector<ExportedSegments>& peers, uint64_t seq) { map_peers(peers, seq, comm_ != nullptr); }

void CudaBackend::map_peers(const std::vector<ExportedSegments>& peers, uint64_t seq, bool register_window) {
  const Nodes& nd = c_.nodes;
  translating(rank(), [&] {
    // Same process: the fds are borrowed, closed by their owner at destroy.
    // Ranks that left an elastic group (a replacement's registration) have no segments to map.
    mem_.import_peers(peers, false, nd.first_local(), nd.ranks_per_node, nd.two_level() ? ~uint64_t(0) : c_.live_mask);
    if (c_.cpu_bytes > 0) {  // engram: every host segment my GPU reaches (my node's; 0 elsewhere)
      std::vector<uint64_t> seg(static_cast<size_t>(world()));
      for (int p = 0; p < world(); ++p) seg[size_t(p)] = nd.same_node(p) ? uint64_t(mem_.host_segment(p)) : 0;
      segments_ = pool_.alloc(int64_t(seg.size() * sizeof(uint64_t)), "the host segments' table");
      from_host(segments_, seg.data(), int64_t(seg.size() * sizeof(uint64_t)));
    }
    if (register_window)  // collective: every rank registers its device segment at the same time
      RF_NCCL(ncclCommWindowRegister, comm_, reinterpret_cast<void*>(mem_.window()), size_t(mem_.device_bytes()),
              &window_, kNcclWinCollSymmetric);
  });
  barrier(seq, false, true);  // every window is mapped before anyone writes into one
}

std::vector<uint8_t> CudaBackend::nccl_unique_id() {
  std::string why;
  if (!c_.cfg.nccl || !nccl_available(&why)) return {};
  return make_unique_id();
}

std::vector<uint8_t> CudaBackend::make_unique_id() {
  set_nccl_host_id(c_.cfg.nccl_host_id);
  return translating(rank(), [&] {
    ncclUniqueId id;
    RF_NCCL(ncclGetUniqueId, &id);
    return std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal));
  });
}

void CudaBackend::nccl_init(const std::vector<uint8_t>& id) {
  check_alive("ncclInit");
  RF_CHECK(c_.cfg.nccl, "EINVAL", "ncclInit: this group makes no NCCL communicator (its ranks share a GPU)");
  init_comm(id, world(), rank(), "rank 0");
}

void CudaBackend::init_comm(const std::vector<uint8_t>& id, int n, int me, const char* whose) {
  check_alive("ncclInit");
  RF_CHECK(id.size() == RF_NCCL_UNIQUE_ID_BYTES, "EINVAL",
           std::string("ncclInit needs the 128-byte NCCL unique id of ") + whose + ", got " + std::to_string(id.size()) + " bytes");
  RF_CHECK(comm_ == nullptr, "STATE", "rank " + std::to_string(rank()) + " already has an NCCL communicator");
  translating(rank(), [&] {
    set_nccl_host_id(c_.cfg.nccl_host_id);
    ncclUniqueId uid;
    std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
    RF_NCCL(ncclCommInitRank, &comm_, n, uid, me);
  });
}

std::vector<uint64_t> CudaBackend::kernel_peers() const {
  std::vector<uint64_t> table;
  for (int j = 0; j < kernel_world(); ++j) table.push_back(uint64_t(kernel_peer_base(j)));
  return table;
}

CUdeviceptr CudaBackend::kernel_peer_base(int j) const { return mem_.peer_base(c_.nodes.rank_of(c_.nodes.node, j)); }

BackendInfo CudaBackend::info() const {
  BackendInfo i;
  i.backend = "cuda";
  i.device_memory = true;
  i.memory_kind = mem_.kind();
  i.stride = mem_.stride();
  for (int p = 0; p < world(); ++p) i.windows.push_back(uint64_t(mem_.peer_base(p)));
  i.device_ordinal = ordinal_;
  i.device_name = dev_ ? dev_->name() : std::string();
  i.nccl = comm_ != nullptr;
  i.sms = launch_ ? launch_->sm_count() : 0;
  i.sm_share = launch_ ? std::max(1, launch_->sm_count() / launch_->share()) : 0;
  if (launch_) i.graph_launches = launch_->graph_launches(), i.direct_launches = launch_->direct_launches();
  i.fused_dispatches = fused_dispatches_;
  return i;
}

void CudaBackend::read_window(int64_t offset, int64_t len, uint8_t* out) {
  translating(rank(), [&] {
    RF_CU(cuStreamSynchronize, stream_);
    RF_CU(cuMemcpyDtoH, out, mem_.window() + CUdeviceptr(offset), size_t(len));
  });
}

uint64_t CudaBackend::write_peer(int peer, int64_t offset, const uint8_t* src, int64_t len) {
  const CUdeviceptr dst = mem_.translate(mem_.window() + CUdeviceptr(offset), peer);
  if (len > 0) translating(rank(), [&] { RF_CU(cuMemcpyHtoD, dst, src, size_t(len)); });
  return uint64_t(dst);
}

// The worker is gone without destroy() (process.exit in a worker, a crash): its kernels are told to
// stop through the abort words they read, and its streams drain. What destroy() does then (module
// unloads, unmaps, frees) may synchronise the whole device, whose other ranks (ranks sharing the GPU)
// may wait in kernels for this one: their abort words are raised only once this worker has ended.
bool CudaBackend::quiesce() noexcept {
  try {
    if (dev_) dev_->make_current();
    c_.abort.stop_shared();
    if (stream_ != nullptr) {
      mirror_abort();
      driver().cuStreamSynchronize(stream_);
    }
    if (busy_stream_ != nullptr) driver().cuStreamSynchronize(busy_stream_);
  } catch (...) {
  }
  return true;
}

void CudaBackend::destroy() noexcept {
  if (destroyed_) return;
  destroyed_ = true;
  try {
    if (dev_) dev_->make_current();
  } catch (...) {
  }
  const Driver* d = nullptr;
  try {
    d = &driver();
  } catch (...) {
  }
  const bool failing = dead_ || c_.abort.failed_rank() >= 0 || c_.abort.abandoned.load();
  // Two levels: NCCL kernels on the stream waiting for a rail peer that is gone never give up on their own.
  if (failing) abort_rails();
  if (d != nullptr && stream_ != nullptr) {
    // Kernels still waiting for peers that are gone give up once told; then nothing runs on the memory.
    if (abort_raised() || c_.abort.abandoned.load()) mirror_abort();
    d->cuStreamSynchronize(stream_);
  }
  if (d != nullptr) {
    for (auto& [id, g] : graphs_) {
      if (g.exec != nullptr) d->cuGraphExecDestroy(g.exec);
      if (g.graph != nullptr) d->cuGraphDestroy(g.graph);
    }
  }
  graphs_.clear();
  capture_ = Graph{};
  rails_.reset();
  if (comm_ != nullptr) {
    try {
      const Nccl& n = nccl();
      // Deregistering and destroying are collective: only when every peer is tearing down too. After a
      // peer's failure, a rank that gave up, or when this rank's worker is gone (terminated: its peers
      // are not tearing down with it), nobody may answer: abort, which is local.
      if (failing) {
        n.ncclCommAbort(comm_);
      } else {
        if (window_ != nullptr) n.ncclCommWindowDeregister(comm_, window_);
        n.ncclCommDestroy(comm_);
      }
    } catch (...) {
    }
    comm_ = nullptr;
    window_ = nullptr;
  }
  launch_.reset();
  modules_.reset();
  if (d != nullptr) {
    if (busy_stream_ != nullptr) d->cuStreamSynchronize(busy_stream_), d->cuStreamDestroy(busy_stream_);
    for (CUevent* e : {&op_start_, &op_end_, &pinned_done_[0], &pinned_done_[1]})
      if (*e != nullptr) d->cuEventDestroy(*e);
    // Its peers on this GPU pull rows from this rank's tensors (kernels/combine.cu pull mode). A healthy
    // op ends only once every peer read them (its last block waits for their done), but after a failure
    // (a peer gone, this worker terminated) this rank's kernels gave up early and a peer's may still be
    // reading: everything launched before now ends first (they give up once told, by their abort words,
    // which this thread does not hold up), then the memory goes.
    if (failing && c_.cfg.device_share > 1) d->cuCtxSynchronize();
    pool_.destroy();  // scratch, segments and staging too
    if (stream_ != nullptr) d->cuStreamDestroy(stream_);
    if (registered_ != nullptr) d->cuMemHostUnregister(registered_);
  }
  busy_stream_ = nullptr;
  op_start_ = op_end_ = pinned_done_[0] = pinned_done_[1] = nullptr;
  stream_ = nullptr;
  scratch_ = segments_ = stage_ = fused_scratch_ = 0;
  registered_ = nullptr;
  stage_bytes_ = 0;
  host_.destroy();
  pinned_.destroy();
  ctl_ = nullptr;
  mem_.destroy();
  dev_.reset();  // releases the primary context
}

kargs::RankArgs CudaBackend::rank_args(uint64_t seq) const {
  kargs::RankArgs a;
  a.peers = reinterpret_cast<const uint64_t*>(peers_);
  a.buffer_offset = c_.ws.bytes;
  a.ws = kws_;
  a.rank = kernel_rank();
  a.world = kernel_world();
  if (capturing_) {
    a.seq = seq - capture_base_;
    a.epoch = reinterpret_cast<const uint64_t*>(epoch_);
  } else {
    a.seq = seq;
  }
  a.timeout_ns = uint64_t(c_.cfg.gpu_timeout_s * 1e9);
  a.ctl = reinterpret_cast<Control*>(ctl_dev_);
  a.abort = abort_dev_;
  a.arrivals = reinterpret_cast<unsigned int*>(arrivals_);
  a.live = reinterpret_cast<const uint64_t*>(live_word());
  return a;
}

}  // namespace cuda
}  // namespace rankflow
