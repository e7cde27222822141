// Host-side signal slots: release stores, acquire loads and the bounded wait every protocol step uses.
// The host executor plays the GPU's part; its waits stand for device-side spins and time out with
// TIMEOUT_GPU, while the CPU-sync waits (counters read by the CPU) time out with TIMEOUT_CPU.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <sched.h>
#include <string>
#include <thread>

#include "../errors.hpp"
#include "../layout.hpp"

namespace rankflow {

inline void store_release(void* slot, uint64_t v) {
  __atomic_store_n(static_cast<uint64_t*>(slot), v, __ATOMIC_RELEASE);
}
inline uint64_t load_acquire(const void* slot) {
  return __atomic_load_n(static_cast<const uint64_t*>(slot), __ATOMIC_ACQUIRE);
}
// Sequence numbers wrap at 2^32: compare by signed distance.
inline bool seq_reached(uint64_t v, uint32_t seq) { return int32_t(signal_seq(v) - seq) >= 0; }

const char* phase_name(uint64_t phase);

// What a wait is for, so that its timeout can say it.
struct WaitSite {
  Phase phase;
  int peer;
  const char* counter;  // slot name, e.g. "barrier", "rank_count"
  int index = -1;       // second index (local expert) where the counter has one
};

enum class WaitKind { Device, Cpu };

// Aborts a wait from outside: a failed peer, or the context being torn down.
struct AbortFlag {
  std::atomic<int> failed_rank{-1};
  std::atomic<bool> stopping{false};
  // The rank's worker is gone without a destroy() (terminated, crashed): its GPU side tears down
  // alone, aborting its NCCL communicator instead of the collective deregister/destroy.
  std::atomic<bool> abandoned{false};
};

// Spins with backoff (many ranks may share few cores) until pred(load_acquire(slot)) holds.
template <typename Pred>
uint64_t wait_slot(const void* slot, Pred pred, const WaitSite& site, WaitKind kind, double timeout_s,
                   int my_rank, const AbortFlag& abort) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  uint64_t v = 0;
  for (uint64_t spin = 0;; ++spin) {
    v = load_acquire(slot);
    if (pred(v)) return v;
    if (spin < 256) continue;  // the peer is usually a few hundred nanoseconds away
    if (abort.stopping.load(std::memory_order_relaxed))
      throw Error("RANK_FAILED", "rank " + std::to_string(my_rank) + " is shutting down", my_rank, phase_name(site.phase));
    const int failed = abort.failed_rank.load(std::memory_order_relaxed);
    if (failed >= 0)
      throw Error("RANK_FAILED",
                  "rank " + std::to_string(failed) + " failed while rank " + std::to_string(my_rank) + " waited in " +
                      phase_name(site.phase) + " on " + site.counter + "[from rank " + std::to_string(site.peer) + "]",
                  failed, phase_name(site.phase));
    const double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (waited > timeout_s) {
      std::string counter = std::string(site.counter) + "[from rank " + std::to_string(site.peer) + "]";
      if (site.index >= 0) counter += "[" + std::to_string(site.index) + "]";
      char last[32];
      snprintf(last, sizeof last, "0x%016llx", static_cast<unsigned long long>(v));
      const std::string seconds = seconds_text(timeout_s);
      const bool cpu = kind == WaitKind::Cpu;
      throw Error(cpu ? "TIMEOUT_CPU" : "TIMEOUT_GPU",
                  std::string(cpu ? "CPU-sync wait" : "device-phase wait") + " of rank " + std::to_string(my_rank) +
                      " in " + phase_name(site.phase) + " timed out after " + seconds +
                      " s on counter " + counter + " (last value " + last + ")",
                  site.peer, phase_name(site.phase));
    }
    // More ranks than cores is the normal case on the host backend: give the core away.
    if (spin < 2048) sched_yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(waited > 0.01 ? 200 : 10));
  }
}

}  // namespace rankflow
