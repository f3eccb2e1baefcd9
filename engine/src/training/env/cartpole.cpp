/** @file cartpole.cpp
 *  @brief CartPole-v1 dynamics, termination, truncation and auto-reset for N copies.
 */
#include "training/env/cartpole.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace dqn {
namespace {

using C = CartPoleConstants;

constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;

std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint64_t splitmix64_next(std::uint64_t& state) {
  state += kGolden;
  return splitmix64_mix(state);
}

/// Uniform in [lo, hi) from the top 53 bits, like numpy's uniform.
double uniform(std::uint64_t& state, double lo, double hi) {
  const double u = static_cast<double>(splitmix64_next(state) >> 11) * 0x1.0p-53;
  return lo + (hi - lo) * u;
}

}  // namespace

CartPoleVecEnv::CartPoleVecEnv(int num_envs, std::uint64_t seed) : n_(num_envs) {
  if (num_envs < 1)
    throw std::invalid_argument("CartPole-v1: num_envs must be at least 1, got " +
                                std::to_string(num_envs));
  spec_.obs_dim = 4;
  spec_.branch_actions = {2};
  spec_.max_episode_steps = C::max_episode_steps;
  spec_.name = kCartPoleName;
  const auto n = static_cast<std::size_t>(n_);
  x_.assign(n, 0.0);
  x_dot_.assign(n, 0.0);
  theta_.assign(n, 0.0);
  theta_dot_.assign(n, 0.0);
  steps_.assign(n, 0);
  rng_.assign(n, 0);
  reset(seed, nullptr);
}

void CartPoleVecEnv::reset(std::uint64_t seed, float* obs) {
  for (std::size_t i = 0; i < static_cast<std::size_t>(n_); ++i) {
    // Distinct, well-mixed streams per copy: seeds s and s+1 must not share copies' streams.
    rng_[i] = splitmix64_mix(splitmix64_mix(seed) ^ splitmix64_mix(kGolden * (i + 1)));
    reset_copy(i);
    if (obs) write_obs(i, obs);
  }
}

void CartPoleVecEnv::reset_copy(std::size_t i) {
  std::uint64_t& g = rng_[i];
  x_[i] = uniform(g, -C::reset_bound, C::reset_bound);
  x_dot_[i] = uniform(g, -C::reset_bound, C::reset_bound);
  theta_[i] = uniform(g, -C::reset_bound, C::reset_bound);
  theta_dot_[i] = uniform(g, -C::reset_bound, C::reset_bound);
  steps_[i] = 0;
}

void CartPoleVecEnv::write_obs(std::size_t i, float* obs) const {
  float* o = obs + 4 * i;
  o[0] = static_cast<float>(x_[i]);
  o[1] = static_cast<float>(x_dot_[i]);
  o[2] = static_cast<float>(theta_[i]);
  o[3] = static_cast<float>(theta_dot_[i]);
}

void CartPoleVecEnv::step(const std::int32_t* actions, float* next_obs, float* rewards,
                          std::uint8_t* terminated, std::uint8_t* truncated, float* final_obs) {
  // Validate first so a bad action leaves every copy untouched.
  for (int i = 0; i < n_; ++i) {
    if (actions[i] != 0 && actions[i] != 1)
      throw std::invalid_argument("CartPole-v1: action " + std::to_string(actions[i]) +
                                  " for copy " + std::to_string(i) +
                                  " is out of range (0 push left, 1 push right)");
  }
  for (std::size_t i = 0; i < static_cast<std::size_t>(n_); ++i) {
    const double force = actions[i] == 1 ? C::force_mag : -C::force_mag;
    const double x = x_[i], x_dot = x_dot_[i], theta = theta_[i], theta_dot = theta_dot_[i];
    const double costheta = std::cos(theta), sintheta = std::sin(theta);
    const double temp =
        (force + C::polemass_length * theta_dot * theta_dot * sintheta) / C::total_mass;
    const double thetaacc =
        (C::gravity * sintheta - costheta * temp) /
        (C::length * (4.0 / 3.0 - C::masspole * costheta * costheta / C::total_mass));
    const double xacc = temp - C::polemass_length * thetaacc * costheta / C::total_mass;
    // "euler": positions advance with the old velocities.
    x_[i] = x + C::tau * x_dot;
    x_dot_[i] = x_dot + C::tau * xacc;
    theta_[i] = theta + C::tau * theta_dot;
    theta_dot_[i] = theta_dot + C::tau * thetaacc;
    steps_[i] += 1;

    const bool term = x_[i] < -C::x_threshold || x_[i] > C::x_threshold ||
                      theta_[i] < -C::theta_threshold_radians ||
                      theta_[i] > C::theta_threshold_radians;
    // As Gym's TimeLimit: both flags are set when the last allowed step also terminates.
    const bool trunc = steps_[i] >= C::max_episode_steps;
    rewards[i] = 1.0f;
    terminated[i] = term ? 1 : 0;
    truncated[i] = trunc ? 1 : 0;
    write_obs(i, final_obs);
    if (term || trunc) reset_copy(i);
    write_obs(i, next_obs);
  }
}

