/** @file rank_stages.hpp
 *  @brief Data parallel (EngineOptions::group): the gradient all-reduce inside the step, as
 *  buckets that follow the backward, and the broadcast of the state that must start identical.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/rank_group.hpp"
#include "core/stage_provider.hpp"
#include "core/update_stages.hpp"

namespace dqn {

class RankStages final : public StageProvider {
 public:
  /// `group` null: one rank, no stages. `seed`: the pipeline's. `update`: whose spectral-norm
  /// vectors are broadcast too.
  RankStages(std::shared_ptr<RankGroup> group, int rank, std::uint64_t seed, const UpdateStages& update)
      : group_(std::move(group)), rank_(rank), seed_(seed), update_(update) {}

  /// After the trunk's backward: the buckets, each averaging the gradient rows one part of the
  /// backward has finished, in a chain (one collective at a time).
  void add_back_stages(StepBuild& b) override;
  void bind(StepBuild& b) override;

  /// Data-parallel ranks the engine steps with (1: alone), and its own.
  int ranks() const { return group_ ? group_->ranks() : 1; }
  int rank() const { return rank_; }
  /// The seed of this rank's own random streams (its replay's draws): the pipeline's on rank 0,
  /// another per rank, so that the ranks draw other batches.
  std::uint64_t seed() const { return rank_ == 0 ? seed_ : seed_ ^ (0x9E3779B97F4A7C15ull * std::uint64_t(rank_)); }
  /// The all-reduce's buckets (stage name, elements per rank), in the order they run.
  const std::vector<std::pair<std::string, std::int64_t>>& buckets() const { return sizes_; }
  /// The step's all-reduce alone, its buckets enqueued in order outside the graph (every rank at
  /// once): what `dqn bench` times as the reduction's share of a step. The gradients are averaged
  /// again, so the parameters stay as they are only if no step follows on them.
  void all_reduce();
  /// Rank 0's parameters, target, optimizer and spectral-norm state into every rank (init and
  /// loads; synchronises).
  void broadcast();

 private:
  /// Bucket k's collective on the backend's stream.
  void reduce(std::size_t k, Backend& be);

  std::shared_ptr<RankGroup> group_;
  int rank_ = 0;
  std::uint64_t seed_ = 0;
  const UpdateStages& update_;
  Runtime* rt_ = nullptr;
  std::uint32_t real_size_ = 4;
  struct Bucket {
    std::vector<std::pair<std::int64_t, std::int64_t>> at;  ///< [begin, end) in grad/all
    bool losses = false;                                    ///< the heads' losses too
    std::vector<RankGroup::Range> ranges;                   ///< resolved at bind
  };
  std::vector<Bucket> buckets_;
  std::vector<std::pair<std::string, std::int64_t>> sizes_;  ///< buckets()
  std::vector<std::pair<void*, std::size_t>> state_;         ///< what broadcast() sends, resolved at bind
};

}  // namespace dqn
