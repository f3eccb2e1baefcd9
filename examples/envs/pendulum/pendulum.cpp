/** @file pendulum.cpp
 *  @brief Pendulum-v1 (Gym's classic control swing-up) as an environment plugin written against
 *  the installed SDK alone: a continuous torque in [-2, 2] offered as `bins` evenly spaced controls
 *  (one action branch), observation [cos θ, sin θ, θ̇], reward −(θ² + 0.1 θ̇² + 0.001 u²) with θ
 *  normalised to [−π, π), truncated after 200 steps, never terminated.
 */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <dqn/env_base.hpp>

namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kMaxSpeed = 8.0, kMaxTorque = 2.0, kDt = 0.05, kG = 10.0, kM = 1.0, kL = 1.0;

double angle_normalize(double x) { return std::fmod(std::fmod(x + kPi, 2 * kPi) + 2 * kPi, 2 * kPi) - kPi; }

class Pendulum final : public dqn::EnvBase {
 public:
  explicit Pendulum(const dqn::EnvCreateInfo& info) : EnvBase(info) {
    const auto bins = options().integer("bins");
    max_steps_ = static_cast<int>(options().integer("max_episode_steps"));
    set_spec(3, {dqn::EnvBranch{static_cast<std::int32_t>(bins), 1, -kMaxTorque, kMaxTorque, "torque"}}, max_steps_);
    const auto n = static_cast<std::size_t>(num_envs());
    th_.assign(n, 0.0);
    thdot_.assign(n, 0.0);
    steps_.assign(n, 0);
    rng_.assign(n, 0);
    reset_copies(info.seed, 0, num_envs(), nullptr);
  }

  void reset_copies(std::uint64_t seed, int begin, int end, float* obs) override {
    for (int i = begin; i < end; ++i) {
      rng_[std::size_t(i)] = dqn::env_rng::seed_copy(seed, i);
      start(std::size_t(i));
      if (obs) write_obs(std::size_t(i), obs);
    }
  }

  void step_copies(int begin, int end, const dqn::EnvStep& io) override {
    for (int i = begin; i < end; ++i) {
      const auto k = std::size_t(i);
      const double u = control(0, io.actions[i]);
      const double th = th_[k], thdot = thdot_[k];
      io.rewards[i] = static_cast<float>(-(angle_normalize(th) * angle_normalize(th) + 0.1 * thdot * thdot + 0.001 * u * u));
      double next = thdot + (3 * kG / (2 * kL) * std::sin(th) + 3.0 / (kM * kL * kL) * u) * kDt;
      next = std::clamp(next, -kMaxSpeed, kMaxSpeed);
      th_[k] = th + next * kDt;
      thdot_[k] = next;
      const bool trunc = ++steps_[k] >= max_steps_;
      io.terminated[i] = 0;
      io.truncated[i] = trunc ? 1 : 0;
      write_obs(k, io.final_obs);
      if (trunc) start(k);
      write_obs(k, io.next_obs);
    }
  }

  void save(dqn::StateOut& out) const override {
    out.put("theta", th_);
    out.put("theta_dot", thdot_);
    out.put("episode_steps", steps_);
    out.put("rng", rng_);
  }

  void load(const dqn::StateIn& in) override {
    const std::vector<std::int64_t> n{num_envs()};
    auto th = in.get<double>("theta", n), thdot = in.get<double>("theta_dot", n);
    auto steps = in.get<std::int32_t>("episode_steps", n);
    auto rng = in.get<std::uint64_t>("rng", n);
    for (std::size_t i = 0; i < th.size(); ++i) {
      if (!std::isfinite(th[i]) || !std::isfinite(thdot[i]))
        in.refuse("Pendulum-v1 state in '" + std::string(in.source()) + "': copy " + std::to_string(i) +
                  " has a non-finite angle or speed");
      if (steps[i] < 0 || steps[i] >= max_steps_)
        in.refuse("Pendulum-v1 state in '" + std::string(in.source()) + "': tensor 'episode_steps' element " +
                  std::to_string(i) + " is " + std::to_string(steps[i]));
    }
    th_ = std::move(th);
    thdot_ = std::move(thdot);
    steps_ = std::move(steps);
    rng_ = std::move(rng);
  }

 private:
  void start(std::size_t i) {
    th_[i] = dqn::env_rng::uniform(rng_[i], -kPi, kPi);
    thdot_[i] = dqn::env_rng::uniform(rng_[i], -1.0, 1.0);
    steps_[i] = 0;
  }
  void write_obs(std::size_t i, float* obs) const {
    obs[3 * i] = static_cast<float>(std::cos(th_[i]));
    obs[3 * i + 1] = static_cast<float>(std::sin(th_[i]));
    obs[3 * i + 2] = static_cast<float>(thdot_[i]);
  }

  int max_steps_ = 200;
  std::vector<double> th_, thdot_;
  std::vector<std::int32_t> steps_;
  std::vector<std::uint64_t> rng_;
};

const dqn::ParamSchema kSchema[] = {
    {"bins", dqn::ParamType::integer, "5", "torques offered, evenly spaced over [-2, 2]", 2, 101},
    {"max_episode_steps", dqn::ParamType::integer, "200", "steps after which an episode is truncated", 1, 1e6},
};

const dqn::EnvDescriptor kTasks[] = {
    DQN_ENV_TASK(Pendulum, "Pendulum-v1", "swing a pendulum up and keep it there (Gym's classic control)", kSchema),
};

}  // namespace

DQN_ENV_PLUGIN("pendulum", "1.0.0", "Pendulum-v1, an environment plugin built outside the engine", kTasks)
