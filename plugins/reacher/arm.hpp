/** @file arm.hpp
 *  @brief The planar N-link arm of the reacher task: kinematics and one integration step of its
 *  damped, torque-driven joints. Plain functions over one copy's arrays, so the environment's
 *  copies share nothing.
 */
#pragma once

#include <cmath>
#include <numbers>

namespace reacher {

/// Fixed physics (docs/environments.md, "reacher"). Each joint is a damped rotor: ω' = gain·u − damping·ω
/// with the control u in [−1, 1], so its speed follows max_speed·u within a few steps. A quick
/// response (rather than a heavy arm) keeps an action's effect close to its reward, which is what
/// lets a DQN learn the task in a few thousand steps.
inline constexpr double kDt = 0.05;           ///< seconds per step
inline constexpr double kDamping = 10.0;      ///< 1/s: a time constant of 0.1 s (2 steps)
inline constexpr double kMaxSpeed = 2.0;      ///< rad/s: the speed a held full control settles at
inline constexpr double kGain = kDamping * kMaxSpeed;  ///< rad/s² per unit of control
inline constexpr double kInitAngle = 0.1;     ///< rad: initial joint angles are uniform in ±this
inline constexpr int kMaxLinks = 16;

/// An angle wrapped into [−π, π).
inline double wrap_angle(double a) {
  constexpr double pi = std::numbers::pi, two_pi = 2.0 * std::numbers::pi;
  if (a >= -pi && a < pi) return a;
  a = std::fmod(a + pi, two_pi);
  if (a < 0.0) a += two_pi;
  return a - pi;
}

/// The joints' positions (x, y of joint j at [2j], [2j + 1]; joint 0 at the origin) and then the
/// fingertip's, [2·links], [2·links + 1], of an arm of `links` links, each 1/links long, with
/// relative joint angles q (joint 0's measured from the x axis): 2·(links + 1) values.
inline void joint_positions(const double* q, int links, double* xy) {
  const double len = 1.0 / links;
  double theta = 0.0, x = 0.0, y = 0.0;
  for (int j = 0; j < links; ++j) {
    xy[2 * j] = x;
    xy[2 * j + 1] = y;
    theta += q[j];
    x += len * std::cos(theta);
    y += len * std::sin(theta);
  }
  xy[2 * links] = x;
  xy[2 * links + 1] = y;
}

/// The fingertip alone.
inline void fingertip(const double* q, int links, double& x, double& y) {
  double xy[2 * (kMaxLinks + 1)];
  joint_positions(q, links, xy);
  x = xy[2 * links];
  y = xy[2 * links + 1];
}

/// One semi-implicit Euler step of joint j: the speed first, then the angle from the new speed.
inline void step_joint(double& q, double& w, double u) {
  w += kDt * (kGain * u - kDamping * w);
  q = wrap_angle(q + kDt * w);
}

}  // namespace reacher
