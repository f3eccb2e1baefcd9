/** @file mujoco_humanoid.cpp
 *  @brief The humanoid tasks: dm_control's suite/humanoid.py over MuJoCo's humanoid.xml.
 */
#include "mujoco_humanoid.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "mujoco_tolerance.hpp"

namespace dqn_mujoco {
namespace {
constexpr double kStandHeight = 1.4;  // m, the head's height that counts as standing
constexpr int kRootQpos = 7;          // the free joint's position and quaternion
}  // namespace

Humanoid::Humanoid(const dqn::EnvCreateInfo& info, double speed) : MujocoEnv(info, ""), speed_(speed) {
  const mjModel* m = model();
  if (m->njnt < 1 || m->jnt_type[0] != mjJNT_FREE)
    throw std::invalid_argument(task() + ": the MuJoCo model '" + model_path() +
                                "' must have a free joint as its first joint (the torso's root), which the task "
                                "leaves out of the joint angles (option 'model')");
  torso_ = find(mjOBJ_BODY, "body", "torso");
  head_ = find(mjOBJ_BODY, "body", "head");
  const char* limbs[] = {"left_hand", "left_foot", "right_hand", "right_foot"};  // dm_control's order
  for (int i = 0; i < 4; ++i) extremities_[static_cast<std::size_t>(i)] = find(mjOBJ_BODY, "body", limbs[i]);
  const int obs_dim = (m->nq - kRootQpos) + 1 + 12 + 3 + 3 + m->nv;
  finish(obs_dim, 0, false, info.seed);
}

void Humanoid::randomize(Copy& k) { randomize_joints(k); }

// dm_control draws again while anything touches (penetrating = ncon > 0).
bool Humanoid::valid_start(const Copy& k, int) const { return k.data->ncon == 0; }

void Humanoid::observe(const Copy& k, double* o) const {
  const mjModel* m = model();
  const mjData* d = k.data.get();
  for (int i = kRootQpos; i < m->nq; ++i) *o++ = d->qpos[i];
  *o++ = d->xpos[3 * head_ + 2];
  const double* R = d->xmat + 9 * torso_;  // row-major: column j is the torso's axis j
  const double* p = d->xpos + 3 * torso_;
  for (int limb : extremities_) {
    const double v[3] = {d->xpos[3 * limb] - p[0], d->xpos[3 * limb + 1] - p[1], d->xpos[3 * limb + 2] - p[2]};
    for (int j = 0; j < 3; ++j) *o++ = v[0] * R[j] + v[1] * R[3 + j] + v[2] * R[6 + j];  // v · R: the torso's frame
  }
  for (int j = 0; j < 3; ++j) *o++ = R[6 + j];  // zx, zy, zz
  for (int j = 0; j < 3; ++j) *o++ = d->subtree_linvel[3 * torso_ + j];
  for (int i = 0; i < m->nv; ++i) *o++ = d->qvel[i];
}

double Humanoid::reward(const Copy& k) const {
  const mjModel* m = model();
  const mjData* d = k.data.get();
  constexpr double inf = std::numeric_limits<double>::infinity();
  const double standing = tolerance(d->xpos[3 * head_ + 2], kStandHeight, inf, kStandHeight / 4);
  const double upright = tolerance(d->xmat[9 * torso_ + 8], 0.9, inf, 1.9, Sigmoid::linear, 0.0);
  const double stand_reward = standing * upright;
  double control = 0.0;
  for (int i = 0; i < m->nu; ++i) control += tolerance(d->ctrl[i], 0.0, 0.0, 1.0, Sigmoid::quadratic, 0.0);
  const double small_control = (4.0 + control / m->nu) / 5.0;
  const double vx = d->subtree_linvel[3 * torso_], vy = d->subtree_linvel[3 * torso_ + 1];
  if (speed_ == 0.0) {
    const double dont_move = (tolerance(vx, 0.0, 0.0, 2.0) + tolerance(vy, 0.0, 0.0, 2.0)) / 2.0;
    return small_control * stand_reward * dont_move;
  }
  const double move = (5.0 * tolerance(std::sqrt(vx * vx + vy * vy), speed_, inf, speed_, Sigmoid::linear, 0.0) + 1.0) / 6.0;
  return small_control * stand_reward * move;
}

}  // namespace dqn_mujoco
