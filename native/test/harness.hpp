// What the GPU test programs (cuda_smoke, moe_smoke, moe_bench) share: PASS/FAIL lines, rank threads
// with a rendezvous that a failing rank breaks (so nobody waits forever), the runner of a step, and
// RAII device buffers, streams and events.
#pragma once

#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cuda/driver.hpp"
#include "cuda/error.hpp"

namespace rftest {

using rankflow::cuda::CudaError;

inline std::mutex g_print;
inline int g_failed = 0;

inline void report(bool ok, const char* fmt, ...) {
  char line[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(g_print);
  if (!ok) ++g_failed;
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", line);
  std::fflush(stdout);
}

inline void info(const char* fmt, ...) {
  char line[4096];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(g_print);
  std::printf("%s\n", line);
  std::fflush(stdout);
}

// A reusable rendezvous of the rank threads; a rank that fails breaks it so nobody waits forever.
class Rendezvous {
 public:
  explicit Rendezvous(int n) : n_(n) {}
  void arrive() {
    std::unique_lock<std::mutex> lock(m_);
    if (broken_) throw std::runtime_error("another rank failed");
    const int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != gen || broken_; });
    if (gen_ == gen) throw std::runtime_error("another rank failed");
  }
  void do_break() {
    std::lock_guard<std::mutex> lock(m_);
    broken_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
  bool broken_ = false;
};

// Runs body(rank) on `world` threads; a throw is reported as a FAIL of `step` and breaks the rendezvous.
inline void run_ranks(int world, const char* step, Rendezvous& rv, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const CudaError& e) {
        report(false, "[rank %d] %s: %s (code %s)", r, step, e.what(), e.code.c_str());
        rv.do_break();
      } catch (const std::exception& e) {
        report(false, "[rank %d] %s: %s", r, step, e.what());
        rv.do_break();
      }
    });
  for (std::thread& t : threads) t.join();
}

// RAII device objects of the test programs (made on the thread whose context is current).
struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { alloc(n); }
  void alloc(size_t n) {
    release();
    bytes = n;
    RF_CU(cuMemAlloc, &ptr, n > 0 ? n : 16);
  }
  void release() {
    if (ptr != 0) rankflow::cuda::driver().cuMemFree(ptr);
    ptr = 0;
  }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const { return reinterpret_cast<T*>(ptr); }
};

struct Stream {
  CUstream s = nullptr;
  Stream() { RF_CU(cuStreamCreate, &s, CU_STREAM_NON_BLOCKING); }
  ~Stream() {
    if (s != nullptr) rankflow::cuda::driver().cuStreamDestroy(s);
  }
};

struct Event {
  CUevent e = nullptr;
  Event() { RF_CU(cuEventCreate, &e, CU_EVENT_DEFAULT); }
  ~Event() {
    if (e != nullptr) rankflow::cuda::driver().cuEventDestroy(e);
  }
};

// Host -> device copy that has landed when it returns. cuMemcpyHtoD from pageable memory may return
// before its DMA is done, and the kernels run on non-blocking streams that do not wait for it.
inline void copy_to_device(CUdeviceptr dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  RF_CU(cuMemcpyHtoD, dst, src, bytes);
  RF_CU(cuCtxSynchronize);
}

}  // namespace rftest
