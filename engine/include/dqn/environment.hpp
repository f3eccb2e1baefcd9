/** @file environment.hpp
 *  @brief The environment plugins' tasks for programs: N copies of a task stepping together, as
 *  `dqn train` steps them (same-step auto-reset with the final observation, terminated apart from
 *  truncated). Programs step them and show the transitions to an Agent; the Python module wraps
 *  them in Gymnasium's interface.
 *
 *  Errors are exceptions with the engine's message: std::invalid_argument for an unknown plugin or
 *  task (with the closest names), options the task's schema refuses, an action out of range;
 *  std::runtime_error when the simulation fails or hands out a non-finite value.
 */
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dqn/export.hpp"

namespace dqn {

class DQN_API Environment {
 public:
  /// `copies` copies of `task` ("CartPole-v1", "reacher", or "plugin:task") seeded from `seed`;
  /// `options` as "key=value", checked against the task's schema; `plugin_path` searched before
  /// $DQN_PLUGIN_PATH and the installed plugins; `threads` stepping the copies (0: chosen from the
  /// cost of the first steps).
  static Environment make(const std::string& task, int copies = 1, std::uint64_t seed = 0,
                          const std::vector<std::string>& options = {}, const std::string& plugin_path = "",
                          int threads = 1);
  Environment(Environment&&) noexcept;
  Environment& operator=(Environment&&) noexcept;
  ~Environment();

  int copies() const;
  int observation_size() const;
  int branches() const;
  std::vector<int> actions_per_branch() const;
  /// Per branch, the control range its bins are evenly spaced over (bin k ↦ lo + k(hi − lo)/(bins − 1)),
  /// or none for a branch of discrete choices.
  std::vector<std::optional<std::pair<double, double>>> control_ranges() const;
  /// "plugin:task".
  const std::string& label() const;
  /// Steps before an episode is truncated (0: none); whether step() reports successes.
  int max_episode_steps() const;
  bool reports_success() const;

  /// Re-seeds every copy and starts new episodes: observations [copies, observation_size()].
  void reset(std::uint64_t seed, float* observations);
  /// actions [copies, branches]; writes the next observations (a new episode's first where one
  /// ended), rewards, terminated and truncated [copies], and final observations (the one that
  /// ended the episode where one ended, else the next).
  void step(const std::int32_t* actions, float* next_observations, float* rewards, std::uint8_t* terminated,
            std::uint8_t* truncated, float* final_observations);
  /// The last step's flags, [copies]: an episode ended that the task counts a success.
  const std::uint8_t* success() const;

  struct Impl;  ///< the engine's side (opaque here)

 private:
  explicit Environment(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dqn
