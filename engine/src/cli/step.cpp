// dqn step: N training steps on one batch, then the step dump. With several devices (the
// pipeline's `devices`), the batch is the global one (batch × ranks rows): rank r steps on rows
// [r·batch, (r+1)·batch), the ranks average their gradients inside the step, and the dump holds
// rank 0's state (every rank's is the same) with the per-row outputs of every rank in row order.
#include <cstdio>
#include <limits>
#include <memory>

#include "commands.hpp"
#include "core/engine_access.hpp"
#include "core/plugin_loader.hpp"
#include "core/rank_group.hpp"
#include "core/safetensors.hpp"

namespace dqn::cli {

namespace {

/// What one rank brings back: its report and its per-row outputs (a head's per-step draws, a head's
/// last-step metrics), and from rank 0 the dump of the state.
struct RankOut {
  StepReport report;
  std::vector<std::vector<float>> draws;    ///< per draw buffer, every step's values in turn
  std::vector<std::vector<float>> metrics;  ///< per metric buffer, the last step's
  /// The draw and metric buffers (buffer, tensor), the same on every rank
  std::vector<std::pair<std::string, std::string>> draw_names, metric_names;
  st::File dump;
  std::string runtime;  ///< what the step ran on (Runtime::describe)
};

/// Rows of `per_rank` (each rank's [steps × rows × width] values, steps outermost) interleaved into
/// [steps × (ranks·rows) × width]: each step's rows in global row order.
std::vector<float> in_row_order(const std::vector<const std::vector<float>*>& per_rank, std::int64_t steps) {
  std::vector<float> out;
  for (std::int64_t s = 0; s < steps; ++s)
    for (const auto* v : per_rank) {
      const std::int64_t n = std::int64_t(v->size()) / steps;
      out.insert(out.end(), v->begin() + s * n, v->begin() + (s + 1) * n);
    }
  return out;
}

}  // namespace

int cmd_step(const StepArgs& a) {
  PluginLoader loader = make_loader(a.common);
  PipelineSpec spec;
  std::string resolved;
  if (!load_with(loader, a.common, a.pipeline, spec, &resolved)) return 1;
  if (a.print_pipeline) std::printf("%s", resolved.c_str());
  if (!a.batch.empty() && a.random_batch >= 0) {
    std::fprintf(stderr, "dqn step: give --batch or --random-batch, not both\n");
    return 2;
  }
  const BackendKind backend = resolve_backend(spec, std::nullopt);
  const std::vector<int> devices = rank_devices(spec, backend);
  const int R = int(devices.size());
  if (std::int64_t(spec.batch) * R > std::numeric_limits<int>::max())
    throw std::invalid_argument("batch × devices = " + std::to_string(std::int64_t(spec.batch) * R) +
                                " rows: more than a batch holds (2^31 - 1)");
  const std::shared_ptr<RankGroup> group = R > 1 ? make_rank_group(backend, devices) : nullptr;
  PipelineSpec global = spec;  // the batch of all ranks together
  global.batch = spec.batch * R;

  const bool want_steps = !a.out.empty() || !a.batch.empty() || a.random_batch >= 0;
  HostBatch batch;
  if (want_steps) {
    if (!a.batch.empty()) {
      batch = HostBatch::from_file(st::read_file(a.batch), a.batch);
      if (R > 1 && batch.B != global.batch)
        throw std::invalid_argument(a.batch + ": " + std::to_string(batch.B) + " rows; " + std::to_string(R) +
                                    " devices of batch " + std::to_string(spec.batch) + " step on " +
                                    std::to_string(global.batch));
    } else {
      batch = HostBatch::random(global, std::uint64_t(a.random_batch >= 0 ? a.random_batch : 1));
    }
    if (!a.save_batch.empty()) {
      st::File bf;
      batch.to_file(bf);
      st::write_file(a.save_batch, bf);
    }
  }

  std::vector<RankOut> outs(static_cast<std::size_t>(R));
  auto work = [&](int rank) {
    Engine engine(spec, loader, EngineOptions::of_rank(group, rank));
    const bool first = rank == 0;
    if (first && a.explain) std::printf("%s", explain(engine).c_str());
    if (!a.weights.empty()) {
      load_weights(engine, st::read_file(a.weights));
    } else {
      init_weights(engine, spec.seed);
    }
    if (first && !a.init.empty()) {
      st::write_file(a.init, save_weights(engine, false));
      std::printf("wrote initial weights to %s\n", a.init.c_str());
    }
    if (!want_steps) return;
    set_batch(engine, R == 1 ? batch : batch.rows(rank * spec.batch, spec.batch));
    // Per-step draws some heads make (IQN's τ, τ'), kept for the dump (docs/step-math.md, "Step
    // dump"), and per-row metrics of the last step.
    RankOut& out = outs[std::size_t(rank)];
    auto& draws = out.draw_names;
    auto& metrics = out.metric_names;
    for (const auto& h : engine.head_names()) {
      for (const char* t : {"tau", "tau_target"})
        if (engine.registry().find(h + "/" + t)) draws.emplace_back(h + "/" + t, h + "." + t);
      if (engine.registry().find(h + "/disagreement")) metrics.emplace_back(h + "/disagreement", h + ".disagreement");
    }
    for (int i = 0; i < a.steps; ++i) {
      engine.step();
      out.draws.resize(draws.size());
      for (std::size_t d = 0; d < draws.size(); ++d) {
        const auto v = host_buffer(engine, draws[d].first);
        out.draws[d].insert(out.draws[d].end(), v.begin(), v.end());
      }
    }
    out.report = engine.read_report();
    out.runtime = engine.runtime().describe();
    for (const auto& [buffer, tensor] : metrics) {
      const auto v = host_buffer(engine, buffer);
      out.metrics.emplace_back(v.begin(), v.end());
    }
    if (first && !a.out.empty()) out.dump = save_weights(engine, true);
  };
  run_ranks(group.get(), work);
  if (!want_steps) return 0;

  const StepReport& r = outs[0].report;
  const std::string ranks =
      R > 1 ? ", " + std::to_string(R) + " ranks of batch " + std::to_string(spec.batch) + " (" + group->describe() + ")" : "";
  std::printf("%d step%s on %s%s: total loss %.6g, skipped %lld, adam step %lld\n", a.steps, a.steps == 1 ? "" : "s",
              outs[0].runtime.c_str(), ranks.c_str(), r.total_loss, static_cast<long long>(r.skipped_steps),
              static_cast<long long>(r.adam_step));
  for (std::size_t h = 0; h < r.heads.size(); ++h)
    std::printf("  %-10s loss %.6g  grad norm %.6g  clip %.4g  budget %.3g\n", r.heads[h].c_str(), r.losses[h],
                r.grad_norms[h], r.clips[h], r.fractions[h]);
  if (a.out.empty()) return 0;
  st::File& dump = outs[0].dump;
  const auto& draws = outs[0].draw_names;
  const auto& metrics = outs[0].metric_names;
  auto gathered = [&](auto member, std::size_t d, std::int64_t steps) {
    std::vector<const std::vector<float>*> per_rank;
    for (const auto& o : outs) per_rank.push_back(&(o.*member)[d]);
    return in_row_order(per_rank, steps);
  };
  if (R > 1) {
    std::vector<float> td;
    for (const auto& o : outs) td.insert(td.end(), o.report.td_error.begin(), o.report.td_error.end());
    dump.put_f32("td_error", {std::int64_t(td.size())}, td.data());
  }
  for (std::size_t d = 0; d < draws.size(); ++d) {
    const auto v = gathered(&RankOut::draws, d, a.steps);
    const std::int64_t rows = global.batch, per_row = std::int64_t(v.size()) / (std::int64_t(a.steps) * rows);
    dump.put_f32(draws[d].second, {a.steps, rows, per_row}, v.data());
  }
  for (std::size_t m = 0; m < metrics.size(); ++m) {
    const auto v = gathered(&RankOut::metrics, m, 1);
    dump.put_f32(metrics[m].second, {std::int64_t(v.size())}, v.data());
  }
  st::write_file(a.out, dump);
  write_text(a.out + ".pipeline.yaml", resolved);
  std::printf("wrote %s (and %s.pipeline.yaml)\n", a.out.c_str(), a.out.c_str());
  return 0;
}

}  // namespace dqn::cli
