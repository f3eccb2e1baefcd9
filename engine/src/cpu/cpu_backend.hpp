/** @file cpu_backend.hpp
 *  @brief The CPU reference op table: plain loops, accumulation in double, templated on the
 *  storage type (float for the reference step, double for gradient checks).
 */
#pragma once

#include <memory>

#include "dqn/backend.hpp"

namespace dqn {

/// f64 = true stores every real as double (Real::esize 8); used by finite-difference checks.
std::unique_ptr<Backend> make_cpu_backend(bool f64);

}  // namespace dqn
