/** @file bench_common.hpp
 *  @brief What dqn bench's two modes (the step, the epoch) share: the median of repeats, and the
 *  facts of the engine that ran them (rank 0's) for the JSON rows.
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/engine.hpp"

namespace dqn::cli {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// An engine's facts once it has been timed (synchronises: its report is read).
struct EngineFacts {
  StepReport report;
  std::string runtime;
  std::size_t arena = 0, peak = 0;
  std::int64_t nodes = 0, captures = 0;
  std::vector<std::string> heads;
  BackendKind backend = BackendKind::cpu;

  static EngineFacts of(Engine& e) {
    EngineFacts f;
    f.report = e.read_report();
    f.runtime = e.runtime().describe();
    f.arena = e.registry().arena_bytes();
    f.peak = e.runtime().peak_bytes();
    f.nodes = e.runtime().graph_nodes();
    f.captures = e.captures();
    f.heads = e.head_names();
    f.backend = e.backend();
    return f;
  }
};

}  // namespace dqn::cli
