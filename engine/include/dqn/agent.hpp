/** @file agent.hpp
 *  @brief The engine as a library: an Agent built from a pipeline (a file, its text, or a run
 *  directory that `dqn train` wrote) acts on batches of observations, learns from the transitions
 *  it is shown or from its pipeline's environment, evaluates, and saves and loads its state.
 *  `dqn train`, `eval`, `export` and `collect` are built on it, and so is the Python module.
 *
 *  Errors are exceptions carrying the engine's message: std::invalid_argument for what the caller
 *  gave (a pipeline error keeps its file:line:column, an observation of the wrong shape names the
 *  expected one), std::runtime_error for what went wrong inside (a file that cannot be written).
 *  One Agent is used from one thread at a time.
 */
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dqn/export.hpp"

namespace dqn {

/// This header's version: the major changes when a declaration here changes incompatibly.
inline constexpr int kAgentApiMajor = 1, kAgentApiMinor = 1;

struct AgentOptions {
  /// Pipeline overrides, "key.path=value", applied in order after the file.
  std::vector<std::string> overrides;
  /// Plugin directories (colon-separated), searched before $DQN_PLUGIN_PATH and the installed ones.
  std::string plugin_path;
  /// "cpu" or "cuda" ("" : the pipeline's `backend`).
  std::string backend;
  /// From a run directory: its best.safetensors instead of the final weights.safetensors.
  bool best = false;
};

/// An evaluation's episodes: every copy of the environment plays the same number of whole episodes.
struct DQN_API AgentEval {
  std::string env;  ///< the task, as "plugin:task"
  int episodes = 0;
  double mean = 0, std = 0, min = 0, max = 0;
  std::optional<double> success;  ///< the fraction counted a success, where the task reports it
  std::uint64_t seed = 0;         ///< the environment's reset seed
  std::vector<double> returns;    ///< copy by copy, each copy's episodes in the order played
  std::vector<std::int64_t> lengths;
  std::string json() const;  ///< one JSON object: the figures above and the lengths' mean/min/max
  std::string text() const;  ///< the lines `dqn eval` prints
};

/// The pipeline's `training` settings a program's own loop follows, as `dqn train` does.
struct DQN_API AgentTraining {
  std::string env;  ///< training.env as "plugin:task" ("" : none)
  int num_envs = 1;
  std::int64_t total_steps = 0, learning_starts = 0;
  int train_every = 1, gradient_steps = 1;
  double epsilon_start = 1, epsilon_end = 0;
  std::int64_t epsilon_decay_steps = 0;
  std::int64_t eval_every = 0;
  int eval_episodes = 0;
  double stop_at_return = 0, stop_at_success = 0;  ///< 0: never
  int batch = 0;  ///< the pipeline's batch: train() needs as many transitions in the replay
  /// ε at an environment step (over all copies): linear from start to end over the decay steps.
  double epsilon(std::int64_t env_step) const;
};

/// Where and how Agent::run writes.
struct AgentRunOptions {
  /// The run directory: "" → training.out_dir, and where that is "" too, runs/<name>-<time>. It
  /// must not exist or be empty: a run never writes over another.
  std::string run_dir;
  /// The line that says what runs, and the progress line (updated in place on a terminal), on
  /// standard error.
  bool progress = true;
};

/// What Agent::run did.
struct AgentRun {
  std::string run_dir;
  /// Environment steps (each rank's, over several devices), training steps, episodes ended,
  /// steps skipped for a non-finite loss or gradient.
  std::int64_t env_steps = 0, train_steps = 0, episodes = 0, skipped_steps = 0;
  std::int64_t env_steps_all_ranks = 0;  ///< over several devices: every rank's together
  int ranks = 1;
  bool offline = false;  ///< trained on training.dataset: the steps above are training steps
  std::optional<double> final_eval;     ///< the evaluation at the last step, if one ran there
  std::optional<double> final_success;  ///< its success rate, where the task reports successes
  std::optional<double> last_eval, best_eval;
  std::int64_t last_eval_step = -1, best_eval_step = -1;
  bool solved = false;       ///< an evaluation reached training.stop_at_return or stop_at_success
  bool interrupted = false;  ///< request_stop() ended it (a checkpoint of where it stopped is written)
  double wall_s = 0;
  std::string checkpoint;  ///< the last checkpoint written ("" if none)
  /// Files that could not be written while the run went on: each error's text.
  std::vector<std::string> write_errors;
};

/// The checkpoint an Agent::resume agent continues from.
struct AgentCheckpoint {
  std::string path;
  std::int64_t step = 0;  ///< the run's clock there (environment steps; offline, training steps)
};

/// What Agent::collect wrote.
struct AgentDataset {
  std::string path, env;
  std::int64_t steps = 0, episodes = 0;
  std::int64_t complete_episodes = 0;  ///< the others were cut off by the end of the collection
  std::optional<double> behaviour_return;  ///< the complete episodes' mean return (none: no episode ended)
  bool stopped = false;  ///< request_stop() ended it: nothing was written (steps: those taken)
};

/// What the newest training step reported.
struct AgentReport {
  std::int64_t step = 0;  ///< training steps taken when it was copied
  double total_loss = 0;
  std::vector<std::string> heads;
  std::vector<double> losses, grad_norms, clips;
  std::int64_t skipped_steps = 0;  ///< steps skipped for a non-finite loss or gradient, so far
};

class DQN_API Agent {
 public:
  /// From a pipeline file. New weights are drawn from the pipeline's seed.
  static Agent from_file(const std::string& pipeline, const AgentOptions& options = {});
  /// From a pipeline's YAML text (`name` is what messages call it).
  static Agent from_text(const std::string& yaml, const AgentOptions& options = {},
                         const std::string& name = "<pipeline text>");
  /// From a run directory of `dqn train` (its pipeline.yaml and weights.safetensors, or
  /// best.safetensors with options.best), or from a weights or checkpoint file with the pipeline
  /// file it was trained with.
  static Agent from_run(const std::string& run_dir_or_weights, const AgentOptions& options = {},
                        const std::string& pipeline = "");

