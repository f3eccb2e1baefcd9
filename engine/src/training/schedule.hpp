/** @file schedule.hpp
 *  @brief Linear annealing (ε for exploration, β for prioritized-replay IS weights).
 */
#pragma once

#include <cstdint>

namespace dqn {

/// start at t <= 0, end at t >= duration, linear in between. duration <= 0 means "already
/// annealed": end for every t.
inline double linear_schedule(double start, double end, std::int64_t duration, std::int64_t t) {
  if (duration <= 0 || t >= duration) return end;
  if (t <= 0) return start;
  const double frac = static_cast<double>(t) / static_cast<double>(duration);
  return start + frac * (end - start);
}

}  // namespace dqn
