/** @file rank_group.cpp
 *  @brief The ranks' devices, the host group (the CPU backend's collectives: the reference) and
 *  the threads the ranks run on.
 */
#include "core/rank_group.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <spdlog/spdlog.h>

#include "core/runtime.hpp"

namespace dqn {
namespace {

/// What a rank throws when another rank failed while it waited (dropped by run_ranks).
struct RankAborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A barrier that an abort releases: wait() returns once every rank has arrived, or throws once
/// any rank has aborted the group.
class AbortableBarrier {
 public:
  explicit AbortableBarrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock lock(m_);
    if (aborted_) throw RankAborted(why_);
    const std::int64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    if (generation_ == gen) throw RankAborted(why_);
  }
  void abort(const std::string& why) noexcept {
    std::lock_guard lock(m_);
    if (!aborted_) why_ = why;
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, arrived_ = 0;
  std::int64_t generation_ = 0;
  bool aborted_ = false;
  std::string why_;
};

class HostGroup final : public RankGroup {
 public:
  explicit HostGroup(std::vector<int> devices)
      : RankGroup(std::move(devices)), barrier_(ranks()), posted_(std::size_t(ranks())), bytes_(std::size_t(ranks())) {}

  // Every rank posts its ranges; rank r then averages the r-th share of each range's elements over
  // every rank's copy (summing in rank order) and writes the mean into every copy. The shares are
  // disjoint, so no element is read after another rank wrote it.
  void all_reduce_mean(int rank, const std::vector<Range>& ranges, std::size_t element_bytes, void*) override {
    if (element_bytes != 4 && element_bytes != 8)
      throw std::logic_error("all_reduce_mean: elements of " + std::to_string(element_bytes) + " bytes (4 or 8)");
    posted_[std::size_t(rank)] = ranges;
    bytes_[std::size_t(rank)] = element_bytes;
    barrier_.wait();
    const auto& mine = posted_[std::size_t(rank)];
    for (int r = 0; r < ranks(); ++r) {
      const auto& theirs = posted_[std::size_t(r)];
      bool same = theirs.size() == mine.size() && bytes_[std::size_t(r)] == element_bytes;
      for (std::size_t k = 0; same && k < mine.size(); ++k) same = theirs[k].count == mine[k].count;
      if (!same) {
        const std::string why = "all_reduce_mean: rank " + std::to_string(rank) + " and rank " + std::to_string(r) +
                                " reduce different ranges (the ranks' steps differ)";
        abort(rank, why);
        throw std::logic_error(why);
      }
    }
    const double inv = 1.0 / ranks();
    for (std::size_t k = 0; k < mine.size(); ++k) {
      const std::int64_t n = mine[k].count, share = (n + ranks() - 1) / ranks();
      const std::int64_t lo = std::min(n, share * rank), hi = std::min(n, lo + share);
      if (element_bytes == 4) mean_into<float>(k, lo, hi, inv);
      else mean_into<double>(k, lo, hi, inv);
    }
    barrier_.wait();
  }

  void broadcast(int rank, void* data, std::size_t bytes, void*) override {
    posted_[std::size_t(rank)] = {Range{data, std::int64_t(bytes)}};
    barrier_.wait();
    const Range& root = posted_[0][0];
    if (std::size_t(root.count) != bytes) {
      const std::string why = "broadcast: rank " + std::to_string(rank) + " expects " + std::to_string(bytes) +
                              " bytes, rank 0 sends " + std::to_string(root.count);
      abort(rank, why);
      throw std::logic_error(why);
    }
    if (rank != 0 && bytes > 0) std::memcpy(data, root.data, bytes);
    barrier_.wait();
  }

  void abort_collectives(int rank, const std::string& why) noexcept override {
    barrier_.abort("rank " + std::to_string(rank) + " failed: " + why);
  }
  std::string describe() const override { return "host"; }

 private:
  template <class T>
  void mean_into(std::size_t k, std::int64_t lo, std::int64_t hi, double inv) {
    for (std::int64_t i = lo; i < hi; ++i) {
      T sum = 0;
      for (const auto& p : posted_) sum += static_cast<const T*>(p[k].data)[i];
      const T mean = static_cast<T>(sum * static_cast<T>(inv));
      for (const auto& p : posted_) static_cast<T*>(p[k].data)[i] = mean;
    }
  }

