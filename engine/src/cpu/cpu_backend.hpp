/** @file cpu_backend.hpp
 *  @brief The CPU reference backend (the op table and the engine's own ops): plain loops, accumulation in double, templated on the
 *  storage type (float for the reference step, double for gradient checks).
 */
#pragma once

#include <memory>

#include "core/engine_ops.hpp"

namespace dqn {

/// f64 = true stores every real as double (Real::esize 8); used by finite-difference checks.
std::unique_ptr<EngineBackend> make_cpu_backend(bool f64);

}  // namespace dqn
