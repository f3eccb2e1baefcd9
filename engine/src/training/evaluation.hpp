/** @file evaluation.hpp
 *  @brief Episodes of a policy on a vectorised environment: every copy plays the same number of
 *  whole episodes (so short episodes are not favoured), greedy or ε-greedy, from one seed; the
 *  returns, lengths and successes summarised. The training loop's evaluations, `dqn eval` and
 *  Agent::evaluate all run here.
 */
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dqn {

class ActStages;
class VecEnv;

struct EvalOptions {
  int episodes_per_copy = 1;
  /// The environment's reset seed (the ε draws derive their own stream from it).
  std::uint64_t seed = 0;
  /// With probability ε a copy's action is uniformly random in every branch (0: greedy).
  double epsilon = 0;
  /// Polled before every step: true ends the evaluation incomplete.
  std::function<bool()> stop;
};

/// An evaluation's episodes.
struct EvalResult {
  double mean = 0, min = 0, max = 0;
  int episodes = 0;
  bool complete = false;          ///< false when a stop request cut it short
  std::optional<double> success;  ///< the fraction of episodes the task counted a success (where it reports them)
  double std = 0;                 ///< the returns' population standard deviation
  std::uint64_t seed = 0;         ///< EvalOptions::seed
  /// Every episode in copy order, each copy's in the order played.
  std::vector<double> returns;
  std::vector<std::int64_t> lengths;
};

/// Plays options.episodes_per_copy whole episodes on each of env's copies, acting with the
/// actor's current parameters (ActStages::act: greedy from the parameters as they are). Throws
/// std::invalid_argument when the environment has more copies than the act step takes rows, or
/// episodes_per_copy < 1, or ε is outside [0, 1].
EvalResult evaluate_policy(ActStages& actor, VecEnv& env, const EvalOptions& options);

/// The result as JSON (mean, std, min, max, episodes, success, lengths' mean/min/max, seed,
/// returns, lengths) and as the text `dqn eval` prints.
std::string eval_json(const EvalResult& r, const std::string& label);
std::string eval_text(const EvalResult& r, const std::string& label);

}  // namespace dqn
