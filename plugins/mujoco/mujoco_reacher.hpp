/** @file mujoco_reacher.hpp
 *  @brief A planar reacher on MuJoCo (reacher.xml beside this file, or any model with a site
 *  "fingertip", hinge and slide joints and limited actuators): bring the fingertip to a target
 *  drawn in the plane each episode.
 */
#pragma once

#include "mujoco_env.hpp"

namespace dqn_mujoco {

/// Observation [cos and sin of each hinge joint's angle (a slide joint: its position), qvel,
/// target x y, fingertip − target x y]; reward −distance − control_cost · Σ ctrl²; terminated
/// with success when the fingertip is within `tolerance` of the target, truncated after
/// `episode_steps`. The target is drawn at a radius in [target_min, target_max] around the
/// world's origin, at a uniform angle.
class Reacher final : public MujocoEnv {
 public:
  explicit Reacher(const dqn::EnvCreateInfo& info);

 private:
  void randomize(Copy& k) override;
  bool valid_start(const Copy& k, int attempt) const override;
  void observe(const Copy& k, double* obs) const override;
  double reward(const Copy& k) const override;
  double unstable_reward() const override { return worst_reward_; }
  bool succeeded(const Copy& k) const override;

  double distance(const Copy& k) const;

  int fingertip_ = 0;
  double tolerance_ = 0, control_cost_ = 0, target_min_ = 0, target_max_ = 0;
  double worst_reward_ = 0;
};

}  // namespace dqn_mujoco
