// The CUDA backend's lifecycle, its waits and the Control block they read, and device memory and
// events for rank programs (backend.hpp). Everything runs on the rank's thread, where the rank's
// primary context was made current when this object was built.
#include "backend.hpp"

#include <cstring>

#include "driver.hpp"
#include "faults.hpp"
#include "runtime/wait.hpp"

namespace rankflow {

std::unique_ptr<Backend> make_cuda_backend(Context& c) { return std::make_unique<cuda::CudaBackend>(c); }

namespace cuda {

namespace {
std::string hex(uint64_t v) {
  char s[32];
  snprintf(s, sizeof s, "0x%016llx", static_cast<unsigned long long>(v));
  return s;
}
constexpr uintptr_t kPage = 4096;
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
  launch_ = std::make_unique<Launcher>(modules_->kernels(), dev_->sm_count(), c_.cfg.device_share, c_.cfg.cooperative);
  ce_min_bytes_ = c_.cfg.ce_min_bytes;
  RF_CU(cuStreamCreate, &stream_, CU_STREAM_NON_BLOCKING);
  pool_.create(ordinal_, stream_);
  // Mapped host memory: the Control block, then the mirror of the dispatch counts (CPU-sync wait).
  const int64_t counts_words = kargs::host_counts_words(world(), c_.experts_per_rank());
  host_.create(int64_t(sizeof(Control)) + counts_words * 8);
  ctl_ = host_.host_at<Control>(0);
  ctl_dev_ = host_.device();
  counts_host_ = host_.host_at<uint64_t>(int64_t(sizeof(Control)));
  counts_dev_ = host_.device_at(int64_t(sizeof(Control)));
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
  // Device scratch: the peer table kernels take, the stream's two arrival words, the graph epoch.
  const std::vector<uint64_t> table = mem_.peer_table();
  const int64_t table_bytes = align_up(int64_t(table.size() * sizeof(uint64_t)), 256);
  scratch_ = pool_.alloc(table_bytes + 256, "the peer table");
  peers_ = scratch_;
  arrivals_ = scratch_ + CUdeviceptr(table_bytes);
  epoch_ = arrivals_ + 64;
  RF_CU(cuMemcpyHtoDAsync, peers_, table.data(), table.size() * sizeof(uint64_t), stream_);
  RF_CU(cuMemsetD8Async, arrivals_, 0, 256, stream_);
  // My workspace is zeroed before any peer can see my fds (they come from exported(), after this).
  RF_CU(cuMemsetD8Async, mem_.window(), 0, size_t(c_.ws.bytes), stream_);
  RF_CU(cuEventCreate, &op_start_, CU_EVENT_DEFAULT);
  RF_CU(cuEventCreate, &op_end_, CU_EVENT_DEFAULT);
  const EpConfig& ep = c_.cfg.ep;
  state_layout_ = kargs::MoeStateLayout::make(world(), ep.max_tokens_per_rank, ep.topk, c_.experts_per_rank());
  topk_bytes_ = align_up(std::max<int64_t>(1, ep.max_tokens_per_rank * ep.topk * 4), kRegionAlignment);
  RF_CU(cuStreamSynchronize, stream_);
}

ExportedSegments CudaBackend::exported() const { return mem_.exported(); }

void CudaBackend::import_peers(const std::vector<ExportedSegments>& peers, uint64_t seq) {
  translating(rank(), [&] {
    mem_.import_peers(peers);  // same process: the fds are borrowed, closed by their owner at destroy
    if (c_.cpu_bytes > 0) {    // engram: every rank's host segment, as my GPU addresses it
      std::vector<uint64_t> seg(static_cast<size_t>(world()));
      for (int p = 0; p < world(); ++p) seg[size_t(p)] = uint64_t(mem_.host_segment(p));
      segments_ = pool_.alloc(int64_t(seg.size() * sizeof(uint64_t)), "the host segments' table");
      RF_CU(cuMemcpyHtoDAsync, segments_, seg.data(), seg.size() * sizeof(uint64_t), stream_);
    }
    if (comm_ != nullptr)  // collective: every rank registers its device segment at the same time
      RF_NCCL(ncclCommWindowRegister, comm_, reinterpret_cast<void*>(mem_.window()), size_t(mem_.device_bytes()),
              &window_, kNcclWinCollSymmetric);
  });
  barrier(seq, false, true);  // every window is mapped before anyone writes into one
}

std::vector<uint8_t> CudaBackend::nccl_unique_id() {
  std::string why;
  if (!c_.cfg.nccl || !nccl_available(&why)) return {};
  return translating(rank(), [&] {
    ncclUniqueId id;
    RF_NCCL(ncclGetUniqueId, &id);
    return std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal));
  });
}

