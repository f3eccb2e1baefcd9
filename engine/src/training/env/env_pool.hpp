/** @file env_pool.hpp
 *  @brief Threads that step an environment's copies: N copies cut into one contiguous range per
 *  thread, each range run by its own thread (the caller's thread runs the first), all joined
 *  before run() returns. Results never depend on the split: copies are independent (dqn/env.hpp).
 *  A step is often a few microseconds, so the threads wait for the next one spinning for a short
 *  while before they sleep, and the caller spins for the last range the same way.
 */
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dqn {

class EnvPool {
 public:
  /// `threads` ranges over `items` copies (at least one; never more than the copies).
  EnvPool(int threads, int items);
  ~EnvPool();
  EnvPool(const EnvPool&) = delete;
  EnvPool& operator=(const EnvPool&) = delete;

  int threads() const { return int(ranges_.size()); }
  /// Calls work(range, begin, end) for every range at once and waits for all of them. `work` must
  /// not throw (it records what went wrong for its range).
  void run(const std::function<void(int range, int begin, int end)>& work);

 private:
  void worker(int range);

  std::vector<std::pair<int, int>> ranges_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(int, int, int)>* work_ = nullptr;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool quit_ = false;  // under mutex_
};

}  // namespace dqn
