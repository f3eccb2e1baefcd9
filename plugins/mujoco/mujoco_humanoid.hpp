/** @file mujoco_humanoid.hpp
 *  @brief The Control Suite's humanoid tasks on MuJoCo's humanoid model: stand, walk (1 m/s) and
 *  run (10 m/s), with dm_control's observations, rewards and random initial pose.
 */
#pragma once

#include <array>

#include "mujoco_env.hpp"

namespace dqn_mujoco {

/// dm_control's suite/humanoid.py: observation [joint angles qpos[7:], head height, extremities
/// (left hand, left foot, right hand, right foot in the torso's frame), the torso's z axis in the
/// world frame, centre-of-mass velocity, qvel]; reward small_control * standing * upright * (not
/// moving | moving at `speed`); episodes of 1,000 steps of 25 ms, truncated, never terminated.
class Humanoid : public MujocoEnv {
 public:
  Humanoid(const dqn::EnvCreateInfo& info, double speed);

 private:
  void randomize(Copy& k) override;
  bool valid_start(const Copy& k, int attempt) const override;
  void observe(const Copy& k, double* obs) const override;
  double reward(const Copy& k) const override;
  double unstable_reward() const override { return 0.0; }
  bool succeeded(const Copy&) const override { return false; }

  double speed_;  // 0: stand still
  int torso_ = 0, head_ = 0;
  std::array<int, 4> extremities_{};
};

struct HumanoidStand final : Humanoid {
  explicit HumanoidStand(const dqn::EnvCreateInfo& info) : Humanoid(info, 0.0) {}
};
struct HumanoidWalk final : Humanoid {
  explicit HumanoidWalk(const dqn::EnvCreateInfo& info) : Humanoid(info, 1.0) {}
};
struct HumanoidRun final : Humanoid {
  explicit HumanoidRun(const dqn::EnvCreateInfo& info) : Humanoid(info, 10.0) {}
};

}  // namespace dqn_mujoco
