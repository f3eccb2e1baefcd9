/** @file engine.hpp
 *  @brief The engine: builds one training step from a pipeline and its head plugins (registry,
 *  stages, schedule), runs it on the CPU reference or replays it as one CUDA graph.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/spec.hpp"
#include "core/plugin_loader.hpp"
#include "core/rank_group.hpp"
#include "core/registry.hpp"
#include "core/runtime.hpp"
#include "core/safetensors.hpp"
#include "core/scheduler.hpp"
#include "core/step_reports.hpp"
#include "core/act_stages.hpp"
#include "core/trunk_stages.hpp"
#include "core/update_stages.hpp"

namespace dqn {

/// The replay the step draws its batch from (EngineOptions::replay): resident where the backend
/// computes, filled by add_transitions; the step's last stages re-weight it from td_error
/// (prioritised) and then draw the next step's batch (the first step's is drawn before it).
struct EngineReplay {
  ReplaySpec spec;              ///< capacity, prioritized, alpha, beta_start/end, priority_eps
  std::int64_t beta_steps = 1;  ///< env steps over which β goes from beta_start to beta_end
  int staging_rows = 0;         ///< the most transitions one add_transitions call takes (0: 4096)
};

/// n transitions on the host, row-major (what add_transitions copies in).
struct Transitions {
  std::int64_t n = 0;
  const float* states = nullptr;       ///< [n, S]
  const float* next_states = nullptr;  ///< [n, S]
  const std::int32_t* actions = nullptr;  ///< [n, D]
  const float* rewards = nullptr;      ///< [n] n-step discounted returns
  const float* dones = nullptr;        ///< [n] 1: no bootstrap
};


/// The replay's counters, read between steps (Engine::replay_state).
struct ReplayState {
  std::int64_t next = 0, size = 0, env_step = 0, draws = 0, inserted = 0;
  double max_priority = 1, total_priority = 0;
};

/// One batch on the host (docs/step-math.md, "A batch is").
struct HostBatch {
  int B = 0, S = 0, D = 0;
  std::vector<float> states, next_states, rewards, dones, is_weights;
  std::vector<std::int32_t> actions;

  /// A reproducible random batch for a pipeline's shapes (states in [-1,1], ~10% dones,
  /// importance weights in [0.5, 1.5], rewards in [-1, 1]).
  static HostBatch random(const PipelineSpec& spec, std::uint64_t seed);
  static HostBatch from_file(const st::File& f, const std::string& what);
  /// Rows [first, first + n) (a rank's share of a global batch); throws std::out_of_range outside.
  HostBatch rows(int first, int n) const;
  void to_file(st::File& f) const;
  /// Throws std::invalid_argument naming the tensor when shapes or values don't fit the spec.
  void check(const PipelineSpec& spec, const std::string& what) const;
};


struct EngineOptions {
  bool f64 = false;  ///< CPU reference in double precision (gradient checks)
  std::optional<BackendKind> backend;  ///< overrides the pipeline's backend
  int device = 0;
  /// Set: the step samples its batch from a replay of its own (set_batch is then overwritten).
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

class Engine {
 public:
  Engine(const PipelineSpec& spec, const PluginLoader& plugins, const EngineOptions& opt = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const PipelineSpec& spec() const { return spec_; }
  BackendKind backend() const { return backend_; }
  const Registry& registry() const { return reg_; }
  Runtime& runtime() { return *rt_; }
  const std::vector<std::string>& head_names() const { return head_names_; }

  /// Seeded initial weights (docs/step-math.md, "Initialisation"): target = online, zero moments, step 0.
  void init_weights(std::uint64_t seed);
  /// Loads a weights file; throws st::Error / std::invalid_argument naming the tensor.
  void load_weights(const st::File& f);
  /// The weights file (online, target, Adam, sn.u); with `dump`, the last step's report too.
  st::File save_state(bool dump);

  void set_batch(const HostBatch& b);

  /// A checkpoint's engine part (synchronising): every buffer that lives across steps (parameters,
  /// target, optimizer and spectral-norm state, the replay with its tree and cursors, the acting
  /// snapshot, the step counter the random draws count from, the report) as exact bytes, and the
  /// host counters that go with them. Restoring it continues bit for bit where it was taken.
  void checkpoint_to(st::File& f);
  /// Throws std::invalid_argument naming the checkpoint and the tensor when it does not fit this
  /// engine (another pipeline); nothing is written then.
  void restore_checkpoint(const st::File& f);

  // --- the replay (EngineOptions::replay) ---
  bool has_replay() const { return replay_.on; }
  /// Appends transitions to the replay without waiting for the step: they go through pinned
  /// staging and an asynchronous copy, ordered on the stream, each at the largest priority so
  /// far; env_step sets β's schedule. Waits only when the staging ring is full (for the copy
  /// issued that many calls ago). Throws std::invalid_argument for n outside 1..staging rows.
  void add_transitions(const Transitions& t, std::int64_t env_step);
  /// Transitions added so far (host count; the replay holds min(this, capacity)).
  std::int64_t transitions_added() const { return replay_.added; }
  int staging_rows() const { return int(replay_.rows); }
  /// Synchronises and reads the replay's counters (tests, tools, the end of a run).
  ReplayState replay_state();
  /// Synchronises and reads the slots of the batch drawn last: the one the next step trains on.
  std::vector<std::int64_t> drawn_slots();
  /// The online parameters as one flat f32 vector laid out as registry().params() says
  /// (synchronises: for tests and tools).
  std::vector<float> online_params();
  /// Device pointers of the batch inputs, for a replay side that fills them directly.
  Real batch_states2() const { return states2_; }

  /// One training step: CPU runs the stages; CUDA replays the captured graph. No sync.
  void step();
  /// The same stages run one by one, uncaptured (for the replay-equals-uncaptured test).
  void step_uncaptured();

  /// Only the stages before the update (forward, losses, gradients): for gradient checks.
  void forward_backward();

  /// Between steps (synchronising): a buffer's contents as doubles, and one element written.
  /// For tests and tools; uses the layout, never a counted lookup.
  std::vector<double> host_buffer(const std::string& name);
  void host_write(const std::string& name, std::int64_t index, double value);

  /// Synchronises and reads the current report (between steps, never inside the loop).
  StepReport read_report();
  /// The newest of the report's asynchronous copies (step() enqueues one every report_every
  /// steps) that has landed, if any.
  std::optional<StepReport> latest_report();

  /// The update: the budgets' fractions and the learning rate, changeable between steps.
  UpdateStages& update() { return *update_; }
  const UpdateStages& update() const { return *update_; }

  std::int64_t steps() const { return steps_; }
  std::int64_t captures() const { return captures_; }
  std::int64_t graph_nodes() const { return rt_->graph_nodes(); }
  /// Lanes (concurrent streams) the captured step uses; 1 on the CPU.
  int lanes_used() const { return std::max(1, lanes_.used); }
  /// Per stage (in order) the earlier stages it waits for when stages run side by side (their
  /// byte ranges overlap, one of the two writing): what the captured graph's edges follow.
  std::vector<std::pair<std::string, std::vector<std::string>>> stage_waits() const;
  /// Stages the capture had to queue behind a stage they do not depend on (too few lanes).
  int false_dependencies() const { return lanes_.false_deps; }

  /// The stage order and the registry layout (`dqn step --explain`).
  std::string explain() const;

  /// The act step: the online trunk, the primary's act stages, the branch-wise argmax, over a
  /// snapshot of the parameters.
  ActStages& actor() { return *act_; }
  /// The primary head's instance name.
  const std::string& primary_name() const { return head_names_[primary_]; }
  /// Data-parallel ranks this engine steps with (1: alone), and its own.
  int ranks() const { return opt_.group ? opt_.group->ranks() : 1; }
  int rank() const { return opt_.rank; }
  /// The seed of this rank's own random streams (its replay's draws): the pipeline's on rank 0,
  /// another per rank, so that the ranks draw other batches.
  std::uint64_t rank_seed() const {
    return opt_.rank == 0 ? spec_.seed : spec_.seed ^ (0x9E3779B97F4A7C15ull * std::uint64_t(opt_.rank));
  }
  /// The gradient all-reduce's buckets (stage name, elements per rank), in the order they run.
  const std::vector<std::pair<std::string, std::int64_t>>& reduce_buckets() const { return buckets_; }
  /// The step's all-reduce alone, its buckets enqueued in order outside the graph (every rank at
  /// once): what `dqn bench` times as the reduction's share of a step. The gradients are averaged
  /// again, so the parameters stay as they are only if no step follows on them.
  void all_reduce_gradients();

 private:
  struct BuildCtx;
  struct HeadResolver;
  void build(const PluginLoader& plugins);
  StepBuild step_build();
  /// The step's shared buffers: the batch, a*, the report block.
  void declare_shared_buffers(StepBuild& b);
  void bind_shared();
  // --- data parallel (engine_ranks.cpp) ---
  /// The gradient all-reduce's stages (EngineOptions::group): its buckets, each averaging the
  /// gradient rows one part of the backward has finished, in a chain (one collective at a time).
  void add_rank_stages();
  /// Rank 0's parameters, target, optimizer and spectral-norm state into every rank (init and loads).
  void broadcast_state();
  void capture_stages();
  /// While capturing, after stage s ran: throws when s broke the capture (a plugin stage that
  /// synchronised, allocated or copied to the host), naming its plugin and the stage.
  void check_capture(const Stage& s);
  void declare_replay_buffers();
  void add_replay_stage_back();
  /// Draws the first step's batch (uncaptured, once): every step then draws the next one last.
  void prime_replay_batch();
  void bind_replay();
  void free_replay_staging() noexcept;
  ReplayStore replay_store() const;

  struct ReplayPart {
    bool on = false, prioritized = false;
    EngineReplay opt;
    std::int64_t rows = 0;         ///< staging rows K
    ReplayStore store;
    ReplayInsert staged;           ///< the device staging block (n, env_step set per call)
    std::int64_t* indices = nullptr;
    Real stats;
    std::size_t stage_bytes = 0;   ///< one staging block
    void* stage_dev = nullptr;
    std::vector<void*> pinned;     ///< the staging ring
    std::int64_t seq = 0, added = 0;
    std::size_t sample_stage = 0;  ///< the stage that draws the next step's batch
    bool primed = false;           ///< the batch buffers hold a drawn batch
  } replay_;
  static constexpr int kStagingSlot0 = 8;   ///< the staging ring's event slots from here on
  static constexpr int kStagingSlotsMax = 256;

  PipelineSpec spec_;
  EngineOptions opt_;
  BackendKind backend_ = BackendKind::cpu;
  NetworkDims net_{};
  // Heads are declared before the runtime so they (and their libraries) outlive its graph.
  std::vector<HeadHandle> heads_;
  std::vector<std::string> head_names_;
  std::unique_ptr<Runtime> rt_;
  Registry reg_;
  std::unique_ptr<TrunkStages> trunk_;
  std::unique_ptr<UpdateStages> update_;
  std::unique_ptr<ActStages> act_;
  std::vector<Stage> stages_;
  std::vector<std::size_t> order_;
  std::size_t primary_ = 0;          ///< the primary head's index in heads_

  // The shared buffers, resolved once at build.
  Real params_, target_, adam_m_, adam_v_, grad_all_, losses_, td_error_;
  Real states2_, rewards_, dones_, weights_;
  std::int32_t* actions_ = nullptr;
  std::int64_t* t_ = nullptr;

  StepReports reports_;

  std::int64_t steps_ = 0, captures_ = 0;
  bool captured_ = false;
  LanePlan lanes_;  ///< where the captured step's stages run (empty: not captured)
  std::vector<std::pair<std::string, std::int64_t>> buckets_;  ///< reduce_buckets()
};

/// The replay's statistics in the report block (ReplayStats).
inline constexpr const char* kReplayStatsBuffer = "report/replay";

/// Transitions a fill_replay_random call adds at once (the staging rows a filled engine wants).
inline constexpr std::int64_t kReplayFillChunk = 65536;
/// Fills the engine's replay with n random transitions for its pipeline's shapes (states and
/// rewards in [-1, 1], 10 % dones, uniform actions; seeded from the pipeline's seed), through
/// add_transitions as the environments would: for benchmarks and tools.
void fill_replay_random(Engine& e, std::int64_t n);

}  // namespace dqn
