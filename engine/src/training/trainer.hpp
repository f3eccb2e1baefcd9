/** @file trainer.hpp
 *  @brief The training loop behind `dqn train`: N environment copies acting ε-greedily from a host
 *  copy of the online network, n-step replay (uniform or prioritized), the engine's step, periodic
 *  greedy evaluation on a separate environment, and a run directory that keeps what was written.
 */
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dqn/backend.hpp"
#include "dqn/bdq.hpp"
#include "dqn/pipeline.hpp"
#include "core/engine.hpp"
#include "training/env/env.hpp"
#include "core/registry.hpp"
#include "training/replay.hpp"

namespace dqn {

/// Training steps between refreshes of the host actor's copy of the online parameters. On the
/// CPU backend the copy is a memcpy, so the actor always acts with the newest network; on CUDA
/// each refresh synchronises the stream, so it happens every few steps.
inline constexpr int kActorRefreshCpu = 1;
inline constexpr int kActorRefreshCuda = 8;
/// Finished training episodes averaged into metrics' episode_return.
inline constexpr int kReturnWindow = 20;
/// Environment steps (over all copies) between metrics lines.
inline constexpr std::int64_t kLogEvery = 1000;

/// ε at an environment step: linear from start to end over decay_steps.
double epsilon_at(const EpsilonSpec& e, std::int64_t env_step);
/// Prioritized replay's β at an environment step: beta_start → beta_end over total_steps.
double beta_at(const TrainingSpec& t, std::int64_t env_step);

/// The greedy policy on the host: the trunk and the primary C51 head's forward (bdq::forward, the
/// same code the engine runs) through the CPU op table, on a host copy of the online parameters
/// laid out as the engine's registry says.
class HostActor {
 public:
  /// Throws std::invalid_argument when the registry lacks a trunk or c51 parameter the forward
  /// needs, or when their layout is not the contiguous one bdq relies on.
  HostActor(const PipelineSpec& spec, const Registry& reg, int max_rows);

  /// The flat online parameters (Engine::online_params()).
  void set_params(std::vector<float> params);
  const std::vector<float>& params() const { return params_; }

  /// Expected Q [rows, D, A] for obs [rows, S]; valid until the next call. rows <= max_rows.
  const float* expected_q(const float* obs, int rows);
  /// Branch-wise argmax of the expected Q (ties: the lowest index) into actions [rows, D].
  void greedy(const float* obs, int rows, std::int32_t* actions);

  int max_rows() const { return max_rows_; }

 private:
  Real at(std::int64_t offset) { return Real{params_.data() + offset, 4}; }
  Real buf(std::vector<float>& v) { return Real{v.data(), 4}; }

