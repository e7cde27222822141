// GPU smoke test of the CUDA backend's pieces, on a machine with 2 GPUs: 2 ranks in 2 threads (one
// primary context each) create GPU-only, elastic and hybrid symmetric memory, import each other's
// fds, check the mappings byte for byte, run the barrier and allGather kernels (checked against a
// host-computed reference and, where NCCL loads, against ncclAllGather), register a window with
// NCCL, and tear everything down. Last, a child process checks the device-side timeout: one rank
// never signals, the other's barrier writes its Diagnostic and traps (a trap poisons the context,
// hence the separate process). Prints one PASS/FAIL line per step; exit status 0 only if all pass.
//   build: native/test/build.sh      run: build/cuda-test/cuda_smoke
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device.hpp"
#include "cuda/driver.hpp"
#include "cuda/host_workspace.hpp"
#include "cuda/kernel_images.hpp"
#include "cuda/kernels.hpp"
#include "cuda/launch.hpp"
#include "cuda/nccl.hpp"
#include "cuda/symmetric.hpp"
#include "harness.hpp"
#include "layout.hpp"

extern char** environ;

namespace {

using namespace rankflow;
using namespace rankflow::cuda;

constexpr int kWorld = 2;
constexpr int64_t kDeviceBytes = 16 << 20;
constexpr int64_t kHostBytes = 2 << 20;
constexpr uint64_t kTimeoutNs = 10ull * 1000 * 1000 * 1000;  // generous: a healthy wait is microseconds

// Reporting, rank threads and their rendezvous: harness.hpp.
using rftest::g_failed;
using rftest::info;
using rftest::Rendezvous;
using rftest::report;
void run_ranks(const char* step, Rendezvous& rv, const std::function<void(int)>& body) { rftest::run_ranks(kWorld, step, rv, body); }

// A CPU load through a cuMem mapping that the driver accepted but the platform cannot serve faults;
// that must fail the step, not end the smoke run.
thread_local sigjmp_buf* t_fault_jump = nullptr;
void on_fault(int sig) {
  if (t_fault_jump != nullptr) siglongjmp(*t_fault_jump, sig);
  signal(sig, SIG_DFL);
  raise(sig);
}
// Reads two bytes through `p` with the CPU; false if that faulted.
bool cpu_read(const volatile uint8_t* p, int64_t bytes, uint8_t* first, uint8_t* last) {
  sigjmp_buf jump;
  struct sigaction sa = {}, old_segv = {}, old_bus = {};
  sa.sa_handler = on_fault;
  sigaction(SIGSEGV, &sa, &old_segv);
  sigaction(SIGBUS, &sa, &old_bus);
  bool ok = false;
  if (sigsetjmp(jump, 1) == 0) {
    t_fault_jump = &jump;
    *first = p[0];
    *last = p[bytes - 1];
    ok = true;
  }
  t_fault_jump = nullptr;
  sigaction(SIGSEGV, &old_segv, nullptr);
  sigaction(SIGBUS, &old_bus, nullptr);
  return ok;
}

uint8_t pattern(int rank, int64_t i, int iter) { return uint8_t(i * 131 + rank * 17 + iter * 29 + 1); }

// Device scratch, streams and events owned by one rank (freed on scope exit): harness.hpp.
using rftest::DeviceBuffer;
using rftest::Event;
using rftest::Stream;

// What the rank threads of one world share.
struct World {
  Rendezvous rv{kWorld};
  std::vector<ExportedSegments> exports = std::vector<ExportedSegments>(kWorld);
  std::vector<std::vector<uint8_t>> kernel_gather = std::vector<std::vector<uint8_t>>(kWorld);
  ncclUniqueId nccl_id = {};
};

// ---- one world of one memory kind -------------------------------------------------------------------
void run_world(MemoryKind kind, bool with_nccl) {
  World w;
  const char* kname = memory_kind_name(kind);
  const int64_t host_bytes = kind == MemoryKind::GpuOnly ? 0 : kHostBytes;
  const WorkspaceLayout ws = WorkspaceLayout::make(kWorld, 0);
  const int64_t gather_offset = ws.bytes;  // the buffer follows the workspace in every window
  std::string step = std::string("memory ") + kname;

  run_ranks(step.c_str(), w.rv, [&](int rank) {
    DeviceContext dev(rank);
    SymmetricMemory mem;
    w.exports[rank] = mem.create(rank, kWorld, dev, kDeviceBytes, host_bytes, kind, kWorld);
    w.rv.arrive();
    mem.import_peers(w.exports);
    w.rv.arrive();  // nobody closes its exported fds before every peer imported them
    mem.close_exported();
    report(true, "[rank %d] %s: create + import (stride %lld MiB, window at 0x%llx, cpu access to host segments: %s)",
           rank, kname, (long long)(mem.stride() >> 20), (unsigned long long)mem.window(),
           mem.host_cpu_access() ? "yes" : "no");

    // Mappings: each rank fills its own segments; every rank reads every peer's through its window.
    Stream stream;
    RF_CU(cuMemsetD8Async, mem.window(), uint8_t(0x10 + rank), size_t(kDeviceBytes), stream.s);
    if (host_bytes > 0)
      RF_CU(cuMemsetD8Async, mem.host_segment(rank), uint8_t(0x40 + rank), size_t(host_bytes), stream.s);
    RF_CU(cuStreamSynchronize, stream.s);
    w.rv.arrive();
    bool ok = true;
    std::string why;
    std::vector<uint8_t> got(1 << 16);
    for (int p = 0; p < kWorld; ++p) {
      const int64_t at[] = {0, kDeviceBytes / 2, kDeviceBytes - int64_t(got.size())};
      for (int64_t off : at) {
        RF_CU(cuMemcpyDtoH, got.data(), mem.peer_base(p) + CUdeviceptr(off), got.size());
        for (uint8_t b : got)
          if (b != uint8_t(0x10 + p)) {
            ok = false;
            why = "device segment of rank " + std::to_string(p) + " holds " + std::to_string(b);
            break;
          }
      }
      if (host_bytes > 0) {
        RF_CU(cuMemcpyDtoH, got.data(), mem.host_segment(p), got.size());
        for (uint8_t b : got)
          if (b != uint8_t(0x40 + p)) {
            ok = false;
            why = "host segment of rank " + std::to_string(p) + " holds " + std::to_string(b);
            break;
          }
        if (mem.host_cpu_access()) {
          uint8_t first = 0, last = 0;
          if (!cpu_read(reinterpret_cast<const volatile uint8_t*>(mem.host_segment(p)), host_bytes, &first, &last)) {
            ok = false;
            why = "CPU read of rank " + std::to_string(p) + "'s host segment faulted though access was granted";
          } else if (first != uint8_t(0x40 + p) || last != uint8_t(0x40 + p)) {
            ok = false;
            why = "CPU read of rank " + std::to_string(p) + "'s host segment differs";
          }
        }
      }
    }
    report(ok, "[rank %d] %s: every peer's segments read back through this rank's window%s%s", rank,
           kname, ok ? "" : ": ", why.c_str());
    w.rv.arrive();

    // Kernels. The workspace is zeroed by its owner before anybody signals into it.
    Kernels kernels;
    RF_CU(cuMemsetD8Async, mem.window(), 0, size_t(ws.bytes), stream.s);
    RF_CU(cuStreamSynchronize, stream.s);
    const std::vector<uint64_t> table = mem.peer_table();
    DeviceBuffer peers(table.size() * sizeof(uint64_t)), arrivals(16);
    rftest::copy_to_device(peers.ptr, table.data(), table.size() * sizeof(uint64_t));
    RF_CU(cuMemsetD8Async, arrivals.ptr, 0, 16, stream.s);
    HostWorkspace diag_ws;
    diag_ws.create(sizeof(Diagnostic));
    RF_CU(cuStreamSynchronize, stream.s);
    w.rv.arrive();

    SignalArgs a;
    a.peer_table = peers.ptr;
    a.workspace_offset = 0;
    a.ws = ws;
    a.rank = rank;
    a.timeout_ns = kTimeoutNs;
    a.diag = diag_ws.device();
    uint32_t seq = 0;

    Event t0, t1;
    constexpr int kBarriers = 1000;
    a.seq = ++seq;
    launch_barrier(kernels, stream.s, a);  // warm-up
    RF_CU(cuEventRecord, t0.e, stream.s);
    for (int i = 0; i < kBarriers; ++i) {
      a.seq = ++seq;
      launch_barrier(kernels, stream.s, a);
    }
    RF_CU(cuEventRecord, t1.e, stream.s);
    RF_CU(cuStreamSynchronize, stream.s);
    float ms = 0;
    RF_CU(cuEventElapsedTime, &ms, t0.e, t1.e);
    report(true, "[rank %d] %s: %d barriers, %.2f us each", rank, kname, kBarriers, 1000.0 * ms / kBarriers);

    // allGather: sizes from one vector to a 128-token bf16 batch of hidden 7168, each 3 times.
    const int64_t sizes[] = {16, 4096, (1 << 20) + 48, 128 * 7168 * 2};
    DeviceBuffer src(static_cast<size_t>(sizes[3]));
    std::vector<uint8_t> host(static_cast<size_t>(sizes[3]));
    std::vector<uint8_t> out(static_cast<size_t>(kWorld * sizes[3]));
    for (int64_t bytes : sizes) {
      ok = true;
      why.clear();
      for (int iter = 0; iter < 3; ++iter) {  // all 3 even after a mismatch: ranks stay in step
        for (int64_t i = 0; i < bytes; ++i) host[size_t(i)] = pattern(rank, i, iter);
        rftest::copy_to_device(src.ptr, host.data(), size_t(bytes));
        a.seq = ++seq;
        launch_all_gather(kernels, stream.s, a, src.ptr, bytes, gather_offset, arrivals.ptr, 0, dev.sm_count());
        RF_CU(cuStreamSynchronize, stream.s);
        RF_CU(cuMemcpyDtoH, out.data(), mem.window() + CUdeviceptr(gather_offset), size_t(kWorld * bytes));
        for (int p = 0; p < kWorld && ok; ++p)
          for (int64_t i = 0; i < bytes; ++i)
            if (out[size_t(p * bytes + i)] != pattern(p, i, iter)) {
              ok = false;  // the first mismatch is the one reported
              why = "byte " + std::to_string(i) + " of rank " + std::to_string(p) + "'s part, iteration " +
                    std::to_string(iter);
              break;
            }
        // Every rank finished reading its buffer before anybody rewrites it: the kernel's enter
        // signal already guarantees that; this keeps the host-side check simple to reason about.
        w.rv.arrive();
      }
      report(ok, "[rank %d] %s: allGather %lld B per rank, 3 rounds, bytes checked%s%s", rank, kname,
             (long long)bytes, ok ? "" : ": wrong ", why.c_str());
    }
    {
      const int64_t bytes = sizes[3];
      constexpr int kRounds = 50;
      RF_CU(cuEventRecord, t0.e, stream.s);
      for (int i = 0; i < kRounds; ++i) {
        a.seq = ++seq;
        launch_all_gather(kernels, stream.s, a, src.ptr, bytes, gather_offset, arrivals.ptr, 0, dev.sm_count());
      }
      RF_CU(cuEventRecord, t1.e, stream.s);
      RF_CU(cuStreamSynchronize, stream.s);
      RF_CU(cuEventElapsedTime, &ms, t0.e, t1.e);
      const double us = 1000.0 * ms / kRounds;
      report(true, "[rank %d] %s: allGather %lld B per rank: %.1f us, %.1f GB/s received from the peer", rank,
             kname, (long long)bytes, us, double(bytes) * (kWorld - 1) / (us * 1e3));
      // The gather of the timed rounds (src holds iteration 2's data) is the reference for NCCL.
      w.kernel_gather[rank].resize(size_t(kWorld * bytes));
      RF_CU(cuMemcpyDtoH, w.kernel_gather[rank].data(), mem.window() + CUdeviceptr(gather_offset),
            size_t(kWorld * bytes));
    }

    // NCCL: the same allGather through ncclAllGather must give the same bytes; then a window.
    if (with_nccl) {
      const Nccl& n = nccl();
      if (rank == 0) RF_NCCL(ncclGetUniqueId, &w.nccl_id);
      w.rv.arrive();
      ncclComm_t comm = nullptr;
      RF_NCCL(ncclCommInitRank, &comm, kWorld, w.nccl_id, rank);
      const int64_t bytes = sizes[3];
      DeviceBuffer recv(static_cast<size_t>(kWorld * bytes));
      RF_NCCL(ncclAllGather, reinterpret_cast<const void*>(src.ptr), reinterpret_cast<void*>(recv.ptr),
              size_t(bytes), ncclUint8, comm, stream.s);
      RF_CU(cuStreamSynchronize, stream.s);
      std::vector<uint8_t> theirs(static_cast<size_t>(kWorld * bytes));
      RF_CU(cuMemcpyDtoH, theirs.data(), recv.ptr, theirs.size());
      report(theirs == w.kernel_gather[rank], "[rank %d] %s: ncclAllGather (NCCL %s from %s) equals rf_all_gather",
             rank, kname, nccl_version_string(n.version).c_str(), n.origin.c_str());
      // Registration is collective: both ranks' threads call it together.
      ncclWindow_t win = nullptr;
      try {
        RF_NCCL(ncclCommWindowRegister, comm, reinterpret_cast<void*>(mem.window()), size_t(kDeviceBytes), &win,
                kNcclWinCollSymmetric);
        RF_NCCL(ncclCommWindowDeregister, comm, win);
        report(true, "[rank %d] %s: ncclCommWindowRegister/Deregister of the device segment", rank, kname);
      } catch (const CudaError& e) {
        report(false, "[rank %d] %s: NCCL window of the device segment: %s", rank, kname, e.what());
      }
      RF_NCCL(ncclCommDestroy, comm);
    }

    // Teardown: twice, the second a no-op.
    w.rv.arrive();  // no rank unmaps memory a peer's kernel may still touch
    diag_ws.destroy();
    mem.destroy();
    mem.destroy();
    report(!mem.created(), "[rank %d] %s: destroy (twice)", rank, kname);
  });
}

// ---- the timeout, in a child process ------------------------------------------------------------
int timeout_child() {
  World w;
  const WorkspaceLayout ws = WorkspaceLayout::make(kWorld, 0);
  run_ranks("timeout", w.rv, [&](int rank) {
    DeviceContext dev(rank);
    SymmetricMemory mem;
    w.exports[rank] = mem.create(rank, kWorld, dev, kDeviceBytes, 0, MemoryKind::GpuOnly, kWorld);
    w.rv.arrive();
    mem.import_peers(w.exports);
    Stream stream;
    RF_CU(cuMemsetD8Async, mem.window(), 0, size_t(ws.bytes), stream.s);
    RF_CU(cuStreamSynchronize, stream.s);
    w.rv.arrive();
    if (rank == 1) {  // rank 1 never enters the barrier
      w.rv.arrive();
      return;
    }
    Kernels kernels;
    const std::vector<uint64_t> table = mem.peer_table();
    DeviceBuffer peers(table.size() * sizeof(uint64_t));
    rftest::copy_to_device(peers.ptr, table.data(), table.size() * sizeof(uint64_t));
    HostWorkspace diag_ws;
    diag_ws.create(sizeof(Diagnostic));
    SignalArgs a;
    a.peer_table = peers.ptr;
    a.ws = ws;
    a.rank = 0;
    a.seq = 1;
    a.timeout_ns = 200ull * 1000 * 1000;
    a.diag = diag_ws.device();
    const auto start = std::chrono::steady_clock::now();
    launch_barrier(kernels, stream.s, a);
    const CUresult r = driver().cuStreamSynchronize(stream.s);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string name = error_name(r);
    report(r == CUDA_ERROR_ILLEGAL_INSTRUCTION || r == CUDA_ERROR_LAUNCH_FAILED,
           "[rank 0] timeout: the barrier kernel trapped after %.3f s with %s", waited, name.c_str());
    const Diagnostic* d = diag_ws.host_at<Diagnostic>(0);
    report(d->code == 1 && d->phase == kPhaseBarrier && d->peer == 1 && d->value == 0,
           "[rank 0] timeout: Diagnostic {code %llu, phase %llu, peer %llu, value 0x%llx} (want 1, %d, 1, 0)",
           (unsigned long long)d->code, (unsigned long long)d->phase, (unsigned long long)d->peer,
           (unsigned long long)d->value, int(kPhaseBarrier));
    w.rv.arrive();
    // The context is poisoned: leave everything to process exit rather than calling into it.
    std::fflush(stdout);
    _exit(g_failed == 0 ? 0 : 1);
  });
  return g_failed == 0 ? 0 : 1;
}

int run_timeout_child(const char* self) {
  char arg0[] = "cuda_smoke";
  char arg1[] = "--timeout-child";
  char* argv[] = {arg0, arg1, nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, self, nullptr, nullptr, argv, environ) != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--timeout-child") == 0) return timeout_child();

  std::string why;
  if (!driver_available(&why)) {
    report(false, "driver: %s", why.c_str());
    return 1;
  }
  const Driver& d = driver();
  report(d.device_count >= kWorld, "driver: %s, CUDA %d.%d, %d GPU(s) (need %d)", d.library.c_str(),
         d.version / 1000, d.version % 1000 / 10, d.device_count, kWorld);
  if (d.device_count < kWorld) return 1;
  for (int g = 0; g < kWorld; ++g) {
    DeviceContext dev(g);
    info("GPU %d: %s, sm_%d, %d SMs, host NUMA node %d", g, dev.name().c_str(), dev.compute_capability(),
         dev.sm_count(), dev.host_numa_id());
  }
  std::size_t images = 0;
  kernel_images(&images);
  report(images > 0, "kernels: %zu embedded image(s), %s", images, kernel_build_note());
  if (images == 0) return 1;
  const bool with_nccl = nccl_available(&why);
  if (with_nccl)
    report(true, "nccl: %s %s (from %s)", nccl().library.c_str(), nccl_version_string(nccl().version).c_str(),
           nccl().origin.c_str());
  else
    report(false, "nccl: %s", why.c_str());

  run_world(MemoryKind::GpuOnly, with_nccl);
  run_world(MemoryKind::Elastic, false);
  run_world(MemoryKind::Hybrid, false);

  const int child = run_timeout_child("/proc/self/exe");
  report(child == 0, "timeout: child process exited with %d", child);

  std::printf("%s: %s\n", argv[0], g_failed == 0 ? "ALL PASS" : (std::to_string(g_failed) + " FAILED").c_str());
  return g_failed == 0 ? 0 : 1;
}
