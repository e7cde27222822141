// What ends a rank's waits from outside: a peer's failure, the rank's teardown. The words live in a
// SharedArrayBuffer that the main thread writes with Atomics.store (binding/context.cc keeps it
// alive), so that a wait ends at once even while the rank's own JS thread is blocked in it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace rankflow {

class Abort {
 public:
  // Word indices in the shared Int32Array (actors/core/addon.ts ABORT_WORDS mirrors them).
  static constexpr int kFailedRank = 0;  // failed rank + 1; 0 = none
  static constexpr int kStopping = 1;    // non-zero: the rank is being torn down
  static constexpr int kReasonBytes = 2; // bytes of the failure's reason (UTF-8) after the words
  static constexpr int kWords = 4;
  static constexpr int kMaxReason = 1024;

  Abort() : words_(own_) {}
  // Use `words` (kWords int32, e.g. a SharedArrayBuffer's bytes) instead of private storage.
  void attach(int32_t* words) { words_ = words; }
  int32_t* words() const { return words_; }
  bool attached() const { return words_ != own_; }

  int failed_rank() const { return load(kFailedRank) - 1; }
  // Why the peer failed, as the main thread wrote it before raising kFailedRank (may be empty).
  std::string reason() const {
    if (!attached() || failed_rank() < 0) return {};
    const int32_t n = load(kReasonBytes);
    if (n <= 0 || n > kMaxReason) return {};
    return std::string(reinterpret_cast<const char*>(words_ + kWords), size_t(n));
  }
  bool stopping() const { return load(kStopping) != 0 || local_stop_.load(std::memory_order_relaxed); }
  bool raised() const { return failed_rank() >= 0 || stopping(); }
  void fail_peer(int rank) { store(kFailedRank, rank + 1); }
  void stop() { local_stop_.store(true, std::memory_order_relaxed); }

  // The rank's worker is gone without a destroy() (terminated, crashed): its GPU side tears down
  // alone, aborting its NCCL communicator instead of the collective deregister/destroy.
  std::atomic<bool> abandoned{false};

 private:
  int32_t load(int i) const { return __atomic_load_n(words_ + i, __ATOMIC_ACQUIRE); }
  void store(int i, int32_t v) { __atomic_store_n(words_ + i, v, __ATOMIC_RELEASE); }
  int32_t own_[kWords] = {0, 0, 0, 0};
  int32_t* words_;
  std::atomic<bool> local_stop_{false};
};

}  // namespace rankflow
