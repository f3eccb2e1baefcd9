/** @file update_stages.hpp
 *  @brief Everything after the gradients (docs/step-math.md, "Gradient budgets", "Optimizer,
 *  spectral norm, target"): the budgets' fractions and the learning rate in device memory, the
 *  spectral norm's vectors and table, and the one update stage (a backend may fuse it; the CUDA
 *  backend runs it as thread-block clusters).
 */
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/stage_provider.hpp"

namespace dqn {

class UpdateStages final : public StageProvider {
 public:
  void declare_buffers(StepBuild& b) override;
  void declare_after_heads(StepBuild& b) override;
  void add_back_stages(StepBuild& b) override;
  void bind(StepBuild& b) override;
  void upload(StepBuild& b) override;

  /// Budget fractions and learning rate live in device memory: changed here, read by the next
  /// replay, no re-capture. Each fraction lies in [0, 1] and together they sum to at most 1 (the
  /// budgets share max_grad_norm); a change that breaks either throws std::invalid_argument and
  /// changes nothing. set_fractions changes every head's at once (moving budget between heads).
  void set_fractions(const std::vector<double>& f);
  void set_fraction(std::size_t head, double f);
  void set_lr(double lr);
  const std::vector<double>& fractions() const { return fractions_; }
  /// Takes the fractions as device memory holds them (after a checkpoint wrote it; synchronises).
  void read_fractions();
  /// How far above 1 the fractions' sum may round (0.98 + 0.02 and the like).
  static constexpr double kFractionSlack = 1e-9;
  /// The spectrally normed parameters, each with its power-iteration vector's buffer.
  const std::vector<std::pair<std::string, std::string>>& normed() const { return sn_params_; }
  /// Their vectors' memory, in the same order (resolved at bind).
  const std::vector<Real>& normed_vectors() const { return sn_u_; }

  /// The budgets each head starts with (before the build).
  explicit UpdateStages(std::vector<double> fractions) : fractions_(std::move(fractions)) {}

 private:
  void run(EngineOps& ops) const;

  Runtime* rt_ = nullptr;
  std::vector<std::string> heads_;
  std::vector<double> fractions_;
  std::vector<std::pair<std::string, std::string>> sn_params_;  ///< parameter, u buffer
  std::vector<Real> sn_u_;
  int sn_max_rows_ = 0, sn_max_cols_ = 0;
  Update u_;                         ///< the update's arguments, resolved at bind
};

/// Where head `head`'s gradient row is written, as the stages declare it ("grad/<head>" whole, or
/// "grad/<head>/<param>"): [begin, end) in the row.
std::vector<std::pair<std::int64_t, std::int64_t>> gradient_writes(const std::vector<Stage>& stages,
                                                                   const Registry& reg, const std::string& head);

}  // namespace dqn
