/** @file spec.hpp
 *  @brief A parsed, validated pipeline: plain structs. Every value remembers where in which file
 *  it came from, so later checks (plugins, budgets) can still point at file:line:column.
 */
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "dqn/plugin.hpp"

namespace dqn {

struct SourceLoc {
  std::string file;
  int line = 0;    ///< 1-based; 0 when unknown (defaults, overrides)
  int column = 0;  ///< 1-based
  std::string str() const;  ///< "file:line:column" (or "file" / "<override>")
};

/// A configuration error: where, which key, what value, why, and an optional hint.
class PipelineError : public std::runtime_error {
 public:
  PipelineError(SourceLoc where, std::string key, std::string value, std::string why,
                std::string hint = {});
  const SourceLoc& where() const noexcept { return where_; }
  const std::string& key() const noexcept { return key_; }
  const std::string& value() const noexcept { return value_; }
  const std::string& why() const noexcept { return why_; }
  const std::string& hint() const noexcept { return hint_; }

 private:
  SourceLoc where_;
  std::string key_, value_, why_, hint_;
};

/// Several errors found in one pass (validation keeps going where it can).
class PipelineErrors : public std::runtime_error {
 public:
  explicit PipelineErrors(std::vector<PipelineError> errors);
  const std::vector<PipelineError>& errors() const noexcept { return errors_; }