  /// An agent that continues a run of `dqn train` (or of run()) that was stopped: the run
  /// directory's own pipeline.yaml and its newest checkpoint that reads back whole (those passed
  /// over are in warnings()). options.overrides must be empty; run() restores the checkpoint's
  /// whole state, goes on in that directory and ends where the run would have ended, with the
  /// same results.
  static Agent resume(const std::string& run_dir, const AgentOptions& options = {});

  /// GPUs the CUDA backend can use (0 in a build without CUDA or on a machine without a GPU).
  static int cuda_devices() noexcept;

  Agent(Agent&&) noexcept;
  Agent& operator=(Agent&&) noexcept;
  ~Agent();

  /// Observation features, action branches, actions in each branch.
  int observation_size() const;
  int branches() const;
  std::vector<int> actions_per_branch() const;
  /// The most observations act() and q_values() take in one call.
  int max_rows() const;
  /// The resolved pipeline (every default written out) as YAML.
  const std::string& pipeline_yaml() const;
  /// "cpu" or "cuda", and the runtime in words ("cuda: NVIDIA H100 … (tf32)").
  std::string backend() const;
  std::string describe() const;
  /// The pipeline's `seed`.
  std::uint64_t seed() const;
  /// The pipeline's `training` settings.
  AgentTraining training() const;
  /// What was found but not used on the way: plugin libraries that could not be loaded,
  /// checkpoints that Agent::resume passed over (and why).
  const std::vector<std::string>& warnings() const;
  /// Where an Agent::resume agent's run() starts (none for other agents, and after its run).
  std::optional<AgentCheckpoint> resume_point() const;

  /// Greedy actions [rows, branches] for observations [rows, observation_size()] (row-major),
  /// from the current parameters. Throws std::invalid_argument for rows outside 1..max_rows() or a
  /// non-finite observation (naming its row and feature).
  void act(const float* observations, int rows, std::int32_t* actions);
  /// Q-values [rows, branches, max actions] of the primary head (what act() takes the argmax of).
  void q_values(const float* observations, int rows, float* q);