void CudaBackend::nccl_init(const std::vector<uint8_t>& id) {
  check_alive("ncclInit");
  RF_CHECK(c_.cfg.nccl, "EINVAL", "ncclInit: this group makes no NCCL communicator (its ranks share a GPU)");
  RF_CHECK(id.size() == RF_NCCL_UNIQUE_ID_BYTES, "EINVAL",
           "ncclInit needs the 128-byte NCCL unique id of rank 0, got " + std::to_string(id.size()) + " bytes");
  RF_CHECK(comm_ == nullptr, "STATE", "rank " + std::to_string(rank()) + " already has an NCCL communicator");
  translating(rank(), [&] {
    ncclUniqueId uid;
    std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
    RF_NCCL(ncclCommInitRank, &comm_, world(), uid, rank());
  });
}

BackendInfo CudaBackend::info() const {
  BackendInfo i;
  i.backend = "cuda";
  i.memory_kind = mem_.kind();
  i.stride = mem_.stride();
  for (int p = 0; p < world(); ++p) i.windows.push_back(uint64_t(mem_.peer_base(p)));
  i.device_ordinal = ordinal_;
  i.device_name = dev_ ? dev_->name() : std::string();
  i.nccl = comm_ != nullptr;
  i.sms = launch_ ? launch_->sm_count() : 0;
  i.sm_share = launch_ ? std::max(1, launch_->sm_count() / launch_->share()) : 0;
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

void CudaBackend::check_alive(const char* op) const {
  if (dead_)
    throw Error("RANK_FAILED",
                "rank " + std::to_string(rank()) + " cannot run " + op + ": its protocol state is gone (" + death_ +
                    "); destroy the group",
                rank());
}

void CudaBackend::mark_dead(const std::string& why) const {
  if (dead_) return;
  dead_ = true;
  death_ = why;
}

bool CudaBackend::abort_raised() const { return c_.abort.raised(); }

void CudaBackend::mirror_abort() {
  const int32_t* w = c_.abort.words();
  volatile int32_t* m = ctl_->abort_mirror;
  m[0] = __atomic_load_n(w, __ATOMIC_ACQUIRE);
  m[1] = c_.abort.stopping() ? 1 : 0;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

template <typename Ready>
void CudaBackend::wait_device(const WaitSite& site, Ready ready) {
  // Aborts are passed on to the kernels, then the wait goes on until the stream drained (its memory
  // may be freed after); the kernels give up within the GPU timeout, the CPU waits a little longer.
  bool aborted = false;
  WaitRules r = c_.rules;
  r.abort = nullptr;
  r.gpu_timeout_s = c_.cfg.gpu_timeout_s + 5;
  try {
    wait_until(r, site, WaitKind::Device, [&] {
      if (ready()) return true;
      if (!aborted && abort_raised()) {
        aborted = true;
        mirror_abort();
      }
      return false;
    }, [] { return uint64_t(0); });
  } catch (const Error& e) {
    mark_dead("its GPU work did not finish within the GPU timeout");
    throw Error("TIMEOUT_GPU", std::string(e.what()) + ": the rank's GPU work did not finish", site.peer,
                phase_name(site.phase));
  }
  // Raised while the op ran (its kernels may have given up before this wait saw it): the op's
  // results cannot be trusted, and the rank is failing anyway.
  if (aborted || abort_raised()) {
    const int failed = c_.abort.failed_rank();
    mark_dead(failed >= 0 ? "released after rank " + std::to_string(failed) + " failed" : "released at teardown");
    WaitRules a = c_.rules;
    throw abort_error(a, site);
  }
  check_control(site);
}

void CudaBackend::wait_stream(const WaitSite& site) {
  const Driver& d = driver();
  wait_device(site, [&] {
    const CUresult res = d.cuStreamQuery(stream_);
    if (res == CUDA_SUCCESS) return true;
    if (res != CUDA_ERROR_NOT_READY) fail_stream(res);
    return false;
  });
}

// An async op's end (async.cc): its event, queried in the same loop.
void CudaBackend::wait_event(CUevent e, const WaitSite& site) {
  const Driver& d = driver();
  wait_device(site, [&] {
    const CUresult res = d.cuEventQuery(e);
    if (res == CUDA_SUCCESS) return true;
    if (res != CUDA_ERROR_NOT_READY) fail_stream(res);
    return false;
  });
}

// The barrier kernel writes the op's sequence number into Control.completed_seq at its end: a spin on
// mapped host memory, no driver call, except every few hundred polls to see a fault early.
void CudaBackend::wait_completed(uint64_t seq, const WaitSite& site) {
  const Driver& d = driver();
  const volatile uint64_t* flag = &ctl_->completed_seq;
  uint32_t polls = 0;
  wait_device(site, [&] {
    if (*flag >= seq) return true;
    if ((++polls & 255) == 0) {
      const CUresult res = d.cuStreamQuery(stream_);
      if (res != CUDA_SUCCESS && res != CUDA_ERROR_NOT_READY) fail_stream(res);
    }
    return false;
  });
}

void CudaBackend::check_control(const WaitSite& site) {
  check_gave_up();
  check_refused();
  (void)site;
}

void CudaBackend::check_gave_up() {
  volatile Control* k = ctl_;
  if (k->diag.code == kDiagTimeout) {
    const uint64_t phase = k->diag.phase;
    const int peer = int(k->diag.peer);
    mark_dead("a device-side wait timed out");
    throw Error("TIMEOUT_GPU",
                "device-phase wait of rank " + std::to_string(rank()) + " in " + phase_name(phase) + " timed out after " +
                    seconds_text(c_.cfg.gpu_timeout_s) + " s on counter " +
                    (phase == kPhaseBarrier ? "barrier" : phase == kPhaseEnter ? "enter" : "done") + "[from rank " +
                    std::to_string(peer) + "] (last value " + hex(k->diag.value) +
                    "); the kernels gave up, so rank " + std::to_string(rank()) +
                    "'s protocol state is gone, but its GPU stays usable: destroy the group (a new one works)",
                peer, phase_name(phase));
  }
}

void CudaBackend::check_refused() {
  volatile Control* k = ctl_;
  if (k->bad_seq != 0) {
    const uint64_t seq = k->bad_seq;
    const int64_t index = k->bad_index, value = k->bad_value;
    k->bad_seq = 0;
    if (index == kBadHandle)
      throw Error("EINVAL", "inputs.handle: rank " + std::to_string(value) + " replays another dispatch's handle than rank " +
                                std::to_string(rank()) + " in dispatch/combine #" + std::to_string(seq) +
                                ": every rank must pass the handle of the same dispatch (that op moved no rows between them)");
    throw Error("EINVAL", "topkIdx[" + std::to_string(index) + "]: " + std::to_string(value) + " is outside [0, " +
                              std::to_string(c_.cfg.ep.num_experts) + ") and not -1 (dispatch #" + std::to_string(seq) +
                              ", found on the GPU: that slot was dropped)");
  }
}

// A launch failed: a kernel faulted (device waits never trap). CUDA's launch failures are sticky for
// the whole process: every rank's context in it is dead.
void CudaBackend::fail_stream(CUresult r) {
  const std::string name = error_name(r);
  mark_dead("a kernel failed with " + name);
  std::string note;
  const int culprit = faulted_elsewhere(rank(), &note);
  if (culprit >= 0)
    throw Error("RANK_FAILED", "rank " + std::to_string(rank()) + ": its stream failed with " + name + "." + note, culprit);
  record_fault(rank(), "rank " + std::to_string(rank()) + "'s kernel on GPU " + std::to_string(ordinal_) + " failed with " + name);
  throw Error("RANK_FAILED",
              "rank " + std::to_string(rank()) + ": a kernel failed with " + name +
                  " (a fault, not a timeout); the GPU context is dead: destroy the group",
              rank());
}

// Driver mode's device copy of host tensors: grown in stream order (the old block is freed after the
// work queued on it), never with a device-wide synchronisation.
CUdeviceptr CudaBackend::staging(int64_t bytes) {
  if (bytes > stage_bytes_) {
    translating(rank(), [&] {
      if (stage_ != 0) pool_.free(stage_);
      stage_ = 0;
      stage_bytes_ = 0;
      const int64_t n = align_up(bytes, kAlignment);
      stage_ = pool_.alloc(n, "driver-mode staging");
      stage_bytes_ = n;
    });
  }
  return stage_;
}

// A host tensor of `bytes` copied to staging + at (device tensors pass through).
Mem CudaBackend::stage_in(Mem m, int64_t bytes, int64_t at) {
  if (!m || m.device) return m;
  const CUdeviceptr dst = stage_ + CUdeviceptr(at);
  if (bytes > 0) translating(rank(), [&] { RF_CU(cuMemcpyHtoDAsync, dst, m.ptr, size_t(bytes), stream_); });
  return Mem{reinterpret_cast<void*>(uintptr_t(dst)), true};
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
  if (comm_ != nullptr) {
    try {
      const Nccl& n = nccl();
      // Deregistering and destroying are collective: only when every peer is tearing down too. After a
      // peer's failure, a rank that gave up, or when this rank's worker is gone (terminated: its peers
      // are not tearing down with it), nobody may answer: abort, which is local.
      if (dead_ || c_.abort.failed_rank() >= 0 || c_.abort.abandoned.load()) {
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
    for (CUevent* e : {&op_start_, &op_end_})
      if (*e != nullptr) d->cuEventDestroy(*e);
    pool_.destroy();  // scratch, segments and staging too
    if (stream_ != nullptr) d->cuStreamDestroy(stream_);
    if (registered_ != nullptr) d->cuMemHostUnregister(registered_);
  }
  busy_stream_ = nullptr;
  op_start_ = op_end_ = nullptr;
  stream_ = nullptr;
  scratch_ = segments_ = stage_ = 0;
  registered_ = nullptr;
  stage_bytes_ = 0;
  host_.destroy();
  ctl_ = nullptr;
  mem_.destroy();
  dev_.reset();  // releases the primary context
}

// ---- device memory, events ----

uint64_t CudaBackend::device_alloc(int64_t bytes) {
  check_alive("a device tensor");
  const CUdeviceptr p = translating(rank(), [&] { return pool_.alloc(bytes, "device tensor"); });
  if (capturing_) capture_.outputs.push_back(p);  // the graph writes it on every replay: it keeps it
  return uint64_t(p);
}

void CudaBackend::device_free(uint64_t ptr) {
  for (const auto& [id, g] : graphs_)
    for (const CUdeviceptr p : g.outputs)
      if (p == CUdeviceptr(ptr)) return;  // a graph's output: freed with the graph
  translating(rank(), [&] { pool_.free(CUdeviceptr(ptr)); });
}

void CudaBackend::upload(uint64_t dst, const void* src, int64_t bytes) {
  check_alive("tensor upload");
  // On the rank's stream: kernels on it see the bytes (a pageable copy returns once staged).
  if (bytes > 0) translating(rank(), [&] { RF_CU(cuMemcpyHtoDAsync, CUdeviceptr(dst), src, size_t(bytes), stream_); });
}

void CudaBackend::download(void* dst, uint64_t src, int64_t bytes) {
  check_alive("tensor download");
  wait_stream(WaitSite{kPhaseNone, -1, "stream"});
  if (bytes > 0) translating(rank(), [&] { RF_CU(cuMemcpyDtoHAsync, dst, CUdeviceptr(src), size_t(bytes), stream_); });
  wait_stream(WaitSite{kPhaseNone, -1, "stream"});
}

void CudaBackend::sync() {
  check_alive("sync");
  wait_stream(WaitSite{kPhaseNone, -1, "stream"});
}

uint64_t CudaBackend::record_event() {
  check_alive("recordEvent");
  return translating(rank(), [&] {
    const CUevent e = pool_.new_event();
    RF_CU(cuEventRecord, e, stream_);
    return uint64_t(reinterpret_cast<uintptr_t>(e));
  });
}

double CudaBackend::elapsed_ms(uint64_t start, uint64_t end) {
  auto* a = reinterpret_cast<CUevent>(uintptr_t(start));
  auto* b = reinterpret_cast<CUevent>(uintptr_t(end));
  RF_CHECK(pool_.owns_event(a) && pool_.owns_event(b), "EINVAL", "elapsedMs: not events of this rank");
  wait_stream(WaitSite{kPhaseNone, -1, "stream"});
  float ms = 0;
  translating(rank(), [&] { RF_CU(cuEventElapsedTime, &ms, a, b); });
  return double(ms);
}

void CudaBackend::destroy_event(uint64_t event) { pool_.destroy_event(reinterpret_cast<CUevent>(uintptr_t(event))); }

double CudaBackend::last_op_ms() {
  wait_stream(WaitSite{kPhaseNone, -1, "stream"});
  float ms = 0;
  translating(rank(), [&] { RF_CU(cuEventElapsedTime, &ms, op_start_, op_end_); });
  return double(ms);
}

kargs::RankArgs CudaBackend::rank_args(uint64_t seq) const {
  kargs::RankArgs a;
  a.peers = reinterpret_cast<const uint64_t*>(peers_);
  a.buffer_offset = c_.ws.bytes;
  a.ws = c_.ws;
  a.rank = rank();
  a.world = world();
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
  return a;
}

}  // namespace cuda
}  // namespace rankflow
