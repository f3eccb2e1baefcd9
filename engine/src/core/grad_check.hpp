/** @file grad_check.hpp
 *  @brief Finite-difference check of a head's gradients on the f64 CPU reference: for every
 *  parameter tensor, the head's ∂L_h/∂θ (its row of grad/all) against central differences of its
 *  loss at a sample of entries; a tensor the head does not reach must get an exactly zero gradient
 *  and no finite-difference change. What `dqn check-head` runs and the numeric tests assert.
 */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/engine_access.hpp"

namespace dqn {

struct GradCheckOptions {
  int samples = 6;         ///< entries per tensor: the first, the middle, the last, and random ones
  double eps = 1e-6;       ///< central-difference step
  double rtol = 1e-5;      ///< |fd − analytic| <= atol + rtol · max(|fd|, the tensor's largest |analytic|)
  double atol = 1e-7;
  std::uint64_t seed = 11;  ///< which random entries
};

/// One parameter tensor of one head.
struct GradCheckRow {
  std::string head, param;
  bool reaches = false;      ///< the head's gradient is non-zero somewhere in the tensor
  int checked = 0;           ///< entries compared
  double max_abs_err = 0;    ///< largest |fd − analytic| over them
  double scale = 0;          ///< the tensor's largest |analytic|
  double worst_fd = 0, worst_analytic = 0;  ///< at the worst entry
  std::int64_t worst_index = -1;
  bool ok = true;
};

/// Checks head `head` of e, which must run on the CPU backend in f64 (EngineOptions::f64): one row
/// per parameter tensor, in the registry's order. Leaves e's parameters as they were. Throws
/// std::invalid_argument for another engine or an unknown head.
std::vector<GradCheckRow> check_head_gradients(Engine& e, const std::string& head, const GradCheckOptions& opt = {});

}  // namespace dqn
