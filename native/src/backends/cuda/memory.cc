// Device memory and events of the CUDA backend (backend.hpp): driver mode's staging of host tensors,
// rank programs' device tensors (the rank's pool), uploads and downloads on the rank's stream, CUDA
// events and the device time of the last op.
#include <algorithm>
#include <cstring>

#include "backend.hpp"
#include "driver.hpp"
#include "faults.hpp"

namespace rankflow::cuda {

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
  translating(rank(), [&] { from_host(dst, m.ptr, bytes); });
  return Mem{reinterpret_cast<void*>(uintptr_t(dst)), true};
}

// From pageable memory the driver stages a copy in pinned buffers of its own, shared by every thread
// of the process, and once they are taken a copy waits inside the driver for its stream's earlier work
// to reach it. With ranks sharing a GPU that work can be a kernel waiting for a peer whose own copy
// waits for those buffers: a deadlock until the GPU timeout (test/gpu/shared-gpu-copies.test.mjs).
// So every copy from host memory goes through the rank's own pinned staging, in stream order: two
// halves, each refilled once the copy out of it ran (its event, waited for in the runtime's wait loop,
// where the peers go on). The caller's memory may change as soon as this returns.
void CudaBackend::from_host(CUdeviceptr dst, const void* src, int64_t bytes) {
  if (bytes <= 0) return;
  RF_CHECK(!capturing_, "STATE",
           "a copy from host memory inside rank.capture(): a graph replays device work only; upload before the capture");
  const int64_t half = pinned_.bytes() / 2;
  const auto* from = static_cast<const uint8_t*>(src);
  for (int64_t at = 0; at < bytes; at += half) {
    const int64_t n = std::min(half, bytes - at);
    const int k = pinned_next_;
    pinned_next_ ^= 1;
    wait_event(pinned_done_[k], WaitSite{kPhaseNone, -1, "host staging"});  // never recorded: ready
    uint8_t* stage = pinned_.host_at<uint8_t>(int64_t(k) * half);
    std::memcpy(stage, from + at, size_t(n));
    RF_CU(cuMemcpyHtoDAsync, dst + CUdeviceptr(at), stage, size_t(n), stream_);
    RF_CU(cuEventRecord, pinned_done_[k], stream_);
  }
}

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
  // On the rank's stream: kernels on it see the bytes.
  translating(rank(), [&] { from_host(CUdeviceptr(dst), src, bytes); });
}

void CudaBackend::zero(uint64_t dst, int64_t bytes) {
  check_alive("a device tensor");
  if (bytes > 0) translating(rank(), [&] { RF_CU(cuMemsetD8Async, CUdeviceptr(dst), 0, size_t(bytes), stream_); });
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

void CudaBackend::time_start() {
  if (!timing()) return;
  op_timed_ = false;  // an op that fails before its end leaves nothing to read
  RF_CU(cuEventRecord, op_start_, stream_);
}

void CudaBackend::time_end() {
  if (!timing()) return;
  RF_CU(cuEventRecord, op_end_, stream_);
  op_timed_ = true;
}

void CudaBackend::set_op_timing(bool on) {
  op_timing_ = on;
  if (!on) op_timed_ = false;
}

double CudaBackend::last_op_ms() {
  RF_CHECK(op_timed_, "STATE",
           op_timing_ ? "lastOpDeviceMs: no dispatch or combine has run since rank.timeOps(true)"
                      : "lastOpDeviceMs: ops are not timed; call rank.timeOps(true) before the dispatch or combine to time");
  wait_stream(WaitSite{kPhaseNone, -1, "stream"});
  float ms = 0;
  translating(rank(), [&] { RF_CU(cuEventElapsedTime, &ms, op_start_, op_end_); });
  return double(ms);
}

}  // namespace rankflow::cuda
