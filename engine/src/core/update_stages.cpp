/** @file update_stages.cpp
 *  @brief The update's buffers, its stage and its device constants (update_stages.hpp).
 */
#include "core/update_stages.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace dqn {

void UpdateStages::declare_buffers(StepBuild& b) {
  rt_ = &b.rt;
  heads_ = b.heads;
  const std::int64_t H = std::int64_t(b.heads.size());
  b.reg.declare(buf::step, DType::i64, {1}, BufferKind::optimizer, "engine");
  b.reg.declare("opt/lr", DType::real, {1}, BufferKind::optimizer, "engine");
  b.reg.declare("opt/fractions", DType::real, {H}, BufferKind::optimizer, "engine");
  b.reg.declare("opt/skip", DType::i32, {1}, BufferKind::scratch, "engine");
}

void UpdateStages::declare_after_heads(StepBuild& b) {
  if (!b.spec.spectral_norm.enabled) return;
  for (const auto& p : b.reg.params()) {
    if (!(p.flags & kParamSpectralNorm) || p.cols == 0) continue;
    // Only the trunk and the primary head are normed (docs/step-math.md: 2 + 2 + 2D matrices).
    if (p.owner != "engine" && p.owner != b.heads[b.primary]) continue;
    const std::string u = "sn.u." + p.name;
    b.reg.declare(u, DType::real, {p.rows}, BufferKind::optimizer, "engine");
    sn_params_.emplace_back(p.name, u);
    sn_max_rows_ = std::max(sn_max_rows_, p.rows);
    sn_max_cols_ = std::max(sn_max_cols_, p.cols);
  }
  const std::int64_t words = (std::int64_t(sn_params_.size()) * std::int64_t(sizeof(SpectralMatrix)) + 7) / 8;
  b.reg.declare("sn/table", DType::i64, {std::max<std::int64_t>(words, 1)}, BufferKind::optimizer, "engine");
}

// Budgets, Adam, spectral norm and the target update: one stage, one op.
void UpdateStages::add_back_stages(StepBuild& b) {
  std::vector<std::string> writes{"grad/total", "report/norms", "report/clips", "report/total_loss", "opt/skip",
                                  "report/skipped", "params", "adam.m", "adam.v", buf::step, "target"};
  for (const auto& [p, u] : sn_params_) writes.push_back(u);
  std::vector<std::string> reads{"grad/all", "opt/fractions", "report/losses", "opt/lr", "params", "target",
                                 "adam.m", "adam.v", buf::step};
  if (!sn_params_.empty()) reads.push_back("sn/table");
  reads.push_back("budget/reach");
  for (const auto& [p, u] : sn_params_) reads.push_back(u);
  b.stages.push_back(Stage{"update", "engine", reads, writes, [this](Backend&) { run(rt_->ops()); }, true});
  b.reg.declare("budget/reach", DType::i64, {std::int64_t(heads_.size()) * kBudgetReach * 2}, BufferKind::optimizer,
                "engine");
}

void UpdateStages::bind(StepBuild& b) {
  const Registry& reg = b.reg;
  const PipelineSpec& spec = b.spec;
  const std::int64_t P = reg.param_count();
  Budget& g = u_.budget;
  g.grads = reg.real("grad/all"); g.fractions = reg.real("opt/fractions"); g.norms = reg.real("report/norms");
  g.clips = reg.real("report/clips"); g.g = reg.real("grad/total"); g.losses = reg.real("report/losses");
  g.total_loss = reg.real("report/total_loss"); g.skip = reg.i32("opt/skip"); g.skipped = reg.i64("report/skipped");
  g.H = int(heads_.size()); g.P = P; g.max_grad_norm = float(spec.max_grad_norm);
  g.reach = reg.i64("budget/reach");
  Adam& a = u_.adam;
  a.params = reg.real("params"); a.g = g.g; a.m = reg.real("adam.m"); a.v = reg.real("adam.v"); a.P = P;
  a.t = reg.i64(buf::step); a.lr = reg.real("opt/lr"); a.beta1 = float(spec.adam.beta1);
  a.beta2 = float(spec.adam.beta2); a.eps = float(spec.adam.eps); a.skip = g.skip;
  for (const auto& [name, u] : sn_params_) sn_u_.push_back(reg.real(u));
  u_.sn_count = int(sn_params_.size());
  if (u_.sn_count > 0) u_.sn_mats = reinterpret_cast<SpectralMatrix*>(reg.i64("sn/table"));
  u_.sn_max_rows = sn_max_rows_; u_.sn_max_cols = sn_max_cols_; u_.sigma_max = float(spec.spectral_norm.sigma_max);
  TargetUpdate& t = u_.target;
  t.target = reg.real("target"); t.params = a.params; t.P = P;
  t.tau = float(spec.target.polyak); t.period = spec.target.period; t.t = a.t; t.skip = g.skip;
}

