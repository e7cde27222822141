// The one wait of rankflow's native side, with one set of rules: poll `ready()`; spin with a pause
// instruction for spin_ns (the peer is usually a few hundred nanoseconds away), then yield, then
// sleep with backoff (many ranks may share few cores); between polls check the Abort words (a peer
// failed -> RANK_FAILED naming it; teardown -> RANK_FAILED; the run released the op -> ABORTED naming
// the rank whose program ended it) and the deadline (-> the error the caller describes: TIMEOUT_GPU
// for the cuda backend's device waits, TIMEOUT_CPU for every CPU wait).
// Every CPU-side wait uses it: the host executor's slot waits, the CPU-sync waits on counters, and the
// CUDA backend's waits for mapped flags and for its stream.
#pragma once

#include <chrono>
#include <cstdint>
#include <sched.h>
#include <string>
#include <thread>

#include "abort.hpp"
#include "errors.hpp"
#include "protocol.hpp"

namespace rankflow {

const char* phase_name(uint64_t phase);

// What a wait is for, so that its errors can say it.
struct WaitSite {
  Phase phase;
  int peer;             // the rank waited on (-1: none in particular)
  const char* counter;  // slot name, e.g. "barrier", "rank_count"
  int index = -1;       // second index (local expert) where the counter has one
  uint64_t op = 0;      // the op that waits: 0 = the context's current op (WaitRules::op_seq); an op in flight's own
};

enum class WaitKind { Device, Cpu };

struct WaitRules {
  int rank = 0;               // the waiting rank
  const Abort* abort = nullptr;
  // The sequence number of the op that waits (a run's release ends the ops from a number on): the
  // context's current op (Context::seq) unless a wait of an op in flight points at its own.
  const uint64_t* op_seq = nullptr;
  double cpu_timeout_s = 300, gpu_timeout_s = 100;
  // The host backend's "device" is the CPU: its device-phase waits are CPU waits (TIMEOUT_CPU, cpuSeconds).
  bool device_is_cpu = false;
  int64_t spin_ns = 2000;     // pure spinning before the first yield
  // Called once by a wait that has lasted slow_ns: the binding posts the rank's pending reports then,
  // so that the main thread sees the op's state while the rank's thread is blocked in it.
  void (*slow)(void*) = nullptr;
  void* slow_arg = nullptr;
  int64_t slow_ns = 1000000;
};

inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// RANK_FAILED for a wait ended by the Abort words.
Error abort_error(const WaitRules& r, const WaitSite& site);
// RANK_FAILED for an op ended because a peer left an elastic group (Abort::left_rank), naming it;
// `where`: the phase it waited in, or the start of the op.
Error left_error(const Abort& a, int rank, const char* where);
// ABORTED for op `seq`, released by the run (Abort::released): naming the rank whose program ended it.
Error release_error(const Abort& a, int rank, uint64_t seq, const char* where);
inline uint64_t waiting_op(const WaitRules& r, const WaitSite& site) { return site.op != 0 ? site.op : r.op_seq != nullptr ? *r.op_seq : 0; }
inline bool wait_released(const WaitRules& r, const WaitSite& site) { return r.abort != nullptr && r.abort->released(waiting_op(r, site)); }
inline Error wait_release_error(const WaitRules& r, const WaitSite& site) {
  return release_error(*r.abort, r.rank, waiting_op(r, site), phase_name(site.phase));
}
// TIMEOUT_GPU / TIMEOUT_CPU for a wait on `site` that saw `last` last.
Error timeout_error(const WaitRules& r, const WaitSite& site, WaitKind kind, uint64_t last);

// Polls ready() until it returns true. `last()` is the value shown by a timeout's message.
template <typename Ready, typename Last>
void wait_until(const WaitRules& r, const WaitSite& site, WaitKind kind, Ready ready, Last last) {
  if (ready()) return;
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto spin_until = start + std::chrono::nanoseconds(r.spin_ns);
  auto slow_at = start + std::chrono::nanoseconds(r.slow_ns);
  const double timeout = kind == WaitKind::Cpu || r.device_is_cpu ? r.cpu_timeout_s : r.gpu_timeout_s;
  for (;;) {
    // A burst of polls with a pause between them, then the slower checks.
    for (int i = 0; i < 64; ++i) {
      cpu_pause();
      if (ready()) return;
    }
    if (r.abort != nullptr && r.abort->raised()) throw abort_error(r, site);
    if (r.abort != nullptr && r.abort->left_rank() >= 0) throw left_error(*r.abort, r.rank, phase_name(site.phase));
    // A release is raised only after what the releasing rank sent (acquire): look once more, so that
    // an op that its peers did complete is never released.
    if (wait_released(r, site)) {
      if (ready()) return;
      throw wait_release_error(r, site);
    }
    const auto now = clock::now();
    if (now < spin_until) continue;
    if (r.slow != nullptr && now >= slow_at) {
      slow_at = clock::time_point::max();
      r.slow(r.slow_arg);
    }
    const double waited = std::chrono::duration<double>(now - start).count();
    if (waited > timeout) throw timeout_error(r, site, kind, last());
    // More ranks than cores is the normal case on the host backend: give the core away.
    if (waited < 0.001) sched_yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(waited > 0.05 ? 200 : 20));
  }
}

// Polls ready() for about `ns` nanoseconds (a pause between polls); whether it became true.
template <typename Ready>
bool spin_for(int64_t ns, Ready ready) {
  if (ready()) return true;
  using clock = std::chrono::steady_clock;
  const auto until = clock::now() + std::chrono::nanoseconds(ns);
  do {
    for (int i = 0; i < 64; ++i) {
      cpu_pause();
      if (ready()) return true;
    }
  } while (clock::now() < until);
  return false;
}

}  // namespace rankflow
