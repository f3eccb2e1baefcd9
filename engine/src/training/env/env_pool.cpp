/** @file env_pool.cpp
 *  @brief EnvPool: persistent workers woken once per step by a generation counter, spinning
 *  briefly before they sleep.
 */
#include "training/env/env_pool.hpp"

#include <algorithm>
#include <chrono>

namespace dqn {
namespace {

/// How long a thread spins for the next step (workers) or the last range (the caller) before it
/// sleeps: longer than a cheap environment's step, short enough not to hold a core idle for long.
constexpr auto kSpin = std::chrono::microseconds(50);

template <class Ready>
bool spin_until(Ready ready) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) return false;
  }
}

}  // namespace

EnvPool::EnvPool(int threads, int items) {
  const int t = std::max(1, std::min(threads, std::max(1, items)));
  for (int r = 0; r < t; ++r)
    ranges_.emplace_back(int(std::int64_t(items) * r / t), int(std::int64_t(items) * (r + 1) / t));
  for (int r = 1; r < t; ++r) workers_.emplace_back([this, r] { worker(r); });
}

EnvPool::~EnvPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    quit_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_.notify_all();
  for (auto& w : workers_) w.join();
}

void EnvPool::run(const std::function<void(int, int, int)>& work) {
  if (workers_.empty()) {
    work(0, ranges_[0].first, ranges_[0].second);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    work_ = &work;
    pending_.store(int(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_.notify_all();
  work(0, ranges_[0].first, ranges_[0].second);
  if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
}

void EnvPool::worker(int range) {
  std::uint64_t seen = 0;
  for (;;) {
    if (!spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; })) {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    }
    const std::function<void(int, int, int)>* work = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (quit_) return;
      seen = generation_.load(std::memory_order_relaxed);
      work = work_;
    }
    (*work)(range, ranges_[std::size_t(range)].first, ranges_[std::size_t(range)].second);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);  // the caller may be about to sleep
      done_.notify_one();
    }
  }
}

}  // namespace dqn