  std::unique_ptr<Backend> be_;
  int max_rows_;
  int S_;
  std::vector<int> widths_;
  std::vector<std::int64_t> trunk_w_, trunk_b_;  // offsets
  std::int64_t w1_ = 0, b1_ = 0, wv2_ = 0, bv2_ = 0, wb2_ = 0, bb2_ = 0;
  bdq::Dims dims_;
  std::vector<float> params_;
  std::vector<float> in_;
  std::vector<std::vector<float>> trunk_acts_;
  std::vector<float> hidden_, v_, adv_, logits_, logp_, q_;
};

struct EvalResult {
  double mean = 0, min = 0, max = 0;
  int episodes = 0;
  bool complete = false;  ///< false when a stop request cut it short
};

class Trainer;

struct TrainerOptions {
  /// Where to write. "" → training.out_dir, and when that is "" too, <runs_root>/<name>-<time>.
  std::string run_dir;
  std::string runs_root = "runs";
  /// The resolved pipeline written first as pipeline.yaml; "" → to_yaml(spec) (no catalog).
  std::string pipeline_yaml;
  /// Training steps between actor refreshes; 0 → kActorRefreshCpu / kActorRefreshCuda.
  int actor_refresh = 0;
  std::int64_t log_every = kLogEvery;
  enum class Progress { automatic, tty, plain, none };
  /// automatic: one line updated in place when `progress_out` is a terminal, else plain lines.
  Progress progress = Progress::automatic;
  std::FILE* progress_out = stderr;
  /// Called after each metrics line is written (tests stop a run from here).
  std::function<void(Trainer&)> after_metrics_line;
};

struct TrainResult {
  std::string run_dir;
  std::int64_t env_steps = 0, train_steps = 0, episodes = 0, skipped_steps = 0;
  std::optional<double> final_eval;  ///< the evaluation at the last step, if one ran there
  std::optional<double> last_eval, best_eval;
  std::int64_t last_eval_step = -1, best_eval_step = -1;
  bool solved = false;       ///< an evaluation reached training.stop_at_return
  bool interrupted = false;  ///< request_stop() ended it
  double wall_s = 0;
};

/// One training run. The engine must already hold its starting weights (init or loaded).
class Trainer {
 public:
  /// Throws std::invalid_argument when the pipeline's network does not fit its environment.
  Trainer(Engine& engine, TrainerOptions opt = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Runs to training.total_steps, an evaluation reaching stop_at_return, or request_stop().
  /// Writes pipeline.yaml first, metrics.jsonl line by line (flushed), weights.safetensors at
  /// each evaluation and at the end, best.safetensors on each new best evaluation.
  TrainResult run();

  /// Async-signal-safe (one lock-free atomic store): the loop finishes its current iteration,
  /// writes the final weights, closes the metrics and returns with interrupted = true.
  void request_stop() noexcept { stop_.store(true, std::memory_order_relaxed); }
  bool stop_requested() const noexcept { return stop_.load(std::memory_order_relaxed); }

  /// Greedy evaluation over training.eval.episodes episodes on the evaluation environment,
  /// reset with a seed derived from the pipeline's seed and `round`.
  EvalResult evaluate(std::int64_t round);

  HostActor& actor() { return actor_; }
  const ReplayBuffer& replay() const { return replay_; }
  const std::string& run_dir() const { return run_dir_; }
  /// ε the loop uses at its current environment step.
  double epsilon() const { return epsilon_at(spec_.training.epsilon, env_steps_); }
  std::int64_t env_steps() const { return env_steps_; }

  /// runs_root/<name>-<YYYYmmdd-HHMMSS> (local time), with -2, -3, … if that exists already.
  static std::string default_run_dir(const std::string& runs_root, const std::string& name);

 private:
  void refresh_actor();
  void act(bool random_only);
  void train_once();
  void write_metrics(const std::optional<EvalResult>& eval, bool final_line);
  void save_weights(const std::string& file);
  void progress(bool force_plain, bool final_line);

  Engine& engine_;
  const PipelineSpec& spec_;
  TrainerOptions opt_;
  std::atomic<bool> stop_{false};
  static_assert(std::atomic<bool>::is_always_lock_free, "request_stop must be async-signal-safe");

  std::unique_ptr<VecEnv> env_, eval_env_;
  ReplayBuffer replay_;
  HostActor actor_;
  int N_, S_, D_;
  std::vector<int> branch_actions_;

  std::mt19937_64 act_rng_, replay_rng_;
  std::vector<float> obs_, next_obs_, final_obs_, rewards_, ep_return_;
  std::vector<std::uint8_t> terminated_, truncated_;
  std::vector<std::int32_t> actions_;
  std::vector<double> recent_returns_;  // ring of the last kReturnWindow episode returns
  std::size_t recent_next_ = 0;
  Batch batch_;
  HostBatch host_batch_;

  std::string run_dir_;
  std::ofstream metrics_;
  std::int64_t env_steps_ = 0, train_steps_ = 0, episodes_ = 0;
  std::int64_t since_refresh_ = 0;
  int actor_refresh_ = 1;
  std::optional<double> last_eval_, best_eval_;
  std::int64_t best_eval_step_ = -1;

  using Clock = std::chrono::steady_clock;
  Clock::time_point start_, last_log_time_, last_draw_{}, rate_mark_time_;
  std::int64_t rate_mark_steps_ = 0;
  double progress_rate_ = 0;
  std::int64_t last_log_steps_ = 0;
  double steps_per_s_ = 0;
  bool tty_ = false, quiet_ = false;
  std::int64_t last_plain_ = 0;
};

}  // namespace dqn