 private:
  std::vector<PipelineError> errors_;
};

enum class BackendKind { cpu, cuda };
enum class Precision { fp32, tf32, bf16 };

struct NetworkSpec {
  int state = 64;
  std::vector<int> trunk{256, 256};
  int head_hidden = 128;
  int branches = 3;
  int actions = 5;
  int atoms = 51;
  double v_min = -10.0, v_max = 10.0;
};

using HeadParam = std::variant<bool, std::int64_t, double, std::string>;

struct HeadSpec {
  std::string plugin;
  std::string name;            ///< instance name; defaults to the plugin name
  Role role = Role::auxiliary;
  double budget = -1.0;        ///< < 0: the plugin's default (auxiliary) / remainder (primary)
  bool enabled = true;
  std::map<std::string, HeadParam> params;     ///< as written in the pipeline
  std::map<std::string, SourceLoc> param_locs;
  SourceLoc loc, plugin_loc, role_loc, budget_loc;
  SourceLoc name_loc, enabled_loc;           ///< line 0 when not written
};

struct AdamSpec {
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

struct SpectralNormSpec {
  bool enabled = false;
  double sigma_max = 2.0;
};

struct TargetSpec {
  double polyak = 0.005;     ///< used when period == 0
  std::int64_t period = 0;   ///< hard copy every `period` Adam steps when > 0
};

struct EpsilonSpec {
  double start = 1.0, end = 0.05;
  std::int64_t decay_steps = 10000;
};

struct ReplaySpec {
  std::int64_t capacity = 100000;
  bool prioritized = false;
  double alpha = 0.6, beta_start = 0.4, beta_end = 1.0;
  double priority_eps = 1e-6;
};

struct EvalSpec {
  std::int64_t every = 5000;   ///< environment steps between evaluations
  int episodes = 20;
};

/// training.env: a task of an environment plugin (or of the program) and its options.
struct EnvChoice {
  std::string plugin;  ///< the environment plugin ("cartpole"); "" for a program's own task
  std::string task;    ///< one of its tasks ("CartPole-v1"); plugin and task "": no environment
  std::map<std::string, HeadParam> options;  ///< as written in the pipeline
  std::map<std::string, SourceLoc> option_locs;
  SourceLoc loc;
  bool none() const { return plugin.empty() && task.empty(); }
  bool operator==(const EnvChoice& o) const { return plugin == o.plugin && task == o.task && options == o.options; }
};

struct TrainingSpec {
  EnvChoice env{"cartpole", "CartPole-v1", {}, {}, {}};
  int env_threads = 0;                 ///< threads stepping the copies (0: the cores the learner leaves)
  int num_envs = 1;
  std::int64_t total_steps = 50000;    ///< environment steps (over all copies)
  std::int64_t learning_starts = 1000;
  int train_every = 1;                 ///< environment steps between training steps
  int gradient_steps = 1;              ///< training steps each time
  int act_refresh = 1;                 ///< training steps between refreshes of the acting snapshot
  std::string dataset;                 ///< offline: a file of transitions ("" → learn from env)
  std::int64_t checkpoint_every = 10000;  ///< steps of the run's clock between checkpoints (0: none)
  int checkpoint_keep = 3;             ///< the newest checkpoints kept
  double checkpoint_minutes = 5;       ///< wall-clock minutes that also bring a checkpoint (0: steps only)
  EpsilonSpec epsilon;
  ReplaySpec replay;
  EvalSpec eval;
  double stop_at_return = 0.0;         ///< stop once eval mean reaches this (0: never)
  double stop_at_success = 0.0;        ///< stop once eval success rate reaches this (0: never)
  std::string out_dir;                 ///< "" → runs/<name>-<timestamp>
};

/// The CUDA backend's choices (the pipeline's `cuda:` section; the CPU backend ignores it). Each
/// changes which kernels run or how they are launched, never the step's mathematics (the GEMM
/// choices may change float rounding within the precision's tolerance).
struct CudaSpec {
  /// Time each GEMM's candidate kernels once, when the step is built, and keep the fastest
  /// (false: cuBLASLt's first choice, or the first tile shape that fits).
  bool autotune = true;
  /// Which kernel family runs the GEMMs: automatic (autotuning picks per problem between cuBLASLt
  /// and, in tf32, the engine's tile_gemm), cuBLASLt only, tile_gemm wherever it fits (tf32), or
  /// tile_gemm with one tile shape.
  enum class Gemm { automatic, cublaslt, tile, tile16x32, tile32x32, tile64x64 };
  Gemm gemm = Gemm::automatic;
  /// How tile_gemm reads its k-contiguous operands' fragments from shared memory: automatic
  /// (autotuning times both), plain loads, or ldmatrix. The same bits either way.
  enum class TileLoads { automatic, plain, ldmatrix };
  TileLoads tile_loads = TileLoads::automatic;
  /// Blocks per thread-block cluster of the fused update (budgets, Adam, spectral norm, target):
  /// 0 automatic (16 where the device schedules such clusters, else 8), 8 or 16; -1 off (the
  /// update as its separate kernels).
  int update_cluster = 0;
  /// Programmatic dependent launch (a kernel placed while the one before it runs): automatic
  /// (every kernel, but in a step over more than 8 lanes only kernels with at most 16 KiB of
  /// dynamic shared memory), small (only those, in every step), all, or off.
  enum class Pdl { automatic, small, all, off };
  Pdl pdl = Pdl::automatic;
  bool operator==(const CudaSpec&) const = default;
};

struct PipelineSpec {
  std::string name = "pipeline";
  std::uint64_t seed = 1;
  BackendKind backend = BackendKind::cpu;
  bool backend_auto = false;           ///< "auto": cuda when a GPU is found, else cpu
  Precision precision = Precision::tf32;
  NetworkSpec network;
  std::vector<HeadSpec> heads;
  double max_grad_norm = 10.0;
  AdamSpec adam;
  SpectralNormSpec spectral_norm;
  TargetSpec target;
  int batch = 256;
  double gamma = 0.99;
  int n_step = 1;
  int report_every = 100;
  /// The devices the step runs on, one data-parallel rank each (empty: every GPU the machine has;
  /// the CPU backend runs as many ranks as listed, as threads, one rank for "all").
  std::vector<int> devices{0};
  CudaSpec cuda;
  TrainingSpec training;

  std::string source;                  ///< the file it was read from ("" for a string)
  double gamma_n() const;
  const HeadSpec& primary() const;
};

const char* to_string(BackendKind b);
const char* to_string(Precision p);
const char* to_string(Role r);
const char* to_string(CudaSpec::Gemm g);
const char* to_string(CudaSpec::TileLoads t);
const char* to_string(CudaSpec::Pdl p);
/// "auto", "8", "16" or "off".
std::string update_cluster_text(int blocks);

}  // namespace dqn
