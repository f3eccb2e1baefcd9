/** @file mujoco_tolerance.hpp
 *  @brief The Control Suite's shaped reward, dm_control's rewards.tolerance, for the sigmoids the
 *  humanoid uses (gaussian, linear, quadratic): 1 inside [lower, upper], falling off outside with
 *  the distance in units of `margin` so that it is `value_at_margin` one margin away.
 */
#pragma once

#include <cmath>

namespace dqn_mujoco {

enum class Sigmoid { gaussian, linear, quadratic };

/// dm_control's _sigmoids(x, value_at_1, sigmoid) for x >= 0: value_at_1 where x is 1.
inline double sigmoid(double x, double value_at_1, Sigmoid kind) {
  switch (kind) {
    case Sigmoid::gaussian: {
      const double scale = std::sqrt(-2.0 * std::log(value_at_1));
      return std::exp(-0.5 * (x * scale) * (x * scale));
    }
    case Sigmoid::linear: {
      const double scaled = x * (1.0 - value_at_1);
      return std::fabs(scaled) < 1.0 ? 1.0 - scaled : 0.0;
    }
    case Sigmoid::quadratic: {
      const double scaled = x * std::sqrt(1.0 - value_at_1);
      return std::fabs(scaled) < 1.0 ? 1.0 - scaled * scaled : 0.0;
    }
  }
  return 0.0;
}

/// dm_control's tolerance(x, bounds=(lower, upper), margin, sigmoid, value_at_margin); its
/// defaults are the gaussian and 0.1. A margin of 0 gives 1 inside the bounds and 0 outside.
inline double tolerance(double x, double lower, double upper, double margin, Sigmoid kind = Sigmoid::gaussian,
                        double value_at_margin = 0.1) {
  if (lower <= x && x <= upper) return 1.0;
  if (margin == 0.0) return 0.0;
  const double d = (x < lower ? lower - x : x - upper) / margin;
  return sigmoid(d, value_at_margin, kind);
}

}  // namespace dqn_mujoco
