/** @file mujoco_reacher.cpp
 *  @brief The reacher task: a fingertip brought to a target in the plane.
 */
#include "mujoco_reacher.hpp"

#include <cmath>
#include <numbers>
#include <stdexcept>

namespace dqn_mujoco {
namespace {
constexpr int kRedraws = 100;
}  // namespace

Reacher::Reacher(const dqn::EnvCreateInfo& info) : MujocoEnv(info, shipped_reacher_model()) {
  const mjModel* m = model();
  tolerance_ = number_option("tolerance", 0.0, 10.0, true, "the fingertip's distance to the target that counts as reached (m)");
  control_cost_ = number_option("control_cost", 0.0, 1e6, false, "the weight of the squared controls in the reward");
  target_min_ = number_option("target_min", 0.0, 10.0, false, "the least distance of a target from the origin (m)");
  target_max_ = number_option("target_max", 0.0, 10.0, false, "the largest distance of a target from the origin (m)");
  if (target_min_ > target_max_)
    throw bad_option("target_min", text(target_min_),
                     "it is above target_max = " + text(target_max_) + "; targets are drawn between the two");
  fingertip_ = find(mjOBJ_SITE, "site", "fingertip");
  int obs_dim = m->nv + 4;
  for (int j = 0; j < m->njnt; ++j) {
    if (m->jnt_type[j] != mjJNT_HINGE && m->jnt_type[j] != mjJNT_SLIDE) {
      const char* name = mj_id2name(m, mjOBJ_JOINT, j);
      throw std::invalid_argument(task() + ": joint '" + (name ? name : std::to_string(j)) + "' of the MuJoCo model '" +
                                  model_path() + "' is a free or ball joint; the reacher observes hinge and slide joints only");
    }
    obs_dim += m->jnt_type[j] == mjJNT_HINGE ? 2 : 1;
  }
  // The fingertip is at most the sum of the offsets from the world to it away from the origin.
  double reach = std::sqrt(m->site_pos[3 * fingertip_] * m->site_pos[3 * fingertip_] +
                           m->site_pos[3 * fingertip_ + 1] * m->site_pos[3 * fingertip_ + 1] +
                           m->site_pos[3 * fingertip_ + 2] * m->site_pos[3 * fingertip_ + 2]);
  for (int b = m->site_bodyid[fingertip_]; b > 0; b = m->body_parentid[b])
    reach += std::sqrt(m->body_pos[3 * b] * m->body_pos[3 * b] + m->body_pos[3 * b + 1] * m->body_pos[3 * b + 1] +
                       m->body_pos[3 * b + 2] * m->body_pos[3 * b + 2]);
  double control = 0.0;
  for (int i = 0; i < m->nu; ++i) {
    const double lo = m->actuator_ctrlrange[2 * i], hi = m->actuator_ctrlrange[2 * i + 1];
    control += std::fmax(lo * lo, hi * hi);
  }
  worst_reward_ = -(reach + target_max_) - control_cost_ * control;
  finish(obs_dim, 2, true, info.seed);
}

void Reacher::randomize(Copy& k) {
  randomize_joints(k);
  const double angle = dqn::env_rng::uniform(k.rng, 0.0, 2.0 * std::numbers::pi);
  const double radius = dqn::env_rng::uniform(k.rng, target_min_, target_max_);
  k.task[0] = radius * std::cos(angle);
  k.task[1] = radius * std::sin(angle);
}

// An episode that would start reached is drawn again, a few times: with a tolerance near the
// arm's reach every draw may be reached.
bool Reacher::valid_start(const Copy& k, int attempt) const { return attempt >= kRedraws || distance(k) > tolerance_; }

double Reacher::distance(const Copy& k) const {
  const double* tip = k.data->site_xpos + 3 * fingertip_;
  return std::hypot(tip[0] - k.task[0], tip[1] - k.task[1]);
}

void Reacher::observe(const Copy& k, double* o) const {
  const mjModel* m = model();
  const mjData* d = k.data.get();
  for (int j = 0; j < m->njnt; ++j) {
    const double q = d->qpos[m->jnt_qposadr[j]];
    if (m->jnt_type[j] == mjJNT_HINGE) {
      *o++ = std::cos(q);
      *o++ = std::sin(q);
    } else {
      *o++ = q;
    }
  }
  for (int i = 0; i < m->nv; ++i) *o++ = d->qvel[i];
  const double* tip = d->site_xpos + 3 * fingertip_;
  *o++ = k.task[0];
  *o++ = k.task[1];
  *o++ = tip[0] - k.task[0];
  *o++ = tip[1] - k.task[1];
}

double Reacher::reward(const Copy& k) const {
  const mjData* d = k.data.get();
  double control = 0.0;
  for (int i = 0; i < model()->nu; ++i) control += d->ctrl[i] * d->ctrl[i];
  return -distance(k) - control_cost_ * control;
}

bool Reacher::succeeded(const Copy& k) const { return distance(k) <= tolerance_; }

}  // namespace dqn_mujoco
