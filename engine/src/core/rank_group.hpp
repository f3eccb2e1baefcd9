/** @file rank_group.hpp
 *  @brief Data-parallel ranks (the pipeline's `devices`): what a rank's engine reduces and
 *  broadcasts through, and the threads the ranks run on. CUDA: NCCL, its calls enqueued on the
 *  stage's stream and captured into the step's graph. CPU: the host, in rank order, blocking until
 *  every rank has called (the reference the GPU ranks are compared against).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/spec.hpp"

namespace dqn {

class RankGroup {
 public:
  virtual ~RankGroup() = default;
  int ranks() const noexcept { return int(devices_.size()); }
  /// The device of each rank (CUDA ordinals; the CPU's are labels).
  const std::vector<int>& devices() const noexcept { return devices_; }

  /// One range of a buffer to average over the ranks, in place (elements of 4 or 8 bytes: float or
  /// double reals).
  struct Range {
    void* data = nullptr;
    std::int64_t count = 0;
  };
  /// Replaces every rank's copy of each range by the mean over the ranks, all ranges as one group
  /// (one NCCL launch). `stream`: the cudaStream_t to enqueue on (CUDA), ignored on the host, where
  /// the call returns once every rank's ranges are averaged. Every rank makes the same calls in
  /// the same order, with the same counts.
  virtual void all_reduce_mean(int rank, const std::vector<Range>& ranges, std::size_t element_bytes,
                               void* stream) = 0;
  /// Rank 0's `bytes` at `data` into every other rank's, then waits for it (between steps).
  virtual void broadcast(int rank, void* data, std::size_t bytes, void* stream) = 0;
  /// A rank failed: every rank waiting in a collective or in host_sum, or entering one later,
  /// throws instead of waiting for it (CUDA: the communicators are aborted).
  void abort(int rank, const std::string& why) noexcept;
  /// The ranks' threads agreeing on the host, whatever the backend (the training loop's stops and
  /// counters): every rank passes its values (the same count on each) and gets their element-wise
  /// sums over the ranks, added in rank order. Blocks until every rank has called.
  std::vector<double> host_sum(int rank, const std::vector<double>& values);
  /// Hands every rank's host object to rank 0: rank 0 runs on_first with each rank's `mine`, in
  /// rank order, while the others wait (a checkpoint of every rank's state, written once), and
  /// every rank gets what it returned. on_first must not throw; it runs on rank 0 only.
  bool host_gather(int rank, void* mine, const std::function<bool(const std::vector<void*>&)>& on_first);
  /// The collectives' library, for --explain and benchmarks ("host", "NCCL 2.27.5").
  virtual std::string describe() const = 0;

 protected:
  explicit RankGroup(std::vector<int> devices);
  /// What a group's own collectives do on abort (after host_sum's waiters are released).
  virtual void abort_collectives(int rank, const std::string& why) noexcept = 0;

 private:
  std::vector<int> devices_;
  struct Host;
  std::shared_ptr<Host> host_;  ///< host_sum's rendezvous
};

/// The pipeline's ranks on a backend: CUDA, its `devices` (empty: every GPU found; each checked
/// against the GPUs present); CPU, one rank per listed device (all: one). Throws
/// std::invalid_argument naming `devices` and the entry when a device does not exist.
std::vector<int> rank_devices(const PipelineSpec& spec, BackendKind backend);

/// A group of `devices.size()` ranks reducing on the host.
std::shared_ptr<RankGroup> make_host_group(std::vector<int> devices);
/// A group of NCCL communicators, one per device, in this process (ncclCommInitAll). Throws when
/// the engine was built without NCCL, saying how to build it in.
std::shared_ptr<RankGroup> make_nccl_group(std::vector<int> devices);
/// The group for a backend's ranks (make_host_group or make_nccl_group).
std::shared_ptr<RankGroup> make_rank_group(BackendKind backend, std::vector<int> devices);

/// Runs fn(rank) on one thread per rank of `group` and waits for all. The first rank to throw
/// aborts the group (so the others leave their collectives) and its error is rethrown, naming the
/// rank and its device; errors of the others that only report the abort are dropped.
void run_ranks(RankGroup& group, const std::function<void(int rank)>& fn);
/// The same, or fn(0) where there is no group (one rank).
inline void run_ranks(RankGroup* group, const std::function<void(int rank)>& fn) {
  if (group)
    run_ranks(*group, fn);
  else
    fn(0);
}

}  // namespace dqn
