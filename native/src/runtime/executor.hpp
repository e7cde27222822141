// One thread per rank that runs the rank's protocol phases (the host backend's "device"), so that
// no wait blocks the JS thread of the rank's worker: its xstate timers and messages keep running.
// Not libuv's pool: ranks wait on each other, and a shared pool of 4 threads would deadlock 8 ranks.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace rankflow {

// spin_us > 0: after a job the thread polls for the next one that long (with a pause instruction)
// before sleeping on the condition variable, so that a rank program's next op skips the futex wake-up.
class Executor {
 public:
  explicit Executor(int spin_us = 0) : spin_us_(spin_us), thread_([this] { run(); }) {}
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  ~Executor() { stop(); }

  void post(std::function<void()> job) {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
      queued_.store(jobs_.size(), std::memory_order_release);
      wake = sleeping_;
    }
    if (wake) cv_.notify_one();
  }
  // Runs what is queued (jobs see the context's abort flag and end fast), then joins.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopped_) return;
      stopped_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
  void spin() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
    for (int i = 0; queued_.load(std::memory_order_acquire) == 0; ++i) {
      pause();
      if ((i & 15) == 15 && std::chrono::steady_clock::now() > until) return;
    }
  }
  void run() {
    for (;;) {
      if (spin_us_ > 0) spin();
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        sleeping_ = true;
        cv_.wait(lock, [this] { return stopped_ || !jobs_.empty(); });
        sleeping_ = false;
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
        queued_.store(jobs_.size(), std::memory_order_release);
      }
      job();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopped_ = false;
  bool sleeping_ = false;                // the thread waits on cv_ (under mutex_)
  std::atomic<size_t> queued_{0};        // jobs_.size(), read while spinning
  const int spin_us_;
  std::thread thread_;
};

}  // namespace rankflow
