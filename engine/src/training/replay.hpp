/** @file replay.hpp
 *  @brief The host side of the replay: N environment copies' steps assembled into n-step
 *  transitions, which then go to the engine's replay (ReplayStages::add) where the step
 *  samples them.
 */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/engine.hpp"
#include "core/safetensors.hpp"

namespace dqn {

/// Transitions collected on the host, row-major; view() lends them to ReplayStages::add.
struct TransitionBatch {
  int S = 0, D = 0;
  std::vector<float> states, next_states, rewards, dones;
  std::vector<std::int32_t> actions;
  std::int64_t size() const { return std::int64_t(rewards.size()); }
  void clear();
  void push(const float* state, const std::int32_t* action, float reward, const float* next_state, bool done);
  Transitions view() const;
};

/// Turns environment steps into n-step transitions (s_t, a_t, R_t, s_{t+n}, done).
///
/// Each env copy keeps its last n (s, a, r) in a pending window. When the window is full its
/// oldest entry becomes a transition with R = Σ_{k<n} γ^k r_{t+k} and next state s_{t+n}.
/// On termination every pending entry is flushed with done = 1 and next state = the final
/// observation (the sum stops at the terminal reward; nothing is bootstrapped). On truncation
/// they are flushed with done = 0 and next state = the final observation, so the learner
/// bootstraps from it. The learner discounts the bootstrap by the constant γ^n, so a tail
/// shorter than n steps is discounted slightly too much (γ^n instead of γ^m, m < n): an accepted
/// approximation that keeps one γ^n per batch.
class NStepAssembler {
 public:
  /// Throws std::invalid_argument naming the bad argument: obs_dim, branches, n_step, num_envs
  /// < 1; gamma outside [0, 1].
  NStepAssembler(int obs_dim, int branches, int n_step, double gamma, int num_envs);

  /// One environment step of all N copies: obs [N,S] (before the step), actions [N,D],
  /// rewards [N], next_obs_or_final [N,S] (VecEnv's final_obs: the episode's last observation
  /// where one ended, else the next observation), terminated [N], truncated [N]. Appends the
  /// transitions this step completes to `out` (at most max_per_step()).
  void add(const float* obs, const std::int32_t* actions, const float* rewards, const float* next_obs_or_final,
           const std::uint8_t* terminated, const std::uint8_t* truncated, TransitionBatch& out);

  /// The most transitions one add() appends: every copy flushing a full window.
  int max_per_step() const { return num_envs_ * n_step_; }
  int n_step() const { return n_step_; }
  /// The pending windows as tensors named prefix + … (checkpoints), and back: load_state throws
  /// st::Error / std::invalid_argument naming the tensor when they do not fit, changing nothing.
  void save_state(st::File& f, const std::string& prefix) const;
  void load_state(const st::File& f, const std::string& prefix);
  double gamma() const { return gamma_; }

 private:
  /// Appends pending entry `k` (0 = oldest) of env e as a transition ending at `next_state`.
  void emit(int e, int k, int count, const float* next_state, bool done, TransitionBatch& out);

  int obs_dim_, branches_, n_step_;
  double gamma_;
  int num_envs_;
  // Pending n-step windows per env: a ring of n entries each.
  std::vector<float> pend_obs_;           // [N, n, S]
  std::vector<std::int32_t> pend_act_;    // [N, n, D]
  std::vector<float> pend_rew_;           // [N, n]
  std::vector<int> pend_head_, pend_count_;  // oldest position and count per env
};

}  // namespace dqn
