/** @file engine.hpp
 *  @brief The engine core: builds one training step from a pipeline, its head plugins and its own
 *  stage providers (trunk, update, replay, act, all-reduce), freezes the arena, binds, schedules
 *  and captures; then runs it on the CPU reference or replays it as one CUDA graph.
 *  What tools and tests do with an engine between steps (weights, host access, explain) is in
 *  core/engine_access.hpp.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/act_stages.hpp"
#include "core/plugin_loader.hpp"
#include "core/rank_group.hpp"
#include "core/rank_stages.hpp"
#include "core/registry.hpp"
#include "core/replay_stages.hpp"
#include "core/runtime.hpp"
#include "core/safetensors.hpp"
#include "core/scheduler.hpp"
#include "core/step_reports.hpp"
#include "core/trunk_stages.hpp"
#include "core/update_stages.hpp"
#include "pipeline/spec.hpp"

namespace dqn {

struct EngineOptions {
  bool f64 = false;  ///< CPU reference in double precision (gradient checks)
  std::optional<BackendKind> backend;  ///< overrides the pipeline's backend
  int device = 0;
  /// Set: the step samples its batch from a replay of its own (a batch set by hand is then
  /// overwritten).
  std::optional<EngineReplay> replay;
  /// Data parallel: this engine is rank `rank` of `group` (on the group's device for that rank).
  /// Each step then averages every head's gradient over the ranks, inside the step, before the
  /// budgets; parameters are broadcast from rank 0 whenever they are initialised or loaded. Every
  /// rank must make the same calls (the collectives wait for each other). Null: one rank.
  std::shared_ptr<RankGroup> group;
  int rank = 0;
  /// Options for rank `rank` of `group`, the rest as default.
  static EngineOptions of_rank(std::shared_ptr<RankGroup> group, int rank) {
    EngineOptions o;
    o.group = std::move(group);
    o.rank = rank;
    return o;
  }
};

/// The backend an engine built from `spec` runs on: the override, else the pipeline's (auto: cuda
/// when a GPU is found).
BackendKind resolve_backend(const PipelineSpec& spec, std::optional<BackendKind> override_backend);

/// The step's shared buffers, resolved once at build.
struct StepBuffers {
  Real params, target, adam_m, adam_v;  ///< [P] each
  Real grad_all;                        ///< [H, P]: every head's gradient row
  Real states2, rewards, dones, is_weights;  ///< the batch: [2B, S] (states, next states), [B] each
  std::int32_t* actions = nullptr;      ///< [B, D]
  std::int64_t* step = nullptr;         ///< Adam's step counter t
};

/// The training step as built: its stages, the order they run in, and how the capture laid
/// them over the runtime's lanes.
struct StepPlan {
  std::vector<Stage> stages;       ///< in declaration order
  std::vector<std::size_t> order;  ///< the schedule: indices into stages
  LanePlan lanes;                  ///< where the captured step's stages run (empty: not captured)
  bool captured = false;
};

class Engine {
 public:
  Engine(const PipelineSpec& spec, const PluginLoader& plugins, const EngineOptions& opt = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const PipelineSpec& spec() const { return spec_; }
  BackendKind backend() const { return backend_; }
  /// The network's sizes as the heads see them (NetworkDims).
  const NetworkDims& dims() const { return net_; }
  const Registry& registry() const { return reg_; }
  Runtime& runtime() { return *rt_; }
  /// The enabled heads' instance names, in order, and the primary's.
  const std::vector<std::string>& head_names() const { return head_names_; }
  const std::string& primary_name() const { return head_names_[primary_]; }
  const StepBuffers& buffers() const { return bufs_; }
  const StepPlan& plan() const { return plan_; }

  /// One training step: CPU runs the stages; CUDA replays the captured graph. No sync.
  void step();
  /// The same stages run one by one, uncaptured (for the replay-equals-uncaptured test).
  void step_uncaptured();
  /// Only the stages before the update (forward, losses, gradients): for gradient checks.
  void forward_backward();
  std::int64_t steps() const { return steps_; }
  std::int64_t captures() const { return captures_; }

  /// The update: the budgets' fractions and the learning rate, changeable between steps.
  UpdateStages& update() { return *update_; }
  const UpdateStages& update() const { return *update_; }
  /// The act step, over a snapshot of the parameters.
  ActStages& actor() { return *act_; }
  /// The replay (EngineOptions::replay); throws std::logic_error when the engine has none.
  ReplayStages& replay();
  bool has_replay() const { return replay_ != nullptr; }
  /// Data parallel: the ranks, the all-reduce's buckets, the state's broadcast.
  RankStages& parallel() { return *ranks_; }

  /// Synchronises and reads the current report (between steps, never inside the loop).
  StepReport read_report();
  /// The newest of the report's asynchronous copies (step() enqueues one every report_every
  /// steps) that has landed, if any.
  std::optional<StepReport> latest_report();

  /// A checkpoint's engine part (synchronising): every buffer that lives across steps (parameters,
  /// target, optimizer and spectral-norm state, the replay with its tree and cursors, the acting
  /// snapshot, the step counter the random draws count from, the report) as exact bytes, and the
  /// host counters that go with them. Restoring it continues bit for bit where it was taken.
  void checkpoint_to(st::File& f);
  /// Throws std::invalid_argument naming the checkpoint and the tensor when it does not fit this
  /// engine (another pipeline); nothing is written then.
  void restore_checkpoint(const st::File& f);

 private:
  void build(const PluginLoader& plugins);
  /// Captures the stages in order over the runtime's lanes, each checked for a broken capture.
  void capture_stages();

  PipelineSpec spec_;
  EngineOptions opt_;
  BackendKind backend_ = BackendKind::cpu;
  NetworkDims net_{};
  // Heads are declared before the runtime so they (and their libraries) outlive its graph.
  std::vector<HeadHandle> heads_;
  std::vector<std::string> head_names_;
  std::size_t primary_ = 0;  ///< the primary head's index in heads_
  std::unique_ptr<Runtime> rt_;
  Registry reg_;
  std::unique_ptr<TrunkStages> trunk_;
  std::unique_ptr<UpdateStages> update_;
  std::unique_ptr<RankStages> ranks_;
  std::unique_ptr<ReplayStages> replay_;  ///< null: no replay
  std::unique_ptr<ActStages> act_;
  StepReports reports_;
  /// trunk, ranks, update, reports, replay (if any), act: every build hook runs over them in
  /// this order (the all-reduce's stages before the update's, the report block before the
  /// replay's statistics).
  std::vector<StageProvider*> parts_;
  StepPlan plan_;
  StepBuffers bufs_;
  std::int64_t steps_ = 0, captures_ = 0;
};

}  // namespace dqn