  AbortableBarrier barrier_;
  std::vector<std::vector<Range>> posted_;
  std::vector<std::size_t> bytes_;
};

}  // namespace

struct RankGroup::Host {
  explicit Host(int n) : barrier(n), posted(std::size_t(n)) {}
  AbortableBarrier barrier;
  std::vector<std::vector<double>> posted;
  std::vector<void*> gathered;
  bool first_result = false;
};

RankGroup::RankGroup(std::vector<int> devices)
    : devices_(std::move(devices)), host_(std::make_shared<Host>(std::max(1, int(devices_.size())))) {
  host_->gathered.resize(host_->posted.size());
}

void RankGroup::abort(int rank, const std::string& why) noexcept {
  host_->barrier.abort("rank " + std::to_string(rank) + " failed: " + why);
  abort_collectives(rank, why);
}

std::vector<double> RankGroup::host_sum(int rank, const std::vector<double>& values) {
  if (ranks() == 1) return values;
  host_->posted[std::size_t(rank)] = values;
  host_->barrier.wait();
  std::vector<double> sum(values.size(), 0.0);
  for (int r = 0; r < ranks(); ++r) {
    const auto& v = host_->posted[std::size_t(r)];
    if (v.size() != values.size()) {
      const std::string why = "host_sum: rank " + std::to_string(rank) + " passes " + std::to_string(values.size()) +
                              " values, rank " + std::to_string(r) + " " + std::to_string(v.size());
      abort(rank, why);
      throw std::logic_error(why);
    }
    for (std::size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
  }
  host_->barrier.wait();  // every rank has read the others' values before any posts again
  return sum;
}

bool RankGroup::host_gather(int rank, void* mine, const std::function<bool(const std::vector<void*>&)>& on_first) {
  if (ranks() == 1) return on_first({mine});
  host_->gathered[std::size_t(rank)] = mine;
  host_->barrier.wait();
  if (rank == 0) host_->first_result = on_first(host_->gathered);
  host_->barrier.wait();  // rank 0 is done with every rank's object
  const bool result = host_->first_result;
  host_->barrier.wait();  // every rank has read the result before any gathers again
  return result;
}

std::vector<int> rank_devices(const PipelineSpec& spec, BackendKind backend) {
  if (backend != BackendKind::cuda) {
    if (spec.devices.empty()) return {0};
    return spec.devices;
  }
  const int present = cuda_device_count();
  if (spec.devices.empty()) {
    if (present < 1) throw std::invalid_argument("devices: all: no GPU found");
    std::vector<int> all(static_cast<std::size_t>(present));
    for (int i = 0; i < present; ++i) all[std::size_t(i)] = i;
    return all;
  }
  for (std::size_t i = 0; i < spec.devices.size(); ++i)
    if (spec.devices[i] >= present)
      throw std::invalid_argument("devices[" + std::to_string(i) + "]: " + std::to_string(spec.devices[i]) +
                                  ": no such GPU (this machine has " + std::to_string(present) + ")");
  return spec.devices;
}

std::shared_ptr<RankGroup> make_host_group(std::vector<int> devices) {
  if (devices.empty()) throw std::invalid_argument("a rank group needs at least one rank");
  return std::make_shared<HostGroup>(std::move(devices));
}

std::shared_ptr<RankGroup> make_rank_group(BackendKind backend, std::vector<int> devices) {
  return backend == BackendKind::cuda ? make_nccl_group(std::move(devices)) : make_host_group(std::move(devices));
}

void run_ranks(RankGroup& group, const std::function<void(int rank)>& fn) {
  const int n = group.ranks();
  if (n == 1) {  // no thread for one rank: errors and signals stay on the caller's thread
    fn(0);
    return;
  }
  std::mutex m;
  std::exception_ptr first;
  int first_rank = -1;
  std::vector<std::thread> threads;
  threads.reserve(std::size_t(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const RankAborted&) {
        // another rank failed first; its error is the one reported
      } catch (const std::exception& e) {
        {
          std::lock_guard lock(m);
          if (!first) first = std::current_exception(), first_rank = r;
        }
        group.abort(r, e.what());
      } catch (...) {
        {
          std::lock_guard lock(m);
          if (!first) first = std::current_exception(), first_rank = r;
        }
        group.abort(r, "an exception that is not a std::exception");
      }
    });
  for (auto& t : threads) t.join();
  if (first) {
    spdlog::error("rank {} (device {}) failed; the other ranks were stopped", first_rank,
                  group.devices()[std::size_t(first_rank)]);
    std::rethrow_exception(first);
  }
}

}  // namespace dqn
