/** @file cartpole.cpp
 *  @brief The `cartpole` environment plugin: CartPole-v1 with Gym's classic dynamics (explicit
 *  Euler), termination, truncation and same-step auto-reset, N copies in plain arrays.
 *  State is kept in double (as Gym does, in Python floats) and handed out as float32.
 *  Observation: [x, x_dot, theta, theta_dot]; one branch, action 0 pushes left, 1 right.
 *  Each copy draws its reset states from its own stream, seeded from (seed, copy index).
 */
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "dqn/env_base.hpp"

namespace {

/// Gym's cartpole.py constants.
struct C {
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
  static constexpr double reset_bound = 0.05;  ///< reset state ~ U[-0.05, 0.05)^4
};

class CartPole final : public dqn::EnvBase {
 public:
  explicit CartPole(const dqn::EnvCreateInfo& info) : EnvBase(info) {
    max_steps_ = static_cast<int>(options().integer("max_episode_steps"));
    set_spec(4, {dqn::EnvBranch{2, 0, 0.0, 0.0, "push"}}, max_steps_);
    const auto n = static_cast<std::size_t>(num_envs());
    x_.assign(n, 0.0);
    x_dot_.assign(n, 0.0);
    theta_.assign(n, 0.0);
    theta_dot_.assign(n, 0.0);
    steps_.assign(n, 0);
    rng_.assign(n, 0);
    reset_copies(info.seed, 0, num_envs(), nullptr);
  }

  void reset_copies(std::uint64_t seed, int begin, int end, float* obs) override {
    for (auto i = static_cast<std::size_t>(begin); i < static_cast<std::size_t>(end); ++i) {
      rng_[i] = dqn::env_rng::seed_copy(seed, static_cast<std::int64_t>(i));
      reset_copy(i);
      if (obs) write_obs(i, obs);
    }
  }

  void step_copies(int begin, int end, const dqn::EnvStep& io) override {
    for (auto i = static_cast<std::size_t>(begin); i < static_cast<std::size_t>(end); ++i) {
      const double force = io.actions[i] == 1 ? C::force_mag : -C::force_mag;
      const double x = x_[i], x_dot = x_dot_[i], theta = theta_[i], theta_dot = theta_dot_[i];
      const double costheta = std::cos(theta), sintheta = std::sin(theta);
      const double temp = (force + C::polemass_length * theta_dot * theta_dot * sintheta) / C::total_mass;
      const double thetaacc = (C::gravity * sintheta - costheta * temp) /
                              (C::length * (4.0 / 3.0 - C::masspole * costheta * costheta / C::total_mass));
      const double xacc = temp - C::polemass_length * thetaacc * costheta / C::total_mass;
      // "euler": positions advance with the old velocities.
      x_[i] = x + C::tau * x_dot;
      x_dot_[i] = x_dot + C::tau * xacc;
      theta_[i] = theta + C::tau * theta_dot;
      theta_dot_[i] = theta_dot + C::tau * thetaacc;
      steps_[i] += 1;

      const bool term = x_[i] < -C::x_threshold || x_[i] > C::x_threshold || theta_[i] < -C::theta_threshold_radians ||
                        theta_[i] > C::theta_threshold_radians;
      // As Gym's TimeLimit: both flags are set when the last allowed step also terminates.
      const bool trunc = steps_[i] >= max_steps_;
      io.rewards[i] = 1.0f;
      io.terminated[i] = term ? 1 : 0;
      io.truncated[i] = trunc ? 1 : 0;
      write_obs(i, io.final_obs);
      if (term || trunc) reset_copy(i);
      write_obs(i, io.next_obs);
    }
  }

  void save(dqn::StateOut& out) const override {
    out.put("x", x_);
    out.put("x_dot", x_dot_);
    out.put("theta", theta_);
    out.put("theta_dot", theta_dot_);
    out.put("episode_steps", steps_);
    out.put("rng", rng_);
  }

  void load(const dqn::StateIn& in) override {
    const std::vector<std::int64_t> n{num_envs()};
    std::vector<double> x = in.get<double>("x", n), xd = in.get<double>("x_dot", n), th = in.get<double>("theta", n),
                        thd = in.get<double>("theta_dot", n);
    std::vector<std::int32_t> steps = in.get<std::int32_t>("episode_steps", n);
    std::vector<std::uint64_t> rng = in.get<std::uint64_t>("rng", n);
    for (std::size_t i = 0; i < x.size(); ++i) {
      for (const auto* v : {&x, &xd, &th, &thd})
        if (!std::isfinite((*v)[i]))
          in.refuse("CartPole-v1 state in '" + std::string(in.source()) + "': copy " + std::to_string(i) +
                    " has a non-finite value");
      if (steps[i] < 0 || steps[i] >= max_steps_)
        in.refuse("CartPole-v1 state in '" + std::string(in.source()) + "': tensor 'episode_steps' element " +
                  std::to_string(i) + " is " + std::to_string(steps[i]) + " (must be in [0, " +
                  std::to_string(max_steps_) + "))");
    }
    x_ = std::move(x);
    x_dot_ = std::move(xd);
    theta_ = std::move(th);
    theta_dot_ = std::move(thd);
    steps_ = std::move(steps);
    rng_ = std::move(rng);
  }

 private:
  void reset_copy(std::size_t i) {
    std::uint64_t& g = rng_[i];
    x_[i] = dqn::env_rng::uniform(g, -C::reset_bound, C::reset_bound);
    x_dot_[i] = dqn::env_rng::uniform(g, -C::reset_bound, C::reset_bound);
    theta_[i] = dqn::env_rng::uniform(g, -C::reset_bound, C::reset_bound);
    theta_dot_[i] = dqn::env_rng::uniform(g, -C::reset_bound, C::reset_bound);
    steps_[i] = 0;
  }

  void write_obs(std::size_t i, float* obs) const {
    float* o = obs + 4 * i;
    o[0] = static_cast<float>(x_[i]);
    o[1] = static_cast<float>(x_dot_[i]);
    o[2] = static_cast<float>(theta_[i]);
    o[3] = static_cast<float>(theta_dot_[i]);
  }

  int max_steps_ = 500;
  // SoA state, one entry per copy.
  std::vector<double> x_, x_dot_, theta_, theta_dot_;
  std::vector<std::int32_t> steps_;
  std::vector<std::uint64_t> rng_;  // splitmix64 state per copy
};

const dqn::ParamSchema kSchema[] = {
    {"max_episode_steps", dqn::ParamType::integer, "500", "steps after which an episode is truncated (Gym's TimeLimit)", 1,
     1e9},
};

const dqn::EnvDescriptor kTasks[] = {
    DQN_ENV_TASK(CartPole, "CartPole-v1",
                 "balance a pole on a cart (Gym's classic control): 4 observations, push left or right, reward 1 a step",
                 kSchema),
};

}  // namespace

DQN_ENV_PLUGIN("cartpole", "1.0.0", "CartPole-v1, Gym's classic control task", kTasks)
