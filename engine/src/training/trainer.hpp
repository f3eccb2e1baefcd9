/** @file trainer.hpp
 *  @brief The training loop behind `dqn train`: N environment copies acting ε-greedily through the
 *  engine's act step on a snapshot of the online network, n-step transitions into the engine's
 *  replay (where the step draws its batches), periodic greedy evaluation on a separate
 *  environment, and a run directory that keeps what was written.
 */
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dqn/backend.hpp"
#include "pipeline/spec.hpp"
#include "core/engine_access.hpp"
#include "training/env/vec_env.hpp"
#include "core/registry.hpp"
#include "training/replay.hpp"
#include "training/run_log.hpp"

namespace dqn {

/// Finished training episodes averaged into metrics' episode_return.
inline constexpr int kReturnWindow = 20;
/// Environment steps (over all copies) between metrics lines.
inline constexpr std::int64_t kLogEvery = 1000;

/// ε at an environment step: linear from start to end over decay_steps.
double epsilon_at(const EpsilonSpec& e, std::int64_t env_step);
/// Prioritized replay's β at an environment step: beta_start → beta_end over total_steps.
double beta_at(const TrainingSpec& t, std::int64_t env_step);
/// The replay a training run's engine needs (EngineOptions::replay): training.replay, β over
/// training.total_steps, staging for one environment step of every copy.
EngineReplay training_replay(const PipelineSpec& spec);
/// Checks that the pipeline's network fits an environment it acts in: std::invalid_argument
/// naming the feature count, branches or actions that differ, and the key to set.
void check_env_fits(const PipelineSpec& spec, const VecEnv& env);
/// Engine options for a training run: the training replay; offline, one that holds every
/// transition of the dataset.
inline EngineOptions training_engine_options(const PipelineSpec& spec, const TransitionBatch* offline = nullptr) {
  EngineOptions o;
  o.replay = training_replay(spec);
  if (offline) {
    o.replay->spec.capacity = std::max<std::int64_t>(offline->size(), spec.batch);
    o.replay->staging_rows = int(std::min<std::int64_t>(o.replay->spec.capacity, 4096));
  }
  return o;
}

class Trainer;

struct TrainerOptions {
  /// Where to write. "" → training.out_dir, and when that is "" too, <runs_root>/<name>-<time>.
  std::string run_dir;
  std::string runs_root = "runs";
  /// The resolved pipeline written first as pipeline.yaml; "" → to_yaml(spec) (no catalog).
  std::string pipeline_yaml;
  std::int64_t log_every = kLogEvery;
  using Progress = RunLog::Progress;
  /// automatic: one line updated in place when `progress_out` is a terminal, else plain lines.
  Progress progress = Progress::automatic;
  std::FILE* progress_out = stderr;
  /// Called after each metrics line is written (tests stop a run from here).
  std::function<void(Trainer&)> after_metrics_line;
  /// Offline (training.dataset): the dataset's n-step transitions (assemble_transitions), loaded
  /// into the replay at the start; no environment steps, and total_steps, eval.every and the
  /// metrics' step count training steps. Must outlive run().
  const TransitionBatch* offline = nullptr;
  /// Set: continue the run in run_dir from this checkpoint (checkpoint::newest over that
  /// directory, with pipeline_yaml its pipeline.yaml) instead of starting one. Must outlive run().
  const st::File* resume = nullptr;
  /// Several devices: this trainer is rank `rank` of the engine's group (EngineOptions::group),
  /// one trainer per rank, each on its own thread. Every rank runs the whole schedule on its own
  /// environment copies (seeded per rank) and replay; the ranks agree on stopping once per loop
  /// iteration, every rank evaluates (the same parameters, the same evaluation seeds: the same
  /// result); rank 0 alone writes the run directory, its metrics lines counting every rank's
  /// environment steps and episodes, and its checkpoints holding every rank's state (the same
  /// `resume` file is passed to every rank; each takes its part). Offline training runs on one
  /// device.
  RankGroup* ranks = nullptr;
  int rank = 0;
  /// Where training.env's plugin is found (null: the default search path).
  const PluginLoader* plugins = nullptr;
};

struct TrainResult {
  std::string run_dir;
  std::int64_t env_steps = 0, train_steps = 0, episodes = 0, skipped_steps = 0;
  /// Several devices: the environment steps of every rank (env_steps is each rank's clock), and
  /// episodes counts every rank's.
  std::int64_t env_steps_all_ranks = 0;
  int ranks = 1;
  std::optional<double> final_eval;  ///< the evaluation at the last step, if one ran there
  std::optional<double> final_success;  ///< its success rate, where the task reports successes
  std::optional<double> last_eval, best_eval;
  std::int64_t last_eval_step = -1, best_eval_step = -1;
  bool solved = false;       ///< an evaluation reached training.stop_at_return or stop_at_success
  bool interrupted = false;  ///< request_stop() ended it
  double wall_s = 0;
  std::string checkpoint;  ///< the last checkpoint written ("" if none)
  /// Files that could not be written while the run went on (a weights file, a checkpoint): each
  /// error's text, also printed when it happened.
  std::vector<std::string> write_errors;
};

/// Where a run whose metrics.jsonl holds `metrics_text` ended, when its last line is the final one
/// of a run that finished (not one a stop request ended); none otherwise.
std::optional<std::int64_t> finished_at(const std::string& metrics_text);

/// One training run. The engine must already hold its starting weights (init or loaded).
class Trainer {
 public:
  /// Throws std::invalid_argument when the pipeline's network does not fit its environment, and
  /// when the engine was built without training_replay(spec).
  Trainer(Engine& engine, TrainerOptions opt = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Runs to training.total_steps, an evaluation reaching stop_at_return, or request_stop().
  /// Writes pipeline.yaml first, metrics.jsonl line by line (flushed), weights.safetensors at
  /// each evaluation and at the end, best.safetensors on each new best evaluation, a checkpoint
  /// every training.checkpoint_every steps and when stopped. Resuming (TrainerOptions::resume), it
  /// restores everything the checkpoint holds, moves the metrics lines written after it aside
  /// (metrics.after-step-<clock>.jsonl) and goes on exactly as the run would have.
  TrainResult run();

  /// The run's clock: environment steps, or training steps offline.
  std::int64_t clock() const { return offline_ ? train_steps_ : env_steps_; }

  /// Async-signal-safe (one lock-free atomic store): the loop finishes its current iteration,
  /// writes the final weights, closes the metrics and returns with interrupted = true.
  void request_stop() noexcept { stop_.store(true, std::memory_order_relaxed); }
  /// Whether the run stops: asked for here, or over several devices, asked for on any rank by the
  /// last iteration's agreement.
  bool stop_requested() const noexcept { return multi_ ? agreed_stop_ : stop_.load(std::memory_order_relaxed); }

  /// Greedy evaluation over training.eval.episodes episodes on the evaluation environment,
  /// reset with a seed derived from the pipeline's seed and `round`.
  EvalResult evaluate(std::int64_t round);

  /// Transitions in the engine's replay (host count: no wait).
  std::int64_t replay_size() const;
  const std::string& run_dir() const { return run_dir_; }
  /// ε the loop uses at its current environment step.
  double epsilon() const { return epsilon_at(spec_.training.epsilon, env_steps_); }
  std::int64_t env_steps() const { return env_steps_; }
  std::int64_t train_steps() const { return train_steps_; }

  /// runs_root/<name>-<YYYYmmdd-HHMMSS> (local time), with -2, -3, … if that exists already.
  static std::string default_run_dir(const std::string& runs_root, const std::string& name);

 private:
  void act(bool random_only);
  void train_once();
  void open_new_run();
  void open_resumed_run(const st::File& ck);
  void restore(const st::File& ck);
  /// This rank's part of a checkpoint: rank 0's state is under the file's own names (nullopt: the
  /// file as it is), rank r's under "rank.<r>/" (kRanksKey: how many), given back under those
  /// names. Throws std::invalid_argument when the checkpoint holds another number of ranks than
  /// this run has, or lacks this rank's part.
  std::optional<st::File> rank_part(const st::File& ck) const;
  static constexpr const char* kRanksKey = "ranks";
  /// Writes a checkpoint at the current clock; a failure is noted in res and printed, not thrown.
  void save_checkpoint(TrainResult& res);
  /// Saves a weights file; a failure is noted in res and printed, not thrown.
  void save_weights_noted(const std::string& file, TrainResult& res);
  /// A metrics line at the current clock (on every rank: the counts are summed over the ranks),
  /// then TrainerOptions::after_metrics_line.
  void write_metrics(const std::optional<EvalResult>& eval, bool final_line);
  /// What the progress line shows at the current clock.
  ProgressValues progress_values() const;
  void save_weights(const std::string& file);

  Engine& engine_;
  const PipelineSpec& spec_;
  TrainerOptions opt_;
  std::atomic<bool> stop_{false};
  bool multi_ = false;        ///< one of several ranks (TrainerOptions::ranks)
  bool writer_ = true;        ///< writes the run directory (rank 0)
  bool agreed_stop_ = false;  ///< multi_: the ranks' agreement, once per iteration
  std::string stop_rule_;     ///< the progress line's words for the evaluation's stopping rules
  /// training.checkpoint_minutes: when the last checkpoint was written (or the run started), and
  /// whether that many minutes have passed (multi_: agreed by the ranks with the stop).
  std::chrono::steady_clock::time_point checkpoint_time_{};
  bool checkpoint_due_ = false;
  bool offline_ = false;
  static_assert(std::atomic<bool>::is_always_lock_free, "request_stop must be async-signal-safe");

  std::unique_ptr<VecEnv> env_, eval_env_;
  NStepAssembler nstep_;
  TransitionBatch fresh_;  ///< this environment step's completed transitions
  int N_, S_, D_;
  std::vector<int> branch_actions_;

  std::mt19937_64 act_rng_;
  std::vector<float> obs_, next_obs_, final_obs_, rewards_, ep_return_;
  std::vector<std::uint8_t> terminated_, truncated_;
  std::vector<std::int32_t> actions_;
  std::vector<double> recent_returns_;  // ring of the last kReturnWindow episode returns
  std::size_t recent_next_ = 0;

  std::string run_dir_;
  RunLog log_;  ///< metrics.jsonl, the progress line and messages
  std::int64_t env_steps_ = 0, train_steps_ = 0, episodes_ = 0;
  std::int64_t refreshed_at_ = 0;  ///< train_steps_ at the last refresh of the acting snapshot
  std::optional<StepReport> last_report_;  ///< the newest report seen (metrics lines)
  std::optional<double> last_eval_, best_eval_;
  std::optional<double> last_success_;  ///< the last evaluation's success rate (not checkpointed: a message only)
  std::int64_t best_eval_step_ = -1;
  /// Where the loop stands (saved in checkpoints).
  struct Loop {
    std::int64_t next_train_at = 0, next_eval_at = 0, next_log_at = 0, next_checkpoint_at = 0;
    std::int64_t eval_round = 0, last_eval_step = -1;
    /// false: the iteration's evaluation was cut short by a stop, and a resume redoes it first.
    bool iteration_done = true;
  } loop_;
  std::string pipeline_text_;          ///< pipeline.yaml as written (its hash seals checkpoints)
  std::int64_t checkpoint_clock_ = -1;  ///< the clock of the last checkpoint written
};

}  // namespace dqn
