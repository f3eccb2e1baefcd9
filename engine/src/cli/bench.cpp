// dqn bench: device time per step from events over thousands of replays, median of repeats.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "core/engine.hpp"
#include "pipeline/parse.hpp"
#include "core/plugin_loader.hpp"

namespace dqn::cli {

namespace {
constexpr int kEnqueueBurst = 64;  ///< steps enqueued back to back to time the host side

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
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
      Engine e(spec, loader);
      if (e.backend() == BackendKind::cpu && !cpu_noted) {
        std::fprintf(stderr,
                     "note: timed on the CPU reference backend (no GPU backend in use): float arithmetic whatever "
                     "the precision column says, and host wall-clock time per step\n");
        cpu_noted = true;
      }
      e.init_weights(spec.seed);
      e.set_batch(HostBatch::random(spec, 1));
      for (int i = 0; i < a.warmup; ++i) e.step();
      std::vector<double> device_us, host_us;
      for (int r = 0; r < a.repeats; ++r) {
        // --profile-range: only the timed replays inside the profiler's range (not the capture,
        // the autotuning's thousands of launches or the warm-up)
        if (a.profile_range) e.runtime().profile_range(true);
        device_us.push_back(e.runtime().time_us([&] {
          for (int i = 0; i < a.iters; ++i) e.step();
        }) / a.iters);
        if (a.profile_range) e.runtime().profile_range(false);
        // Host time to enqueue a step, from an idle stream and a short burst: thousands of
        // launches in a row fill the launch queue, and then the host waits for the device.
        const int burst = std::min(a.iters, kEnqueueBurst);
        e.runtime().synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < burst; ++i) e.step();
        host_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                          burst);
        e.runtime().synchronize();
      }
      const StepReport rep = e.read_report();
      const double med = median(device_us);
      const double mn = *std::min_element(device_us.begin(), device_us.end());
      const double mx = *std::max_element(device_us.begin(), device_us.end());
      const double arena_mib = double(e.registry().arena_bytes()) / (1024.0 * 1024.0);
      if (a.json) {
        nlohmann::json j{{"impl", "dqn"}, {"pipeline", spec.name}, {"backend", to_string(e.backend())},
                         {"precision", prec}, {"batch", b}, {"heads", e.head_names()},
                         {"us_per_step_median", med}, {"us_min", mn}, {"us_max", mx},
                         {"host_us_per_step", median(host_us)}, {"steps_per_s", 1e6 / med},
                         {"iters", a.iters}, {"repeats", a.repeats}, {"warmup", a.warmup},
                         {"arena_bytes", e.registry().arena_bytes()}, {"peak_bytes", e.runtime().peak_bytes()},
                         {"graph_nodes", e.graph_nodes()}, {"captures", e.captures()},
                         {"skipped_steps", rep.skipped_steps}, {"loss_total", rep.total_loss},
                         {"device", e.runtime().describe()}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        if (!header_done)
          std::printf("%-10s %-6s %6s %12s %12s %12s %10s %12s %8s\n", "pipeline", "prec", "batch", "device_us",
                      "min_us", "host_us", "steps/s", "arena_MiB", "nodes");
        header_done = true;
        std::printf("%-10s %-6s %6d %12.2f %12.2f %12.2f %10.0f %12.2f %8lld\n", spec.name.c_str(), prec.c_str(), b, med,
                    mn, median(host_us), 1e6 / med, arena_mib, static_cast<long long>(e.graph_nodes()));
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace dqn::cli
