/** @file scheduler.hpp
 *  @brief Orders the step's stages from what they read and write. Per-step buffers: every writer
 *  before any reader. Persistent state (parameters, optimizer state): declaration order, so the
 *  engine's update stages (declared last) run after every head has read the old values.
 */
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dqn/backend.hpp"

namespace dqn {

class Registry;

struct Stage {
  std::string name, owner;
  std::vector<std::string> reads, writes;
  std::function<void(Backend&)> run;
  bool update = false;  ///< budget/optimizer/target stages: skipped by Engine::forward_backward()
};

/// Returns the stages' indices in execution order. Throws std::invalid_argument when a stage
/// reads or writes an undeclared buffer, reads a per-step buffer that no stage writes (naming
/// both), or the dependencies form a cycle (naming it). Ties keep declaration order.
std::vector<std::size_t> schedule(const std::vector<Stage>& stages, const Registry& reg);

/// For each position k of `order`, the earlier positions whose stages touch an overlapping byte
/// range of the arena with at least one of the two writing it (read-after-write, write-after-read,
/// write-after-write): what stage order[k] must wait for when stages run concurrently.
std::vector<std::vector<std::size_t>> dependencies(const std::vector<Stage>& stages,
                                                   const std::vector<std::size_t>& order, const Registry& reg);

/// Where each stage of a step runs when the step is captured over `lanes` in-order streams:
/// lane[k] for position k of the order, and after[k] the earlier positions on other lanes it
/// waits for (per lane the newest of its dependencies there: a lane's stages finish in order).
struct LanePlan {
  std::vector<int> lane;
  std::vector<std::vector<std::size_t>> after;
  int used = 0;        ///< lanes that received a stage
  int false_deps = 0;  ///< stages placed behind a stage they do not depend on (too few lanes)
};

/// Places the stages (deps as dependencies() gives them) on lanes so that a stage waits only for
/// what it depends on: it continues a lane whose last stage is one of its ancestors (the lane of
/// its newest such ancestor first), else takes an unused lane; only when every lane is busy with
/// stages it does not depend on does it queue behind the lane that has been idle longest (counted
/// in false_deps).
LanePlan plan_lanes(const std::vector<std::vector<std::size_t>>& deps, int lanes);

/// One line per stage in order: "  3. c51.loss  <c51>  reads: …  writes: …"; with deps (as
/// dependencies() gives them), also the stages each one waits for ("waits:  …").
std::string explain(const std::vector<Stage>& stages, const std::vector<std::size_t>& order,
                    const std::vector<std::vector<std::size_t>>* deps = nullptr);

}  // namespace dqn
