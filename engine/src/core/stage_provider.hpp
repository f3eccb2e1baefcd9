/** @file stage_provider.hpp
 *  @brief The engine's own parts of a step (the trunk, the update, …) as stage providers of the
 *  shape a head has: buffers and stages declared while the step is built, pointers bound once the
 *  arena is laid out, constants uploaded once, then the stages run.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/registry.hpp"
#include "core/runtime.hpp"
#include "core/scheduler.hpp"
#include "dqn/plugin.hpp"
#include "pipeline/spec.hpp"

namespace dqn {

/// What the engine hands its providers while it builds the step.
struct StepBuild {
  const PipelineSpec& spec;
  const NetworkDims& net;
  const std::vector<std::string>& heads;  ///< the enabled heads' instance names, in order
  std::size_t primary = 0;                ///< the primary head's index in heads
  Registry& reg;
  Runtime& rt;
  std::vector<Stage>& stages;  ///< the training step's stages, in declaration order
};

/// One internal part of the step. The engine calls each hook at a fixed point of the build, so
/// stages and buffers keep their declaration order (which the schedule and the arena follow).
class StageProvider {
 public:
  virtual ~StageProvider() = default;
  /// Before the heads are created: the parameters the part owns.
  virtual void declare_params(StepBuild&) {}
  /// Before the heads declare: buffers the pipeline's sizes alone give.
  virtual void declare_buffers(StepBuild&) {}
  /// Before the heads declare: stages that run before the heads' (the trunk's forward).
  virtual void add_front_stages(StepBuild&) {}
  /// After the heads declared, every parameter counted: buffers sized by the parameters.
  virtual void declare_after_heads(StepBuild&) {}
  /// After the heads' stages: the stages that follow them (backward, update).
  virtual void add_back_stages(StepBuild&) {}
  /// Once the arena is laid out: every pointer the part's stages use.
  virtual void bind(StepBuild&) {}
  /// After every part and head bound: the constants the stages read, uploaded once.
  virtual void upload(StepBuild&) {}
};

}  // namespace dqn
