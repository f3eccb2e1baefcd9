// dqn bench --epoch: the time of an epoch of training steps that draw their batches from a full
// replay on the device (uniform and prioritised), beside the bare step on a fixed batch; CUDA
// events around each whole epoch, median of repeats.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/engine.hpp"
#include "core/plugin_loader.hpp"
#include "pipeline/parse.hpp"

namespace dqn::cli {

namespace {


double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int cmd_bench_epoch(const BenchArgs& a) {
  PluginLoader loader(PluginLoader::search_path_from(a.common.plugin_path));
  PipelineSpec base;
  if (!load(a.common, a.pipeline, base)) return 1;
  std::vector<std::string> kinds{"none"};
  for (const auto& k : a.replays.empty() ? std::vector<std::string>{"uniform", "prioritized"} : a.replays) {
    if (k != "uniform" && k != "prioritized") {
      std::fprintf(stderr, "dqn bench: --replay: '%s' is not a replay kind (uniform, prioritized)\n", k.c_str());
      return 2;
    }
    kinds.push_back(k);
  }
  std::vector<int> batches = a.batches.empty() ? std::vector<int>{base.batch} : a.batches;
  std::vector<std::string> precisions = a.precisions;
  if (precisions.empty()) precisions.push_back(to_string(base.precision));
  bool header_done = a.json;
  for (const auto& prec : precisions) {
    for (int b : batches) {
      for (const auto& kind : kinds) {
        Common c = a.common;
        c.overrides.push_back("batch=" + std::to_string(b));
        c.overrides.push_back("precision=" + prec);
        c.overrides.push_back("report_every=1000000000");
        PipelineSpec spec;
        if (!load(c, a.pipeline, spec)) return 1;
        require_one_device(spec, "dqn bench --epoch");
        EngineOptions eo;
        const bool replay = kind != "none";
        if (replay) {
          EngineReplay r;
          r.spec = spec.training.replay;
          r.spec.capacity = std::max<std::int64_t>(a.replay_size, b);
          r.spec.prioritized = kind == "prioritized";
          r.beta_steps = r.spec.capacity;  // the fill's env steps: β at beta_end from there on
          r.staging_rows = int(std::min<std::int64_t>(kReplayFillChunk, r.spec.capacity));
          eo.replay = r;
        }
        Engine e(spec, loader, eo);
        e.init_weights(spec.seed);
        if (replay)
          fill_replay_random(e, eo.replay->spec.capacity);
        else
          e.set_batch(HostBatch::random(spec, 1));
        for (int i = 0; i < a.warmup; ++i) e.step();
        std::vector<double> epoch_us;
        for (int r = 0; r < a.repeats; ++r)
          epoch_us.push_back(e.runtime().time_us([&] {
            for (int i = 0; i < a.epoch_steps; ++i) e.step();
          }));
        const StepReport rep = e.read_report();
        const double med = median(epoch_us), per_step = med / a.epoch_steps;
        const std::int64_t size = replay ? e.replay_state().size : 0;
        if (a.json) {
          nlohmann::json j{{"impl", "dqn"}, {"mode", "epoch"}, {"pipeline", spec.name},
                           {"backend", to_string(e.backend())}, {"precision", prec}, {"batch", b},
                           {"heads", e.head_names()}, {"replay", kind}, {"replay_size", size},
                           {"epoch_steps", a.epoch_steps}, {"epoch_s", med * 1e-6},
                           {"us_per_step_median", per_step},
                           {"us_min", *std::min_element(epoch_us.begin(), epoch_us.end()) / a.epoch_steps},
                           {"us_max", *std::max_element(epoch_us.begin(), epoch_us.end()) / a.epoch_steps},
                           {"steps_per_s", 1e6 / per_step}, {"repeats", a.repeats}, {"warmup", a.warmup},
                           {"arena_bytes", e.registry().arena_bytes()}, {"graph_nodes", e.graph_nodes()},
                           {"skipped_steps", rep.skipped_steps}, {"loss_total", rep.total_loss},
                           {"device", e.runtime().describe()}};
          std::printf("%s\n", j.dump().c_str());
        } else {
          if (!header_done)
            std::printf("%-10s %-6s %6s %-12s %10s %8s %10s %12s %10s\n", "pipeline", "prec", "batch", "replay",
                        "size", "steps", "epoch_s", "us/step", "steps/s");
          header_done = true;
          std::printf("%-10s %-6s %6d %-12s %10lld %8d %10.4f %12.2f %10.0f\n", spec.name.c_str(), prec.c_str(), b,
                      kind.c_str(), static_cast<long long>(size), a.epoch_steps, med * 1e-6, per_step, 1e6 / per_step);
        }
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace dqn::cli
