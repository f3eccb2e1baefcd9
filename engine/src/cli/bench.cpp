// dqn bench: device time per step from events over thousands of replays, median of repeats. With
// several devices, every rank steps on a batch of its own and rank 0's events time the group (the
// all-reduce couples the ranks), and the step's all-reduce is also timed alone.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench_common.hpp"
#include "commands.hpp"
#include "core/engine_access.hpp"
#include "pipeline/parse.hpp"
#include "core/plugin_loader.hpp"
#include "core/rank_group.hpp"

namespace dqn::cli {

namespace {
constexpr int kEnqueueBurst = 64;  ///< steps enqueued back to back to time the host side
}  // namespace

int cmd_bench(const BenchArgs& a) {
  PluginLoader loader(PluginLoader::search_path_from(a.common.plugin_path));
  PipelineSpec base;
  if (!load(a.common, a.pipeline, base)) return 1;
  std::vector<int> batches = a.batches.empty() ? std::vector<int>{base.batch} : a.batches;
  std::vector<std::string> precisions = a.precisions;
  if (precisions.empty()) precisions.push_back(to_string(base.precision));
  bool header_done = a.json;  // the table's header goes out with its first row, not before an error
  bool cpu_noted = a.json;     // JSON rows say their backend themselves
  for (const auto& prec : precisions) {
    for (int b : batches) {
      Common c = a.common;
      c.overrides.push_back("batch=" + std::to_string(b));
      c.overrides.push_back("precision=" + prec);
      c.overrides.push_back("report_every=1000000000");  // timing the step, not the report copy
      PipelineSpec spec;
      if (!load(c, a.pipeline, spec)) return 1;
      if (spec.training.replay.capacity < b) spec.training.replay.capacity = b;
      const BackendKind backend = resolve_backend(spec, std::nullopt);
      const std::vector<int> devices = rank_devices(spec, backend);
      const int R = int(devices.size());
      const std::shared_ptr<RankGroup> group = R > 1 ? make_rank_group(backend, devices) : nullptr;
      std::barrier together(R);  // the ranks start each timed stretch at once
      std::vector<double> device_us, host_us, reduce_us;  // rank 0's
      EngineFacts res;
      auto work = [&](int rank) {
        Engine e(spec, loader, EngineOptions::of_rank(group, rank));
        const bool first = rank == 0;
        if (first && e.backend() == BackendKind::cpu && !cpu_noted) {
          std::fprintf(stderr,
                       "note: timed on the CPU reference backend (no GPU backend in use): float arithmetic whatever "
                       "the precision column says, and host wall-clock time per step\n");
          cpu_noted = true;
        }
        init_weights(e, spec.seed);
        set_batch(e, HostBatch::random(spec, 1 + std::uint64_t(rank)));
        for (int i = 0; i < a.warmup; ++i) e.step();
        for (int r = 0; r < a.repeats; ++r) {
          e.runtime().synchronize();
          together.arrive_and_wait();
          // --profile-range: only the timed replays inside the profiler's range (not the capture,
          // the autotuning's thousands of launches or the warm-up)
          if (a.profile_range) e.runtime().profile_range(true);
          const double us = e.runtime().time_us([&] {
            for (int i = 0; i < a.iters; ++i) e.step();
          }) / a.iters;
          if (a.profile_range) e.runtime().profile_range(false);
          if (first) device_us.push_back(us);
          // Host time to enqueue a step, from an idle stream and a short burst: thousands of
          // launches in a row fill the launch queue, and then the host waits for the device.
          const int burst = std::min(a.iters, kEnqueueBurst);
          e.runtime().synchronize();
          together.arrive_and_wait();
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < burst; ++i) e.step();
          if (first)
            host_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                                  burst);
          e.runtime().synchronize();
          if (group) {  // the step's all-reduce alone, its buckets outside the graph
            together.arrive_and_wait();
            const double ar = e.runtime().time_us([&] {
              for (int i = 0; i < a.iters; ++i) e.parallel().all_reduce();
            }) / a.iters;
            if (first) reduce_us.push_back(ar);
          }
        }
        if (first) res = EngineFacts::of(e);
      };
      run_ranks(group.get(), work);
      const StepReport& rep = res.report;
      const double med = median(device_us);
      const double mn = *std::min_element(device_us.begin(), device_us.end());
      const double mx = *std::max_element(device_us.begin(), device_us.end());
      const double arena_mib = double(res.arena) / (1024.0 * 1024.0);
      const double samples = 1e6 / med * double(b) * R;
      const double reduce = group ? median(reduce_us) : 0.0;
      if (a.json) {
        nlohmann::json j{{"impl", "dqn"}, {"pipeline", spec.name}, {"backend", to_string(res.backend)},
                         {"precision", prec}, {"batch", b}, {"heads", res.heads},
                         {"us_per_step_median", med}, {"us_min", mn}, {"us_max", mx},
                         {"host_us_per_step", median(host_us)}, {"steps_per_s", 1e6 / med},
                         {"ranks", R}, {"devices", devices}, {"samples_per_s", samples},
                         {"allreduce_us", reduce}, {"collectives", group ? group->describe() : "none"},
                         {"iters", a.iters}, {"repeats", a.repeats}, {"warmup", a.warmup},
                         {"arena_bytes", res.arena}, {"peak_bytes", res.peak},
                         {"graph_nodes", res.nodes}, {"captures", res.captures},
                         {"skipped_steps", rep.skipped_steps}, {"loss_total", rep.total_loss},
                         {"device", res.runtime}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        if (!header_done)
          std::printf("%-10s %-6s %6s %5s %12s %12s %12s %10s %12s %12s %12s %8s\n", "pipeline", "prec", "batch",
                      "ranks", "device_us", "min_us", "host_us", "steps/s", "samples/s", "allreduce_us", "arena_MiB",
                      "nodes");
        header_done = true;
        std::printf("%-10s %-6s %6d %5d %12.2f %12.2f %12.2f %10.0f %12.0f %12.2f %12.2f %8lld\n", spec.name.c_str(),
                    prec.c_str(), b, R, med, mn, median(host_us), 1e6 / med, samples, reduce, arena_mib,
                    static_cast<long long>(res.nodes));
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace dqn::cli
