/** @file rank_stages.cpp
 *  @brief Data parallel (EngineOptions::group): the gradient all-reduce inside the step and the
 *  broadcast of the state that must start identical.
 *
 *  Each rank computes every head's gradient row on its own batch; the rows are averaged over the
 *  ranks before the budgets, so the norms, clips, skip decision, Adam, spectral norm and target
 *  update see the gradient of the global batch, exactly as one rank stepping on all of it would
 *  (up to the order of float sums), and every rank's update is the same computation on the same
 *  numbers: the parameters stay bit-identical. (Averaging after each rank's clip would make the
 *  clip depend on how the batch is split, and would split the fused update in two.)
 *
 *  The average runs in buckets that follow the backward: first every head's rows over the heads'
 *  own parameters (written by the heads' stages, before the trunk backward runs), then each trunk
 *  layer's rows from the top, each as soon as that layer's weight and bias gradients are written,
 *  while the layers below are still being computed. The buckets form a chain (each writes
 *  ranks/order) so one collective runs at a time, in the same order on every rank.
 */
#include "core/rank_stages.hpp"

#include <algorithm>
#include <stdexcept>

namespace dqn {

void RankStages::add_back_stages(StepBuild& b) {
  if (!group_) return;
  Registry& reg = b.reg;
  const std::vector<std::string>& names = b.heads;
  const std::int64_t P = reg.param_count();
  const std::int64_t H = std::int64_t(names.size());
  const int L = b.net.trunk_layers;
  reg.declare("ranks/order", DType::i32, {1}, BufferKind::scratch, "engine");
  struct Decl {
    std::string name;
    std::vector<std::string> views;  // the views it reads and writes
    Bucket bucket;
  };
  std::vector<Decl> decls;
  // The heads' own parameters: per head, those of its row that a stage writes.
  Decl heads{"ranks.reduce.heads", {"report/losses"}, {{}, true, {}}};
  for (std::int64_t h = 0; h < H; ++h) {
    const auto writes = gradient_writes(b.stages, reg, names[std::size_t(h)]);
    std::vector<std::pair<std::int64_t, std::int64_t>> row;
    for (const auto& p : reg.params()) {
      if (p.owner == "engine") continue;
      const std::int64_t lo = p.offset, hi = p.offset + p.stored();
      const bool written = std::any_of(writes.begin(), writes.end(), [&](const auto& w) { return w.first < hi && lo < w.second; });
      if (!written) continue;
      heads.views.push_back("grad/" + names[std::size_t(h)] + "/" + p.name);
      row.emplace_back(lo, hi);
    }
    // One range a row, from the first parameter the head's gradient reaches to the last: what lies
    // between (alignment padding, another head's parameters it does not reach) is zero on every
    // rank, and one call a row keeps the group's launch small.
    for (const auto& r : merge_ranges(std::move(row), 1))
      heads.bucket.at.emplace_back(h * P + r.first, h * P + r.second);
  }
  decls.push_back(std::move(heads));
  // Each trunk layer from the top: its weight and bias rows of every head (adjacent in the row).
  for (int i = L - 1; i >= 0; --i) {
    const std::string li = "trunk." + std::to_string(i);
    const auto* w = reg.find_param(li + ".weight");
    const auto* bias = reg.find_param(li + ".bias");
    const std::int64_t lo = std::min(w->offset, bias->offset);
    const std::int64_t hi = std::max(w->offset + w->stored(), bias->offset + bias->stored());
    Decl t{"ranks.reduce." + li, {}, {}};
    for (std::int64_t h = 0; h < H; ++h) {
      t.views.push_back("grad/" + names[std::size_t(h)] + "/" + li + ".weight");
      t.views.push_back("grad/" + names[std::size_t(h)] + "/" + li + ".bias");
      t.bucket.at.emplace_back(h * P + lo, h * P + hi);
    }
    decls.push_back(std::move(t));
  }

  for (auto& d : decls) {
    std::int64_t n = 0;
    for (const auto& [lo, hi] : d.bucket.at) n += hi - lo;
    if (d.bucket.losses) n += H;
    sizes_.emplace_back(d.name, n);
    std::vector<std::string> writes = d.views;
    writes.push_back("ranks/order");
    const std::size_t k = buckets_.size();
    buckets_.push_back(std::move(d.bucket));
    b.stages.push_back(Stage{d.name, "engine", d.views, writes, [this, k](Backend& be) { reduce(k, be); }});
  }
}

void RankStages::bind(StepBuild& b) {
  rt_ = &b.rt;
  const Registry& reg = b.reg;
  real_size_ = reg.real_size();
  if (!group_) return;
  const Real grad_all = reg.real("grad/all");
  const Real losses = reg.real("report/losses");
  for (Bucket& bk : buckets_) {
    for (const auto& [lo, hi] : bk.at) bk.ranges.push_back({(grad_all + lo).p, hi - lo});
    if (bk.losses) bk.ranges.push_back({losses.p, std::int64_t(b.heads.size())});
  }
  std::vector<std::string> names{"params", "target", "adam.m", "adam.v", buf::step};
  for (const auto& [p, u] : update_.normed()) names.push_back(u);
  for (const auto& name : names) state_.emplace_back(reg.raw(name), reg.find(name)->bytes);
}

void RankStages::reduce(std::size_t k, Backend& be) {
  const DeviceContext* dc = be.device();
  if (dc && dc->planning) return;  // sizing the step: nothing to reduce
  group_->all_reduce_mean(rank_, buckets_[k].ranges, real_size_, dc ? dc->stream : nullptr);
}

void RankStages::all_reduce() {
  for (std::size_t k = 0; k < buckets_.size(); ++k) reduce(k, rt_->ops());
}

void RankStages::broadcast() {
  if (!group_) return;
  rt_->synchronize();
  const DeviceContext* dc = rt_->ops().device();
  for (const auto& [p, bytes] : state_) group_->broadcast(rank_, p, bytes, dc ? dc->stream : nullptr);
}

}  // namespace dqn
