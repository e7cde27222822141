// What ends a rank's waits from outside: a peer's failure, the rank's teardown, or a run's release (a
// rank program threw, or returned while its peers still wait). The words (protocol.hpp AbortWords)
// live in a SharedArrayBuffer that the main thread writes with Atomics (binding/context.cc keeps it
// alive), so that a wait ends at once even while the rank's own JS thread is blocked in it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "protocol.hpp"

namespace rankflow {

class Abort {
 public:
  using W = AbortWords;

  Abort() : words_(own_) {}
  // Use `words` (W::kBytes, e.g. a SharedArrayBuffer's bytes, 8-byte aligned) instead of private storage.
  void attach(int32_t* words) { words_ = words; }
  int32_t* words() const { return words_; }
  bool attached() const { return words_ != own_; }

  int failed_rank() const { return load(W::kFailedRank) - 1; }
  // Why the peer failed, as the main thread wrote it before raising kFailedRank (may be empty).
  std::string reason() const { return failed_rank() >= 0 ? text(W::kFailureReasonBytes, W::kFailureReasonAt) : std::string(); }
  bool stopping() const { return load(W::kStopping) != 0 || local_stop_.load(std::memory_order_relaxed); }
  // A failure or the teardown: the rank's waits end, and so does the rank.
  bool raised() const { return failed_rank() >= 0 || stopping(); }
  // Elastic groups: the peer that left (-1: none). The rank's ops end with RANK_FAILED naming it until
  // the group re-forms without it (actors/elastic.ts clears the word then); the rank lives on.
  int left_rank() const { return load(W::kLeftRank) - 1; }
  std::string left_reason() const { return left_rank() >= 0 ? text(W::kFailureReasonBytes, W::kFailureReasonAt) : std::string(); }
  void fail_peer(int rank) { store(W::kFailedRank, rank + 1); }
  void stop() { local_stop_.store(true, std::memory_order_relaxed); }
  // The rank's worker ended without a teardown: its own stop word, where its kernels read it too.
  void stop_shared() {
    if (attached()) store(W::kStopping, 1);
    stop();
  }

  // The first sequence number the run's release ends (0: no release).
  uint64_t released_above() const {
    return __atomic_load_n(reinterpret_cast<const uint64_t*>(words_ + W::kReleasedAbove), __ATOMIC_ACQUIRE);
  }
  // Whether op `seq` is released: its waits give up, and it does not start.
  bool released(uint64_t seq) const { return released_op(released_above(), seq); }
  // The rank whose program's end released the run (-1: none), and why (read after released()).
  int release_origin() const { return load(W::kReleaseOrigin) - 1; }
  std::string release_reason() const { return text(W::kReleaseReasonBytes, W::kReleaseReasonAt); }

  // The rank's worker is gone without a destroy() (terminated, crashed): its GPU side tears down
  // alone, aborting its NCCL communicator instead of the collective deregister/destroy.
  std::atomic<bool> abandoned{false};

 private:
  int32_t load(int i) const { return __atomic_load_n(words_ + i, __ATOMIC_ACQUIRE); }
  void store(int i, int32_t v) { __atomic_store_n(words_ + i, v, __ATOMIC_RELEASE); }
  // The UTF-8 text whose length is word `len_word`, at byte `at` (only where the words are shared).
  std::string text(int len_word, int at) const {
    if (!attached()) return {};
    const int32_t n = load(len_word);
    if (n <= 0 || n > W::kMaxReason) return {};
    return std::string(reinterpret_cast<const char*>(words_) + at, size_t(n));
  }
  alignas(8) int32_t own_[W::kWords] = {0, 0, 0, 0, 0, 0, 0, 0};
  int32_t* words_;
  std::atomic<bool> local_stop_{false};
};

}  // namespace rankflow
