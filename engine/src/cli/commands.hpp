/** @file commands.hpp
 *  @brief The dqn subcommands; each returns the process exit code and prints its own errors.
 */
#pragma once

#include <csignal>
#include <cstdint>
#include <string>
#include <vector>

#include "dqn/agent.hpp"
#include "pipeline/spec.hpp"

namespace dqn {
class PluginLoader;
}

namespace dqn::cli {

struct Common {
  std::string plugin_path;             ///< --plugin-path (colon-separated)
  std::vector<std::string> overrides;  ///< key.path=value
  std::string backend;                 ///< --backend cpu|cuda (empty: the pipeline's)
  bool trains = false;                 ///< the command acts in training.env: its network must fit it
};

struct StepArgs {
  Common common;
  std::string pipeline, init, weights, batch, save_batch, out;
  std::int64_t random_batch = -1;
  int steps = 1;
  bool explain = false, print_pipeline = false;
};

struct TrainArgs {
  Common common;
  std::string pipeline, out_dir, weights;
  std::string resume;  ///< a run directory to continue
  std::int64_t seed = -1;
  std::int64_t total_steps = -1;
  bool quiet = false;
};

struct BenchArgs {
  Common common;
  std::string pipeline;
  std::vector<int> batches;
  std::vector<std::string> precisions;
  int warmup = 200, iters = 2000, repeats = 5;
  bool json = false;
  bool profile_range = false;  ///< the profiler's collection range around the timed replays only
  /// --epoch: epochs of `epoch_steps` steps drawing from a full replay of `replay_size`, per kind
  /// in `replays` (uniform, prioritized), beside the bare step (cmd_bench_epoch).
  bool epoch = false;
  int epoch_steps = 10000;
  std::int64_t replay_size = 1000000;
  std::vector<std::string> replays;
};
/// dqn bench --epoch (bench_epoch.cpp).
int cmd_bench_epoch(const BenchArgs& a);

struct CollectArgs {
  Common common;
  std::string source;    ///< a run directory (its pipeline.yaml and weights.safetensors) or a weights file
  std::string pipeline;  ///< with a weights file
  std::string out;
  std::int64_t steps = 10000;
  double epsilon = 0.05;
  std::uint64_t seed = 1;
  bool force = false;
};
/// dqn collect (collect.cpp).
int cmd_collect(const CollectArgs& a);

struct EvalArgs {
  Common common;
  std::string source;    ///< a run directory, or a weights file (with --pipeline)
  std::string pipeline;  ///< with a weights file
  std::string env;       ///< another task than the pipeline's ("" : training.env)
  int episodes = 0;      ///< 0: the pipeline's training.eval.episodes
  std::uint64_t seed = 0;
  bool seed_given = false;  ///< else the seed is derived from the pipeline's
  double epsilon = 0;
  bool best = false, json = false;
};
/// dqn eval (eval.cpp).
int cmd_eval(const EvalArgs& a);

struct CsvArgs {
  std::string run;  ///< a run directory
  std::string out;  ///< "" : <run>/metrics.csv; "-": standard output
  bool force = false;
};
/// dqn csv (csv.cpp): metrics.jsonl as a CSV table.
int cmd_csv(const CsvArgs& a);

struct ExportArgs {
  Common common;
  std::string source;    ///< a run directory, or a weights file (with --pipeline)
  std::string pipeline;  ///< with a weights file
  std::string format = "onnx";
  std::string out;
  bool best = false, force = false;
};
/// dqn export (export.cpp).
int cmd_export(const ExportArgs& a);

struct CheckHeadArgs {
  Common common;
  std::string pipeline;
  std::vector<std::string> heads;  ///< empty: every head
  int samples = 6;
  double eps = 1e-6, rtol = 1e-5, atol = 1e-7;
  std::uint64_t seed = 11, batch_seed = 1;
  bool verbose = false;  ///< a line for every tensor, not only the failures
};

int cmd_plugins(const Common& c);
/// docs/pipeline.md: an introduction, then the reference rendered from the key table and the plugins found.
int cmd_doc_pipeline(const Common& c);
/// Each file with the overrides; with `print`, the resolved pipeline of each that validates.
int cmd_validate(const Common& c, const std::vector<std::string>& files, bool print);
int cmd_step(const StepArgs& a);
int cmd_train(const TrainArgs& a);
int cmd_bench(const BenchArgs& a);
/// Finite differences of every head's parameter gradients (f64 CPU); 1 when one is off.
int cmd_check_head(const CheckHeadArgs& a);

/// While it lives, SIGINT and SIGTERM reach agent.request_stop() (train and collect end at their
/// next step); the previous handlers come back after.
class StopSignals {
 public:
  explicit StopSignals(Agent& agent);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  /// The signal that arrived since the last StopSignals was made (0: none).
  static int received() noexcept;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

/// A trained policy for eval, export and collect: the run directory or weights file `source` (with
/// `pipeline`), the command's overrides, plugin path and backend (`fallback_backend` when none is
/// given; "" : the pipeline's), its best weights with `best`.
Agent policy_agent(const Common& c, const std::string& source, const std::string& pipeline, bool best,
                   const std::string& fallback_backend = "");

/// Loads a pipeline with the plugins on the search path and the overrides; prints errors and
/// returns false on failure.
bool load(const Common& c, const std::string& file, PipelineSpec& out, std::string* resolved_yaml = nullptr);
/// The same with the plugins of `loader` (kept alive by the caller for the engine it builds).
bool load_with(const PluginLoader& loader, const Common& c, const std::string& file, PipelineSpec& out,
               std::string* resolved_yaml = nullptr);
/// The plugin loader for the command's --plugin-path (then $DQN_PLUGIN_PATH).
PluginLoader make_loader(const Common& c);
/// Writes `text` to `path` through a temporary file and a rename; prints why and returns false on failure.
bool write_text(const std::string& path, const std::string& text);

}  // namespace dqn::cli
