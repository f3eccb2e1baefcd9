/** @file vec_env.hpp
 *  @brief The engine's side of environments: VecEnv holds the copies of one task (an environment
 *  plugin's, dqn/env.hpp, or one registered by the program) and steps them over a thread pool,
 *  checking what goes in (actions in range) and what comes out (finite observations and rewards);
 *  make_env finds a task from the pipeline's training.env.
 */
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/safetensors.hpp"
#include "dqn/env.hpp"
#include "pipeline/parse.hpp"
#include "training/env/env_pool.hpp"

namespace dqn {

class PluginLoader;

/// N copies of one task stepping together; a copy whose episode ends is reset inside step(), so
/// callers never reset individual copies. All arrays are row-major, [N, ...].
class VecEnv {
 public:
  /// Takes `env`; `destroy` deletes it and `keep` (the plugin's library) lives until then.
  /// `label` names the task in messages ("cartpole:CartPole-v1"). threads >= 1: that many (at most
  /// one per copy); 0: chosen from the measured cost of the first steps (auto_threads).
  VecEnv(Env* env, void (*destroy)(Env*), std::shared_ptr<const void> keep, std::string label, int threads);
  ~VecEnv();
  VecEnv(const VecEnv&) = delete;
  VecEnv& operator=(const VecEnv&) = delete;

  const EnvSpec& spec() const { return env_->spec(); }
  int num_envs() const { return n_; }
  int obs_dim() const { return spec().obs_dim; }
  int branches() const { return spec().n_branches; }
  std::vector<int> branch_actions() const;  ///< bins per branch
  const std::string& label() const { return label_; }
  int threads() const { return pool_->threads(); }

  /// Re-seeds every copy from `seed` and starts new episodes; writes obs [N, obs_dim].
  void reset(std::uint64_t seed, float* obs);
  /// actions [N, branches]; writes next obs (already reset where an episode ended), rewards [N],
  /// terminated/truncated flags [N], and final_obs [N, obs_dim] = the observation that ended the
  /// episode where one ended, else equal to next obs. Throws std::invalid_argument on an action out
  /// of range (before any copy moves), std::runtime_error naming the task, copy and value when the
  /// environment fails or hands out a non-finite observation or reward.
  void step(const std::int32_t* actions, float* next_obs, float* rewards, std::uint8_t* terminated,
            std::uint8_t* truncated, float* final_obs);
  /// The last step's per-copy flags: an episode ended that the task counts a success; the
  /// simulation became unstable (its episode was truncated).
  const std::vector<std::uint8_t>& success() const { return success_; }
  const std::vector<std::uint8_t>& unstable() const { return unstable_; }
  /// Episodes ended by an unstable simulation since the copies were made (kept in saved state).
  std::int64_t unstable_episodes() const { return unstable_total_; }

  /// Every copy's whole state as tensors named prefix + …, so that after load_state the copies
  /// step on exactly as they would have. load_state throws st::Error / std::invalid_argument naming
  /// the file and tensor when the state does not fit these copies, and then changes nothing.
  void save_state(st::File& f, const std::string& prefix) const;
  void load_state(const st::File& f, const std::string& prefix);

 private:
  /// call(begin, end, err) on every range at once; throws naming the first range that failed.
  void run_ranges(const char* what, const std::function<int(int, int, char*)>& call);

  Env* env_;
  void (*destroy_)(Env*);
  std::shared_ptr<const void> keep_;
  std::string label_;
  int n_;
  std::unique_ptr<EnvPool> pool_;
  int auto_max_ = 0;        ///< threads == 0: the most threads the measured choice may take
  int probed_ = 0;          ///< steps timed so far (threads == 0)
  double probe_s_ = 0.0;    ///< their time
  std::vector<std::uint8_t> success_, unstable_;
  std::int64_t unstable_total_ = 0;
};

/// An environment a program brings without a plugin library: makes the copies (the Env is deleted
/// with delete).
using EnvFactory = std::function<std::unique_ptr<Env>(const EnvCreateInfo& info)>;

/// Adds a task to this program's environments, found by training.env's task like a plugin's.
/// Throws std::invalid_argument on an empty name, an empty factory or a name already registered.
void register_env(const std::string& task, EnvFactory factory);

/// The copies of training.env's task: `num_envs` of them seeded from `seed`, stepped over
/// `threads` threads (0: the cores left after the learner). Plugins come from `plugins` (null: the
/// default search path, PluginLoader::search_path_from("")). Throws std::invalid_argument naming
/// the environment for an unknown plugin or task, options its schema refuses, a refusal of the
/// plugin's create(), or num_envs < 1.
std::unique_ptr<VecEnv> make_env(const EnvChoice& env, int num_envs, std::uint64_t seed, int threads = 1,
                                  const PluginLoader* plugins = nullptr);
/// A task named alone ("CartPole-v1": a program's, or any plugin's task of that name) or as
/// "plugin:task", with no options.
EnvChoice env_choice(const std::string& name);
/// As make_env for a task named alone (a program's, or any plugin's task of that name), or as
/// "plugin:task", with the task's default options.
std::unique_ptr<VecEnv> make_env(const std::string& task, int num_envs, std::uint64_t seed, int threads = 1,
                                 const PluginLoader* plugins = nullptr);

/// The threads `training.env_threads` means for N copies: as given (never more than the copies),
/// or 0, chosen by the VecEnv once it has timed its first steps.
int env_threads(int configured, int num_envs);
/// The choice for 0: one thread per kAutoThreadWork of a step's measured work (so that handing a
/// range to a thread costs little beside it), at least one, at most the cores the learner leaves
/// and the copies.
int auto_threads(double step_seconds, int num_envs);
inline constexpr double kAutoThreadWork = 50e-6;  ///< seconds of stepping worth a thread
inline constexpr int kAutoProbeSteps = 16;       ///< steps timed (after one) before the choice

/// The validator's view of the environments (ParseOptions::environments): one copy made to read
/// its spec.
std::function<EnvProbe(const EnvChoice&)> environment_shapes(const PluginLoader* plugins = nullptr);

/// The tasks registered by this program, sorted.
std::vector<std::string> program_env_names();

/// "plugin:task" (or the task alone for a program's own).
std::string env_label(const EnvChoice& env);

}  // namespace dqn
