/** @file host_batch.hpp
 *  @brief A batch on the host: random batches for a pipeline's shapes, batch files, and the
 *  checks that name the tensor and index of bad data.
 */
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/safetensors.hpp"
#include "pipeline/spec.hpp"

namespace dqn {

/// One batch on the host (docs/step-math.md, "A batch is").
struct HostBatch {
  int B = 0, S = 0, D = 0;
  std::vector<float> states, next_states, rewards, dones, is_weights;
  std::vector<std::int32_t> actions;

  /// A reproducible random batch for a pipeline's shapes (states in [-1,1], ~10% dones,
  /// importance weights in [0.5, 1.5], rewards in [-1, 1]).
  static HostBatch random(const PipelineSpec& spec, std::uint64_t seed);
  static HostBatch from_file(const st::File& f, const std::string& what);
  /// Rows [first, first + n) (a rank's share of a global batch); throws std::out_of_range outside.
  HostBatch rows(int first, int n) const;
  void to_file(st::File& f) const;
  /// Throws std::invalid_argument naming the tensor when shapes or values don't fit the spec.
  void check(const PipelineSpec& spec, const std::string& what) const;
};

}  // namespace dqn
