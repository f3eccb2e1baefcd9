/** @file engine_ranks.cpp
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
#include <algorithm>
#include <stdexcept>

#include "core/engine.hpp"

namespace dqn {

void Engine::add_rank_stages() {
  const std::int64_t P = reg_.param_count();
  const std::int64_t H = std::int64_t(heads_.size());
  const int L = net_.trunk_layers;
  reg_.declare("ranks/order", DType::i32, {1}, BufferKind::scratch, "engine");
  struct Bucket {
    std::string name;
    std::vector<std::string> names;                         // the views it reads and writes
    std::vector<std::pair<std::int64_t, std::int64_t>> at;  // [begin, end) in grad/all
    bool losses = false;                                    // the heads' losses too
  };
  std::vector<Bucket> buckets;
  // The heads' own parameters: per head, those of its row that a stage writes.
  Bucket heads{"ranks.reduce.heads", {"report/losses"}, {}, true};
  for (std::int64_t h = 0; h < H; ++h) {
    const auto writes = gradient_writes(stages_, reg_, head_names_[std::size_t(h)]);
    std::vector<std::pair<std::int64_t, std::int64_t>> row;
    for (const auto& p : reg_.params()) {
      if (p.owner == "engine") continue;
      const std::int64_t lo = p.offset, hi = p.offset + p.stored();
      const bool written = std::any_of(writes.begin(), writes.end(), [&](const auto& w) { return w.first < hi && lo < w.second; });
      if (!written) continue;
      heads.names.push_back("grad/" + head_names_[std::size_t(h)] + "/" + p.name);
      row.emplace_back(lo, hi);
    }
    // One range a row, from the first parameter the head's gradient reaches to the last: what lies
    // between (alignment padding, another head's parameters it does not reach) is zero on every
    // rank, and one call a row keeps the group's launch small.
    for (const auto& r : merge_ranges(std::move(row), 1))
      heads.at.emplace_back(h * P + r.first, h * P + r.second);
  }
  buckets.push_back(std::move(heads));
  // Each trunk layer from the top: its weight and bias rows of every head (adjacent in the row).
  for (int i = L - 1; i >= 0; --i) {
    const std::string li = "trunk." + std::to_string(i);
    const auto* w = reg_.find_param(li + ".weight");
    const auto* b = reg_.find_param(li + ".bias");
    const std::int64_t lo = std::min(w->offset, b->offset);
    const std::int64_t hi = std::max(w->offset + w->stored(), b->offset + b->stored());
    Bucket t{"ranks.reduce." + li, {}, {}};
    for (std::int64_t h = 0; h < H; ++h) {
      t.names.push_back("grad/" + head_names_[std::size_t(h)] + "/" + li + ".weight");
      t.names.push_back("grad/" + head_names_[std::size_t(h)] + "/" + li + ".bias");
      t.at.emplace_back(h * P + lo, h * P + hi);
    }
    buckets.push_back(std::move(t));
  }

  buckets_.clear();
  for (auto& bk : buckets) {
    std::int64_t n = 0;
    for (const auto& [lo, hi] : bk.at) n += hi - lo;
    if (bk.losses) n += H;
    buckets_.emplace_back(bk.name, n);
    std::vector<std::string> writes = bk.names;
    writes.push_back("ranks/order");
    const bool with_losses = bk.losses;
    // The ranges' pointers are known once the arena is bound: made on the first run, kept (the CPU
    // runs the stage every step).
    stages_.push_back(Stage{bk.name, "engine", bk.names, writes,
                            [this, at = bk.at, with_losses, ranges = std::vector<RankGroup::Range>{}](Backend& be) mutable {
                              const DeviceContext* dc = be.device();
                              if (dc && dc->planning) return;  // sizing the step: nothing to reduce
                              if (ranges.empty()) {
                                for (const auto& [lo, hi] : at) ranges.push_back({(grad_all_ + lo).p, hi - lo});
                                if (with_losses) ranges.push_back({losses_.p, std::int64_t(heads_.size())});
                              }
                              opt_.group->all_reduce_mean(opt_.rank, ranges, reg_.real_size(), dc ? dc->stream : nullptr);
                            }});
  }
}

void Engine::all_reduce_gradients() {
  for (auto i : order_)
    if (stages_[i].name.rfind("ranks.reduce.", 0) == 0) stages_[i].run(rt_->ops());
}

void Engine::broadcast_state() {
  if (!opt_.group) return;
  rt_->synchronize();
  const DeviceContext* dc = rt_->ops().device();
  std::vector<std::string> names{"params", "target", "adam.m", "adam.v", buf::step};
  for (const auto& [p, u] : update_->normed()) names.push_back(u);
  for (const auto& name : names) {
    const auto* b = reg_.find(name);
    opt_.group->broadcast(opt_.rank, reg_.base() + b->offset_bytes, b->bytes, dc ? dc->stream : nullptr);
  }
}

}  // namespace dqn
