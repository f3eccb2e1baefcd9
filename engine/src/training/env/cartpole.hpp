/** @file cartpole.hpp
 *  @brief CartPole-v1 with Gym's classic dynamics (explicit Euler), N copies in plain arrays.
 */
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "training/env/env.hpp"

namespace dqn {

inline constexpr const char* kCartPoleName = "CartPole-v1";

/// Gym's cartpole.py constants.
struct CartPoleConstants {
  static constexpr double gravity = 9.8;
  static constexpr double masscart = 1.0;
  static constexpr double masspole = 0.1;
  static constexpr double total_mass = masspole + masscart;
  static constexpr double length = 0.5;  ///< half the pole's length
  static constexpr double polemass_length = masspole * length;
  static constexpr double force_mag = 10.0;
  static constexpr double tau = 0.02;  ///< seconds between state updates
  static constexpr double theta_threshold_radians = 12.0 * 2.0 * 3.14159265358979323846 / 360.0;
  static constexpr double x_threshold = 2.4;
  static constexpr int max_episode_steps = 500;
  static constexpr double reset_bound = 0.05;  ///< reset state ~ U[-0.05, 0.05)^4
};

/// State is kept in double (as Gym does, in Python floats) and handed out as float32.
/// Observation: [x, x_dot, theta, theta_dot]; one branch, action 0 pushes left, 1 right.
/// Each copy draws its reset states from its own generator, seeded from (seed, copy index).
class CartPoleVecEnv final : public VecEnv {
 public:
  /// Throws std::invalid_argument for num_envs < 1.
  CartPoleVecEnv(int num_envs, std::uint64_t seed);

  const EnvSpec& spec() const override { return spec_; }
  int num_envs() const override { return n_; }
  void reset(std::uint64_t seed, float* obs) override;
  void step(const std::int32_t* actions, float* next_obs, float* rewards,
            std::uint8_t* terminated, std::uint8_t* truncated, float* final_obs) override;
  void save_state(st::File& f, const std::string& prefix) const override;
  void load_state(const st::File& f, const std::string& prefix) override;

  /// For tests and diagnostics: the exact double state of copy i, and overriding it
  /// (the episode's step count is left as it is).
  std::array<double, 4> state(int i) const;
  void set_state(int i, const std::array<double, 4>& s);
  /// Steps taken in copy i's current episode.
  int episode_steps(int i) const { return steps_[static_cast<std::size_t>(i)]; }

 private:
  void reset_copy(std::size_t i);
  void write_obs(std::size_t i, float* obs) const;

  EnvSpec spec_;
  int n_;
  // SoA state, one entry per copy.
  std::vector<double> x_, x_dot_, theta_, theta_dot_;
  std::vector<int> steps_;
  std::vector<std::uint64_t> rng_;  // splitmix64 state per copy
};

}  // namespace dqn
