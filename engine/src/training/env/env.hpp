/** @file env.hpp
 *  @brief Batched environments (N copies stepping together, auto-reset) and a name → factory
 *  registry, so the pipeline addresses environments by name and plugins can add more later.
 */
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/safetensors.hpp"
#include "pipeline/parse.hpp"

namespace dqn {

struct EnvSpec {
  int obs_dim = 0;
  std::vector<int> branch_actions;  ///< actions per branch (BDQ); size() is the branch count
  int max_episode_steps = 0;        ///< truncation limit
  std::string name;
};

/// N copies of one environment stepping together; a copy whose episode ends is reset inside
/// step(), so callers never reset individual copies. All arrays are row-major, [N, ...].
class VecEnv {
 public:
  virtual ~VecEnv() = default;
  virtual const EnvSpec& spec() const = 0;
  virtual int num_envs() const = 0;
  /// Re-seeds every copy from `seed` and starts new episodes; writes obs [N, obs_dim].
  virtual void reset(std::uint64_t seed, float* obs) = 0;
  /// actions [N, branches]; writes next obs (already reset where an episode ended), rewards [N],
  /// terminated/truncated flags [N], and final_obs [N, obs_dim] = the observation that ended the
  /// episode where one ended, else equal to next obs. Throws std::invalid_argument on an action
  /// out of range.
  virtual void step(const std::int32_t* actions, float* next_obs, float* rewards,
                    std::uint8_t* terminated, std::uint8_t* truncated, float* final_obs) = 0;
  /// Every copy's whole state (dynamics, episode step counts, random generators) as tensors named
  /// prefix + …, so that after load_state the copies step on exactly as they would have (the
  /// training checkpoints). load_state throws st::Error / std::invalid_argument naming the tensor
  /// when the file's state does not fit these copies, and then changes nothing.
  virtual void save_state(st::File& f, const std::string& prefix) const = 0;
  virtual void load_state(const st::File& f, const std::string& prefix) = 0;
};

/// Makes `num_envs` copies seeded from `seed` (the same as a later reset(seed, …)).
using EnvFactory = std::function<std::unique_ptr<VecEnv>(int num_envs, std::uint64_t seed)>;

/// Adds an environment to the registry. Throws std::invalid_argument on an empty name, an empty
/// factory or a name already registered.
void register_env(const std::string& name, EnvFactory factory);

/// Throws std::invalid_argument for an unknown name ("unknown environment 'X' (known: …)") or
/// num_envs < 1.
std::unique_ptr<VecEnv> make_env(const std::string& name, int num_envs, std::uint64_t seed);

/// The validator's view of the registered environments (ParseOptions::environments): the shape
/// of the one named, nullopt for a name none registered.
std::function<std::optional<EnvShape>(const std::string&)> environment_shapes();

/// The registered names, sorted.
std::vector<std::string> env_names();

}  // namespace dqn
