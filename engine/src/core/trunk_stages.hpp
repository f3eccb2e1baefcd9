/** @file trunk_stages.hpp
 *  @brief The shared trunk: its parameters, the online (2B rows: states ‖ next states) and target
 *  (B rows: next states) forward, one stage per online layer, and one backward for every head's
 *  gradient at once.
 */
#pragma once

#include <cstdint>
#include <vector>

#include "core/stage_provider.hpp"

namespace dqn {

class TrunkStages final : public StageProvider {
 public:
  void declare_params(StepBuild& b) override;
  void declare_buffers(StepBuild& b) override;
  void add_front_stages(StepBuild& b) override;
  void add_back_stages(StepBuild& b) override;
  void bind(StepBuild& b) override;
  /// Trunk layer i's forward, h_i = relu(W_i h_{i-1} + b_i), of the online network (on states2:
  /// 2B rows) or of the target (on the next states).
  Gemm layer_gemm(int i, bool target) const;

 private:
  void backward_layer(Backend& be, int i) const;
  void top_mask(Backend& be, int i) const;
  void bias_layer(Backend& be, int i) const;
  void weights_layer(Backend& be, int i) const;

  NetworkDims net_{};
  int B_ = 0, H_ = 0;
  std::int64_t P_ = 0;
  Real states2_;
  std::vector<Real> w_, b_, tw_, tb_;  ///< online and target weights and biases, per layer
  std::vector<Real> a_, ta_;           ///< online and target activations, per layer
  std::vector<Real> dz_;  ///< per layer its gradient [H·B, width], masked in place; the last is dtrunk/all
  std::vector<Real> gw_, gb_;  ///< per layer the first head's weight and bias gradient (the heads' rows P apart)
};

}  // namespace dqn