// The constants in device memory: the learning rate, the budgets' fractions, the spectral norm's
// table, and Budget::reach: head h's gradient row is written only where the stages say; the rest
// stays 0 from the arena's zero fill, so the norms need only these ranges. Merged into at most
// kBudgetReach ranges (closing the smallest gaps: zeros add nothing).
void UpdateStages::upload(StepBuild& b) {
  set_lr(b.spec.adam.lr);
  set_fractions(fractions_);
  EngineOps& ops = b.rt.ops();
  if (u_.sn_count > 0) {
    std::vector<SpectralMatrix> table;
    for (std::size_t i = 0; i < sn_params_.size(); ++i) {
      const auto* p = b.reg.find_param(sn_params_[i].first);
      table.push_back(SpectralMatrix{u_.adam.params + p->offset, sn_u_[i], p->rows, p->cols});
    }
    ops.upload(const_cast<SpectralMatrix*>(u_.sn_mats), table.data(), table.size() * sizeof(SpectralMatrix));
  }
  std::vector<std::int64_t> reach(heads_.size() * kBudgetReach * 2, 0);  // [H, kBudgetReach, 2]
  u_.budget.reach_max = 0;
  for (std::size_t h = 0; h < heads_.size(); ++h) {
    const auto m = merge_ranges(gradient_writes(b.stages, b.reg, heads_[h]), std::size_t(kBudgetReach));
    std::int64_t len = 0;
    for (std::size_t q = 0; q < m.size(); ++q) {
      reach[(h * kBudgetReach + q) * 2] = m[q].first;
      reach[(h * kBudgetReach + q) * 2 + 1] = m[q].second;
      len += m[q].second - m[q].first;
    }
    u_.budget.reach_max = std::max(u_.budget.reach_max, len);
  }
  ops.upload(const_cast<std::int64_t*>(u_.budget.reach), reach.data(), reach.size() * sizeof(std::int64_t));
}

void UpdateStages::run(EngineOps& ops) const { ops.update(u_); }

void UpdateStages::read_fractions() {
  std::vector<float> fr(fractions_.size());
  rt_->ops().download_reals(fr.data(), u_.budget.fractions, std::int64_t(fr.size()));
  rt_->synchronize();
  fractions_.assign(fr.begin(), fr.end());
}

void UpdateStages::set_fractions(const std::vector<double>& f) {
  if (f.size() != heads_.size())
    throw std::invalid_argument("set_fractions: " + std::to_string(f.size()) + " fractions for " +
                                std::to_string(heads_.size()) + " heads");
  double sum = 0.0;
  for (std::size_t h = 0; h < f.size(); ++h) {
    if (!(f[h] >= 0.0 && f[h] <= 1.0))
      throw std::invalid_argument("set_fraction: head " + std::to_string(h) + " (" + heads_[h] +
                                  "): a fraction must be in [0,1], got " + std::to_string(f[h]) +
                                  "; nothing was changed");
    sum += f[h];
  }
  // The budgets share max_grad_norm: the clipped gradients' norms add up to at most Σ f_h · G.
  if (sum > 1.0 + kFractionSlack) {
    std::ostringstream text;
    text << "set_fraction: the fractions would sum to " << sum << " (";
    for (std::size_t h = 0; h < f.size(); ++h) text << (h ? ", " : "") << heads_[h] << " " << f[h];
    text << "), more than 1: lower another head's first (or set them together with set_fractions); nothing "
            "was changed";
    throw std::invalid_argument(text.str());
  }
  std::vector<float> v(f.begin(), f.end());
  EngineBackend& be = rt_->ops();
  be.upload_reals(u_.budget.fractions, v.data(), std::int64_t(v.size()));
  if (be.status() != 0) throw std::runtime_error(std::string("set_fraction: ") + be.message());
  fractions_ = f;
}

void UpdateStages::set_fraction(std::size_t head, double f) {
  if (head >= fractions_.size()) throw std::out_of_range("set_fraction: no head " + std::to_string(head));
  std::vector<double> all = fractions_;
  all[head] = f;
  set_fractions(all);
}

void UpdateStages::set_lr(double lr) {
  if (!(lr > 0.0)) throw std::invalid_argument("set_lr: learning rate must be > 0");
  const float v = float(lr);
  EngineBackend& be = rt_->ops();
  be.upload_reals(u_.adam.lr, &v, 1);
  if (be.status() != 0) throw std::runtime_error(std::string("set_lr: ") + be.message());
}

std::vector<std::pair<std::int64_t, std::int64_t>> gradient_writes(const std::vector<Stage>& stages,
                                                                   const Registry& reg, const std::string& head) {
  const std::int64_t P = reg.param_count();
  const std::string g = "grad/" + head;
  std::vector<std::pair<std::int64_t, std::int64_t>> r;
  for (const auto& st : stages)
    for (const auto& w : st.writes) {
      if (w == g) {
        r.emplace_back(0, P);
      } else if (w.size() > g.size() + 1 && w.compare(0, g.size() + 1, g + "/") == 0) {
        if (const auto* p = reg.find_param(w.substr(g.size() + 1))) r.emplace_back(p->offset, p->offset + p->stored());
      }
    }
  return r;
}

}  // namespace dqn
