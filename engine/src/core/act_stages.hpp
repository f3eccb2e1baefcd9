/** @file act_stages.hpp
 *  @brief The act step: the online trunk over the acting observations, the primary head's act
 *  stages (its forward, writing act/q) and the branch-wise argmax, a graph of its own on CUDA, run
 *  on the actor's lane over a snapshot of the parameters that the learner refreshes on the device.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/stage_provider.hpp"
#include "core/trunk_stages.hpp"

namespace dqn {

class ActStages final : public StageProvider {
 public:
  /// `rows`: the most observations one act step takes (M).
  ActStages(const TrunkStages& trunk, int rows) : trunk_(trunk), rows_(rows) {}

  void declare_buffers(StepBuild& b) override;
  void add_front_stages(StepBuild& b) override;
  void declare_after_heads(StepBuild& b) override;
  void add_back_stages(StepBuild& b) override;
  void bind(StepBuild& b) override;
  /// The act step's stages, in order (the primary head's land here between the trunk and the
  /// argmax).
  std::vector<Stage>& stages() { return stages_; }
  const std::vector<Stage>& stages() const { return stages_; }
  /// Whether a stage of `owner` (a head) is among them.
  bool has_stage_of(const std::string& owner) const;
  /// Captures the act step as its own graph; `check` runs after each stage (a broken capture).
  void capture(const std::function<void(const Stage&)>& check);
  void release() noexcept;

  /// Rows the act step takes at once (the larger of training.num_envs and training.eval.episodes).
  int rows() const { return rows_; }
  /// The greedy action of every branch for obs [rows, S] into actions [rows, D] (rows <= rows())
  /// from the current parameters: it brings the snapshot up to date first, so the actor waits, on
  /// the device, for the learner's queued steps. For evaluation and tools. Throws on bad rows.
  void act(const float* obs, int rows, std::int32_t* actions) { greedy(obs, rows, true, actions); }
  /// The same from the snapshot as it stands (after taking up a refresh whose copy has run): waits
  /// only for the act step and its copies on the actor's lane, never for the learner's queue. What
  /// the training loop acts with.
  void act_snapshot(const float* obs, int rows, std::int32_t* actions) { greedy(obs, rows, false, actions); }
  /// Queues, on the learner's lane, a copy of the parameters as the steps queued so far leave
  /// them; act_snapshot takes the newest such copy up once it has run.
  void refresh_snapshot();
  /// Refreshes taken up by the actor so far.
  std::int64_t snapshot_refreshes() const { return snap_.adopted; }
  /// The primary's Q-values [rows, D, A] for obs [rows, S] (what act() takes the argmax of), from
  /// the current parameters.
  std::vector<float> act_values(const float* obs, int rows);
  /// The snapshot the act step reads (after bind): where a head's act stages find the parameters.
  Real snapshot() const { return snapshot_; }
  /// The snapshot = the parameters (synchronising; after init and loads).
  void snapshot_now();

  /// The snapshot's host counters, as a checkpoint keeps them.
  struct SnapshotState {
    bool pending = false, acted = false;
    std::int64_t adopted = 0;
  };
  SnapshotState snapshot_state() const { return {snap_.pending, snap_.acted, snap_.adopted}; }
  void restore_snapshot_state(const SnapshotState& s);

 private:
  /// The act step on the actor's lane over obs; `fresh`: from the current parameters.
  void run(const float* obs, int rows, bool fresh);
  /// run(), then the greedy actions [rows, D] into `actions`.
  void greedy(const float* obs, int rows, bool fresh, std::int32_t* actions);
  /// Waits for the actor's lane and copies `bytes` of what run() left in the pinned output.
  void finish(void* out, std::size_t bytes);

  const TrunkStages& trunk_;
  int rows_ = 1;  ///< M
  NetworkDims net_{};
  Runtime* rt_ = nullptr;
  std::size_t param_bytes_ = 0, real_size_ = 4;
  bool captured_ = false;
  std::vector<Stage> stages_;
  Real states_, q_, params_, snapshot_, next_;  ///< the snapshot the act step reads; a refresh lands in next_ first
  std::vector<Real> a_, w_, b_;                 ///< per trunk layer: activations, the snapshot's weights and biases
  std::int32_t* actions_ = nullptr;
  struct Snapshot {
    bool pending = false, acted = false;
    std::int64_t adopted = 0;
    void* obs_host = nullptr;  ///< pinned [M, S] reals
    void* out_host = nullptr;  ///< pinned: the act step's actions or Q-values
    std::size_t out_bytes = 0;
  } snap_;
  // Event slots (Runtime::record_on): the refresh's copy on the learner's lane, its take-up and
  // the last act step on the actor's, a direct refresh for act().
  static constexpr int kEvRefreshed = 2, kEvTakenUp = 3, kEvActed = 4, kEvFresh = 5;
};

}  // namespace dqn
