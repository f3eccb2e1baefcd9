// dqn bench --epoch: the time of an epoch of training steps that draw their batches from a full
// replay on the device (uniform and prioritised), beside the bare step on a fixed batch; CUDA
// events around each whole epoch, median of repeats. With several devices each rank draws from a
// replay of its own.
#include <algorithm>
#include <barrier>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "commands.hpp"
#include "core/engine_access.hpp"
#include "core/plugin_loader.hpp"
#include "core/rank_group.hpp"
#include "pipeline/parse.hpp"

namespace dqn::cli {


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
        const BackendKind backend = resolve_backend(spec, std::nullopt);
        const std::vector<int> devices = rank_devices(spec, backend);
        const int R = int(devices.size());
        const std::shared_ptr<RankGroup> group = R > 1 ? make_rank_group(backend, devices) : nullptr;
        std::barrier together(R);  // the ranks start each timed epoch at once
        std::vector<double> epoch_us;  // rank 0's
        std::int64_t size = 0;
        EngineFacts res;
        // Each rank fills a replay of its own (seeded per rank) and draws from it; rank 0's events
        // time the group (the all-reduce couples the ranks).
        auto work = [&](int rank) {
          EngineOptions ro = eo;
          ro.group = group;
          ro.rank = rank;
          Engine e(spec, loader, ro);
          init_weights(e, spec.seed);
          if (replay)
            fill_replay_random(e, ro.replay->spec.capacity);
          else
            set_batch(e, HostBatch::random(spec, 1 + std::uint64_t(rank)));
          for (int i = 0; i < a.warmup; ++i) e.step();
          for (int r = 0; r < a.repeats; ++r) {
            e.runtime().synchronize();
            together.arrive_and_wait();
            const double us = e.runtime().time_us([&] {
              for (int i = 0; i < a.epoch_steps; ++i) e.step();
            });
            if (rank == 0) epoch_us.push_back(us);
          }
          if (rank != 0) return;
          res = EngineFacts::of(e);
          size = replay ? e.replay().state().size : 0;
        };
        run_ranks(group.get(), work);
        const StepReport& rep = res.report;
        const double med = median(epoch_us), per_step = med / a.epoch_steps;
        if (a.json) {
          nlohmann::json j{{"impl", "dqn"}, {"mode", "epoch"}, {"pipeline", spec.name},
                           {"backend", to_string(res.backend)}, {"precision", prec}, {"batch", b},
                           {"heads", res.heads}, {"replay", kind}, {"replay_size", size},
                           {"ranks", R}, {"devices", devices}, {"samples_per_s", 1e6 / per_step * double(b) * R},
                           {"epoch_steps", a.epoch_steps}, {"epoch_s", med * 1e-6},
                           {"us_per_step_median", per_step},
                           {"us_min", *std::min_element(epoch_us.begin(), epoch_us.end()) / a.epoch_steps},
                           {"us_max", *std::max_element(epoch_us.begin(), epoch_us.end()) / a.epoch_steps},
                           {"steps_per_s", 1e6 / per_step}, {"repeats", a.repeats}, {"warmup", a.warmup},
                           {"arena_bytes", res.arena}, {"graph_nodes", res.nodes},
                           {"skipped_steps", rep.skipped_steps}, {"loss_total", rep.total_loss},
                           {"device", res.runtime}};
          std::printf("%s\n", j.dump().c_str());
        } else {
          if (!header_done)
            std::printf("%-10s %-6s %6s %5s %-12s %10s %8s %10s %12s %10s\n", "pipeline", "prec", "batch", "ranks",
                        "replay", "size", "steps", "epoch_s", "us/step", "steps/s");
          header_done = true;
          std::printf("%-10s %-6s %6d %5d %-12s %10lld %8d %10.4f %12.2f %10.0f\n", spec.name.c_str(), prec.c_str(), b,
                      R, kind.c_str(), static_cast<long long>(size), a.epoch_steps, med * 1e-6, per_step,
                      1e6 / per_step);
        }
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace dqn::cli
