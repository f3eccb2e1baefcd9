/** @file replay_stages.hpp
 *  @brief The replay the step draws its batch from (EngineOptions::replay): its buffers in the
 *  arena, the step's last stages (new priorities from td_error when prioritised, then the next
 *  step's batch drawn, gathered and weighted) and the asynchronous path transitions come in by.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/engine_ops.hpp"
#include "core/stage_provider.hpp"
#include "core/step_reports.hpp"

namespace dqn {

/// The replay's options: resident where the backend computes, filled by ReplayStages::add.
struct EngineReplay {
  ReplaySpec spec;              ///< capacity, prioritized, alpha, beta_start/end, priority_eps
  std::int64_t beta_steps = 1;  ///< env steps over which β goes from beta_start to beta_end
  int staging_rows = 0;         ///< the most transitions one add call takes (0: 4096)
};

/// n transitions on the host, row-major (what ReplayStages::add copies in).
struct Transitions {
  std::int64_t n = 0;
  const float* states = nullptr;       ///< [n, S]
  const float* next_states = nullptr;  ///< [n, S]
  const std::int32_t* actions = nullptr;  ///< [n, D]
  const float* rewards = nullptr;      ///< [n] n-step discounted returns
  const float* dones = nullptr;        ///< [n] 1: no bootstrap
};

/// The replay's counters, read between steps (ReplayStages::state).
struct ReplayState {
  std::int64_t next = 0, size = 0, env_step = 0, draws = 0, inserted = 0;
  double max_priority = 1, total_priority = 0;
};

class ReplayStages final : public StageProvider {
 public:
  /// `seed`: the stream its draws count from (RankStages::seed: other batches on other ranks).
  ReplayStages(const EngineReplay& opt, std::uint64_t seed) : opt_(opt), seed_(seed) {}

  /// Checks the options (std::invalid_argument naming the key) and declares the store, the
  /// drawn slots, the statistics and one staging block.
  void declare_buffers(StepBuild& b) override;
  void add_back_stages(StepBuild& b) override;
  void bind(StepBuild& b) override;
  void release() noexcept;

  /// Appends transitions without waiting for the step: they go through pinned staging and an
  /// asynchronous copy, ordered on the learner's lane, each at the largest priority so far;
  /// env_step sets β's schedule. Waits only when the staging ring is full (for the copy issued
  /// that many calls ago). Throws std::invalid_argument for n outside 1..staging_rows().
  void add(const Transitions& t, std::int64_t env_step);
  /// Transitions added so far (host count; the replay holds min(this, capacity)).
  std::int64_t added() const { return added_; }
  int staging_rows() const { return int(rows_); }
  /// Synchronises and reads the replay's counters (tests, tools, the end of a run).
  ReplayState state();
  /// Synchronises and reads the slots of the batch drawn last: the one the next step trains on.
  std::vector<std::int64_t> drawn_slots();
  /// Draws the first step's batch (uncaptured, once, before the first step): every step then
  /// draws the next one last. Throws std::logic_error when nothing was added.
  void prime();

  /// The host counters a checkpoint keeps with the replay's buffers.
  struct Counters {
    std::int64_t seq = 0, added = 0;
    bool primed = false;
  };
  Counters counters() const { return {seq_, added_, primed_}; }
  void restore(const Counters& c);

 private:
  /// The draw of the next step's batch (the replay.sample stage).
  void sample(EngineOps& ops) const;

  EngineReplay opt_;
  std::uint64_t seed_ = 0;
  Runtime* rt_ = nullptr;
  int batch_ = 0;
  std::int64_t S_ = 0, D_ = 0;  ///< observation features, action branches
  std::uint32_t real_size_ = 4;
  std::int64_t rows_ = 0;        ///< staging rows K
  ReplaySample draw_;            ///< the sample stage's arguments (the store with them), resolved at bind
  ReplayInsert staged_;          ///< the device staging block (n, env_step set per call)
  ReplayPriorities priorities_;  ///< the priority stage's, likewise
  std::size_t stage_bytes_ = 0;  ///< one staging block
  void* stage_dev_ = nullptr;
  std::vector<void*> pinned_;    ///< the staging ring
  std::int64_t seq_ = 0, added_ = 0;
  bool primed_ = false;          ///< the batch buffers hold a drawn batch
  static constexpr int kStagingSlot0 = 8;  ///< the staging ring's event slots from here on
  static constexpr int kStagingSlotsMax = 256;
};

}  // namespace dqn