  /// One environment step of `copies` parallel environments: observations and next observations
  /// [copies, observation_size()] (next: the episode's final observation where one ended),
  /// actions [copies, branches], rewards, terminated and truncated [copies]. The pipeline's n-step
  /// transitions are assembled inside, per copy; the number of copies is fixed by the first call.
  void observe(const float* observations, const std::int32_t* actions, const float* rewards,
               const float* next_observations, const std::uint8_t* terminated, const std::uint8_t* truncated,
               int copies);
  /// Transitions in the replay.
  std::int64_t replay_size() const;
  /// `steps` training steps on batches drawn from the replay; returns their last report. Throws
  /// std::logic_error while the replay holds fewer transitions than one batch.
  AgentReport train(std::int64_t steps);
  /// Training steps taken so far.
  std::int64_t train_steps() const;
  /// The newest report that has landed without waiting (none before the first).
  std::optional<AgentReport> latest_report();

  /// Episodes of the greedy (or ε-greedy) policy on `env` ("" : the pipeline's training.env; else
  /// a task name, or "plugin:task"), `episodes` in all (0: the pipeline's training.eval.episodes),
  /// each of as many copies as divide them and the act step takes playing the same number. No
  /// seed: one derived from the pipeline's seed, apart from training's (a training evaluation's
  /// seed, its metrics line's eval_seed, replays it).
  AgentEval evaluate(int episodes = 0, std::optional<std::uint64_t> seed = std::nullopt, double epsilon = 0.0,
                     const std::string& env = "");

  /// The pipeline's own training loop, what `dqn train` runs: training.num_envs copies of
  /// training.env acting ε-greedily from the acting snapshot while the learner steps (or, offline,
  /// training.dataset's transitions), evaluations, the stopping rules, and in the run directory
  /// the resolved pipeline, metrics.jsonl, the weights, the best weights and checkpoints. Starts
  /// from the agent's parameters; several devices in the pipeline: one engine per device, each
  /// starting from them. After it the agent holds the run's final parameters. Throws
  /// std::invalid_argument for a run directory that holds anything or a pipeline that cannot run,
  /// std::runtime_error for what fails during the run (saying where what was written so far is).
  AgentRun run(const AgentRunOptions& options = {});
  /// Ends run() or collect() in progress at its next step, as SIGINT ends `dqn train`. Safe from
  /// another thread and from a signal handler (one lock-free store).
  void request_stop() noexcept;
  /// `steps` environment steps (over all copies) of the current policy, ε-greedy (a random action
  /// in each branch with probability `epsilon`), on training.num_envs copies of training.env
  /// reset with `seed`, written at `path` as a dataset that training.dataset reads (atomically;
  /// an existing file only with `replace`). Episodes still open at the end are kept as
  /// truncated ones. Throws std::invalid_argument before acting for a file that exists or a
  /// pipeline without an environment. When request_stop() ends it, nothing is written.
  AgentDataset collect(const std::string& path, std::int64_t steps, double epsilon, std::uint64_t seed,
                       bool replace = false);

  /// The network's parameters (online and target, the optimizer's moments, spectral-norm state)
  /// as a weights file (safetensors, written through a temporary file and a rename).
  void save(const std::string& path);
  /// Loads a weights file that `save`, `dqn train` or `dqn step` wrote for the same network.
  void load(const std::string& path);

  /// The acting network alone — the trunk, the primary head up to its Q-values [rows, D, A], the
  /// argmax over actions — at `path` (atomically) as `format`: "onnx" (opset 17; inputs
  /// `observations`, outputs `q` and `actions`) or "safetensors" (its tensors, and in the
  /// metadata's "dqn.policy" a JSON manifest: sizes, the head's support or quantiles, the controls
  /// the bins stand for where the environment is continuous, the pipeline's hash, the graph).
  /// Throws std::invalid_argument when the primary head's plugin offers no export, or for ONNX in
  /// a build without it.
  void export_policy(const std::string& path, const std::string& format);

  /// The engine's side (opaque here).
  struct Impl;

 private:
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dqn
