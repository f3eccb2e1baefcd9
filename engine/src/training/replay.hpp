/** @file replay.hpp
 *  @brief Experience replay: n-step transitions from N environment copies, uniform or
 *  proportional prioritized sampling (Schaul et al. 2016) over a sum tree.
 */
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace dqn {

/// Complete binary tree over `capacity` non-negative leaf values: O(log n) set, prefix-sum
/// search and total, plus the minimum positive leaf (for the max importance weight).
class SumTree {
 public:
  /// Throws std::invalid_argument for capacity < 1. All leaves start at 0.
  explicit SumTree(std::int64_t capacity);

  std::int64_t capacity() const { return capacity_; }
  /// Throws std::out_of_range for i outside [0, capacity), std::invalid_argument for p < 0 or
  /// not finite.
  void set(std::int64_t i, double p);
  double p(std::int64_t i) const;
  double total() const { return sum_[1]; }
  /// Smallest positive leaf; +infinity while every leaf is 0.
  double min_positive() const { return min_[1]; }
  /// The leaf i whose interval [Σ_{j<i} p_j, Σ_{j<=i} p_j) holds `prefix`; prefix is clamped to
  /// [0, total) so rounding never lands on a zero leaf. Throws std::logic_error when total is 0.
  std::int64_t find(double prefix) const;

 private:
  std::int64_t capacity_;
  std::int64_t leaves_;       // power of two >= capacity; leaf i is node leaves_ + i
  std::vector<double> sum_;   // [2 * leaves_], node 1 is the root
  std::vector<double> min_;   // same layout; +inf for zero leaves
};

/// A sampled minibatch, row-major. Vectors are resized by sample() and reused across calls.
struct Batch {
  std::vector<float> states;          ///< [B, S]
  std::vector<float> next_states;     ///< [B, S]
  std::vector<std::int32_t> actions;  ///< [B, D]
  std::vector<float> rewards;         ///< [B]  n-step discounted return
  std::vector<float> dones;           ///< [B]  1: terminated within the n steps (no bootstrap)
  std::vector<float> is_weights;      ///< [B]  1 for uniform replay
  std::vector<std::int64_t> indices;  ///< [B]  slots, for update_priorities
};

/// Circular store of n-step transitions (s_t, a_t, R_t, s_{t+n}, done).
///
/// Each env copy keeps its last n (s, a, r) in a pending window. When the window is full its
/// oldest entry becomes a transition with R = Σ_{k<n} γ^k r_{t+k} and next state s_{t+n}.
/// On termination every pending entry is flushed with done = 1 and next state = the final
/// observation (the sum stops at the terminal reward; nothing is bootstrapped). On truncation
/// they are flushed with done = 0 and next state = the final observation, so the learner
/// bootstraps from it. The learner discounts the bootstrap by the constant γ^n, so a tail
/// shorter than n steps is discounted slightly too much (γ^n instead of γ^m, m < n): an accepted
/// approximation that keeps one γ^n per batch.
class ReplayBuffer {
 public:
  /// Throws std::invalid_argument naming the bad argument: capacity, obs_dim, branches, n_step,
  /// num_envs < 1; gamma outside [0, 1]; and when prioritized, alpha < 0 or priority_eps <= 0.
  ReplayBuffer(std::int64_t capacity, int obs_dim, int branches, int n_step, double gamma,
               int num_envs, bool prioritized, double alpha, double priority_eps);

  /// One environment step of all N copies: obs [N,S] (before the step), actions [N,D],
  /// rewards [N], next_obs_or_final [N,S] (VecEnv's final_obs: the episode's last observation
  /// where one ended, else the next observation), terminated [N], truncated [N].
  /// Never allocates. New transitions get the largest priority seen so far (1 initially).
  void add(const float* obs, const std::int32_t* actions, const float* rewards,
           const float* next_obs_or_final, const std::uint8_t* terminated,
           const std::uint8_t* truncated);

  /// B transitions with replacement: uniform (is_weights = 1), or prioritized with P(i) ∝ p_i^α
  /// drawn in B equal strata of the total, w_i = (size·P(i))^(−β) / max_j w_j with the max from
  /// the smallest priority. Throws std::logic_error when empty, std::invalid_argument for B < 1
  /// or beta < 0.
  void sample(int B, double beta, std::mt19937_64& rng, Batch& out) const;

  /// p_i = |td_i| + priority_eps (the tree holds p^α). No-op for uniform replay. A slot that has
  /// been overwritten since it was sampled gets the new priority; as in the usual PER, that is
  /// accepted. Throws std::out_of_range for an index outside [0, size), std::invalid_argument
  /// for a td error that is not finite.
  void update_priorities(const std::int64_t* indices, const float* td_errors, int B);

  std::int64_t size() const { return size_; }
  std::int64_t capacity() const { return capacity_; }
  bool prioritized() const { return prioritized_; }
  int n_step() const { return n_step_; }
  double gamma() const { return gamma_; }
  /// Largest p (before ^α) seen so far; new transitions get it.
  double max_priority() const { return max_priority_; }

  /// Stored slot i (0 <= i < size), for inspection and tests.
  const float* state_at(std::int64_t i) const;
  const float* next_state_at(std::int64_t i) const;
  const std::int32_t* action_at(std::int64_t i) const;
  float reward_at(std::int64_t i) const;
  float done_at(std::int64_t i) const;
  /// p_i before ^α (1 for uniform replay).
  double priority_at(std::int64_t i) const;

 private:
  void check_slot(std::int64_t i, const char* what) const;
  /// Writes pending entry `k` (0 = oldest) of env e as a transition ending at `next_state`.
  void emit(int e, int k, int count, const float* next_state, bool done);
  void store(const float* state, const std::int32_t* action, float reward,
             const float* next_state, bool done);

  std::int64_t capacity_;
  int obs_dim_, branches_, n_step_;
  double gamma_;
  int num_envs_;
  bool prioritized_;
  double alpha_, priority_eps_;

  std::vector<float> states_, next_states_, rewards_, dones_;
  std::vector<std::int32_t> actions_;
  std::vector<double> priorities_;  // p before ^α, for inspection
  SumTree tree_;                    // p^α (unused for uniform replay: capacity 1)
  double max_priority_ = 1.0;
  std::int64_t next_ = 0, size_ = 0;

  // Pending n-step windows per env: a ring of n entries each.
  std::vector<float> pend_obs_;           // [N, n, S]
  std::vector<std::int32_t> pend_act_;    // [N, n, D]
  std::vector<float> pend_rew_;           // [N, n]
  std::vector<int> pend_head_, pend_count_;  // oldest position and count per env
};

}  // namespace dqn