std::array<double, 4> CartPoleVecEnv::state(int i) const {
  const auto k = static_cast<std::size_t>(i);
  return {x_.at(k), x_dot_.at(k), theta_.at(k), theta_dot_.at(k)};
}

void CartPoleVecEnv::set_state(int i, const std::array<double, 4>& s) {
  const auto k = static_cast<std::size_t>(i);
  x_.at(k) = s[0];
  x_dot_.at(k) = s[1];
  theta_.at(k) = s[2];
  theta_dot_.at(k) = s[3];
}

void CartPoleVecEnv::save_state(st::File& f, const std::string& prefix) const {
  const std::vector<std::int64_t> n{n_};
  f.put_raw(prefix + "x", st::DType::F64, n, x_.data());
  f.put_raw(prefix + "x_dot", st::DType::F64, n, x_dot_.data());
  f.put_raw(prefix + "theta", st::DType::F64, n, theta_.data());
  f.put_raw(prefix + "theta_dot", st::DType::F64, n, theta_dot_.data());
  f.put_raw(prefix + "episode_steps", st::DType::I32, n, steps_.data());
  f.put_raw(prefix + "rng", st::DType::U8, {n_, 8}, rng_.data());
}

void CartPoleVecEnv::load_state(const st::File& f, const std::string& prefix) {
  const auto n = static_cast<std::size_t>(n_);
  const std::vector<std::int64_t> shape{n_};
  std::vector<double> x(n), xd(n), th(n), thd(n);
  std::vector<int> steps(n);
  std::vector<std::uint64_t> rng(n);
  f.get_raw(prefix + "x", st::DType::F64, shape, x.data());
  f.get_raw(prefix + "x_dot", st::DType::F64, shape, xd.data());
  f.get_raw(prefix + "theta", st::DType::F64, shape, th.data());
  f.get_raw(prefix + "theta_dot", st::DType::F64, shape, thd.data());
  f.get_raw(prefix + "episode_steps", st::DType::I32, shape, steps.data());
  f.get_raw(prefix + "rng", st::DType::U8, {n_, 8}, rng.data());
  for (std::size_t i = 0; i < n; ++i) {
    for (const auto* v : {&x, &xd, &th, &thd})
      if (!std::isfinite((*v)[i]))
        throw std::invalid_argument("CartPole-v1 state in '" + f.path + "': copy " + std::to_string(i) +
                                    " has a non-finite value");
    if (steps[i] < 0 || steps[i] >= C::max_episode_steps)
      throw std::invalid_argument("CartPole-v1 state in '" + f.path + "': tensor '" + prefix + "episode_steps' element " +
                                  std::to_string(i) + " is " + std::to_string(steps[i]) + " (must be in [0, " +
                                  std::to_string(C::max_episode_steps) + "))");
  }
  x_ = std::move(x);
  x_dot_ = std::move(xd);
  theta_ = std::move(th);
  theta_dot_ = std::move(thd);
  steps_ = std::move(steps);
  rng_ = std::move(rng);
}

}  // namespace dqn
