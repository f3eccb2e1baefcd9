// dqn train: load the pipeline, build the engine, run the Trainer, print where everything went.
#include <csignal>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>
#include <memory>
#include <optional>

#include "commands.hpp"
#include "core/engine_access.hpp"
#include "pipeline/parse.hpp"
#include "core/plugin_loader.hpp"
#include "core/rank_group.hpp"
#include "core/safetensors.hpp"
#include "training/checkpoint.hpp"
#include "training/dataset.hpp"
#include "training/env/vec_env.hpp"
#include "training/trainer.hpp"

namespace dqn::cli {

namespace {

// The one trainer a signal may stop. Set while run() is in progress.
Trainer* volatile g_trainer = nullptr;
volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int sig) {
  g_signal = sig;
  if (Trainer* t = g_trainer) t->request_stop();  // one lock-free atomic store
}

/// Installs SIGINT/SIGTERM handlers for its lifetime and restores the previous ones after.
class StopSignals {
 public:
  explicit StopSignals(Trainer& t) {
    g_trainer = &t;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a blocking write returns and the loop sees the flag
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    g_trainer = nullptr;
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

}  // namespace

int cmd_train(const TrainArgs& a) {
  const bool resuming = !a.resume.empty();
  std::string pipeline_path = a.pipeline, pipeline_text;
  if (resuming) {
    // The run goes on as it was set up: its own pipeline.yaml, seed, steps and directory.
    std::vector<std::string> extra;
    if (!a.pipeline.empty()) extra.push_back("a pipeline file or override ('" + a.pipeline + "')");
    if (!a.common.overrides.empty()) extra.push_back("overrides ('" + a.common.overrides.front() + "')");
    if (!a.out_dir.empty()) extra.push_back("--out");
    if (!a.weights.empty()) extra.push_back("--weights");
    if (a.seed >= 0) extra.push_back("--seed");
    if (a.total_steps >= 0) extra.push_back("--steps");
    if (!extra.empty()) {
      std::string list;
      for (std::size_t i = 0; i < extra.size(); ++i) list += (i ? ", " : "") + extra[i];
      std::fprintf(stderr,
                   "dqn train: --resume continues the run with its own pipeline.yaml, seed, steps and directory, so "
                   "these cannot be given with it: %s (only --backend, --plugin-path and -q can)\n",
                   list.c_str());
      return 2;
    }
    std::error_code ec;
    pipeline_path = (std::filesystem::path(a.resume) / "pipeline.yaml").string();
    if (!std::filesystem::is_directory(a.resume, ec) || !std::filesystem::is_regular_file(pipeline_path, ec)) {
      std::fprintf(stderr, "dqn train: --resume '%s': %s\n", a.resume.c_str(),
                   std::filesystem::is_directory(a.resume, ec) ? "holds no pipeline.yaml: not a run directory of dqn train"
                                                               : "no such directory");
      return 1;
    }
    std::ifstream in(pipeline_path, std::ios::binary);
    pipeline_text.assign(std::istreambuf_iterator<char>(in), {});
  } else if (a.pipeline.empty()) {
    std::fprintf(stderr, "dqn train: a pipeline file is required (or --resume RUN_DIR to continue a run)\n");
    return 2;
  }
  PluginLoader loader(PluginLoader::search_path_from(a.common.plugin_path));

  // --seed and --steps are overrides like any other, so the resolved pipeline records them.
  ParseOptions opt;
  opt.overrides = a.common.overrides;
  if (!a.common.backend.empty()) opt.overrides.push_back("backend=" + a.common.backend);
  if (a.seed >= 0) opt.overrides.push_back("seed=" + std::to_string(a.seed));
  if (a.total_steps >= 0) opt.overrides.push_back("training.total_steps=" + std::to_string(a.total_steps));
  opt.plugins = &loader;
  opt.environments = environment_shapes(&loader);
  opt.program_envs = program_env_names();
  PipelineSpec spec;
  std::string resolved;
  try {
    spec = load_pipeline(pipeline_path, opt);
    resolved = resuming ? pipeline_text : to_yaml(spec, loader);
    // The libraries the pipeline's plugins made the loader open, and could not use.
    for (const auto& p : loader.problems()) std::fprintf(stderr, "warning: %s\n", p.c_str());
  } catch (const PipelineErrors& e) {
    for (const auto& err : e.errors()) std::fprintf(stderr, "%s\n", err.what());
    std::fprintf(stderr, "%s: %zu error%s\n", pipeline_path.c_str(), e.errors().size(),
                 e.errors().size() == 1 ? "" : "s");
    return 1;
  }

  // Offline: the whole dataset read and checked before anything is built or written.
  TransitionBatch offline;
  double behaviour = 0;
  std::int64_t dataset_steps = 0, dataset_episodes = 0;
  if (!spec.training.dataset.empty()) {
    try {
      const Dataset d = read_dataset(spec.training.dataset, spec.network);
      behaviour = d.metadata.count("behaviour_return") ? std::stod(d.metadata.at("behaviour_return")) : d.mean_return();
      dataset_steps = d.steps();
      dataset_episodes = d.episodes();
      offline = assemble_transitions(d, spec.n_step, spec.gamma);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dqn train: %s: %s\n", pipeline_path.c_str(), e.what());
      return 1;
    }
  }
  const bool is_offline = !spec.training.dataset.empty();
  // Resuming: the newest checkpoint that reads back whole; each one passed over is named.
  checkpoint::Search found;
  if (resuming) {
    found = checkpoint::newest(a.resume, pipeline_text);
    for (const std::string& s : found.skipped) std::fprintf(stderr, "dqn train: checkpoint %s\n", s.c_str());
    if (!found.found) {
      std::fprintf(stderr, "dqn train: --resume '%s': no whole checkpoint in %s/checkpoints%s\n", a.resume.c_str(),
                   a.resume.c_str(), found.skipped.empty() ? " (none was written yet)" : "");
      return 1;
    }
  }
  // One rank per device (devices:), each on a thread of its own; rank 0 writes the run directory,
  // prints, and is the one a signal reaches (the ranks agree on stopping every iteration).
  std::shared_ptr<RankGroup> group;
  try {
    const BackendKind backend = resolve_backend(spec, std::nullopt);
    const std::vector<int> devices = rank_devices(spec, backend);
    if (devices.size() > 1) group = make_rank_group(backend, devices);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dqn train: %s: %s\n", pipeline_path.c_str(), e.what());
    return 1;
  }
  const int R = group ? group->ranks() : 1;
  TrainResult r;
  auto work = [&](int rank) {
    const bool first = rank == 0;
    const std::string who = R > 1 ? " (rank " + std::to_string(rank) + ")" : "";
    std::unique_ptr<Engine> engine;
    std::unique_ptr<Trainer> trainer;
    try {
      EngineOptions eo = training_engine_options(spec, is_offline ? &offline : nullptr);
      eo.group = group;
      eo.rank = rank;
      engine = std::make_unique<Engine>(spec, loader, eo);
      if (!a.weights.empty())
        load_weights(*engine, st::read_file(a.weights));
      else if (!resuming)
        init_weights(*engine, spec.seed);
      TrainerOptions topt;
      topt.run_dir = resuming ? a.resume : a.out_dir;
      if (resuming) topt.resume = &found.found->file;
      topt.pipeline_yaml = resolved;
      topt.progress = a.quiet || !first ? TrainerOptions::Progress::none : TrainerOptions::Progress::automatic;
      if (!first) topt.progress_out = nullptr;
      if (is_offline) topt.offline = &offline;
      topt.ranks = group.get();
      topt.rank = rank;
      topt.plugins = &loader;
      trainer = std::make_unique<Trainer>(*engine, topt);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dqn train: %s%s: %s\n", pipeline_path.c_str(), who.c_str(), e.what());
      throw;
    }
    const std::string ranks_text = R > 1 ? ", " + std::to_string(R) + " ranks (" + group->describe() + ")" : "";
    if (first && resuming)
      std::fprintf(stderr, "dqn train: resuming '%s' from %s (step %lld of %lld)\n", a.resume.c_str(),
                   found.found->path.c_str(), static_cast<long long>(found.found->clock),
                   static_cast<long long>(spec.training.total_steps));
    else if (first && !a.quiet && is_offline)
      std::fprintf(stderr,
                   "dqn train: pipeline '%s' on %s%s, offline from %s (%lld steps in %lld episodes, %lld transitions, "
                   "behaviour policy's mean return %.1f%s), %lld training steps, seed %llu\n",
                   spec.name.c_str(), engine->runtime().describe().c_str(), ranks_text.c_str(),
                   spec.training.dataset.c_str(), static_cast<long long>(dataset_steps),
                   static_cast<long long>(dataset_episodes), static_cast<long long>(offline.size()), behaviour,
                   R > 1 ? "; the whole of it in each rank's replay" : "",
                   static_cast<long long>(spec.training.total_steps), static_cast<unsigned long long>(spec.seed));
    else if (first && !a.quiet)
      std::fprintf(stderr, "dqn train: pipeline '%s' on %s%s, %s x%d%s, %lld steps, seed %llu\n", spec.name.c_str(),
                   engine->runtime().describe().c_str(), ranks_text.c_str(), env_label(spec.training.env).c_str(),
                   spec.training.num_envs, R > 1 ? " on each" : "", static_cast<long long>(spec.training.total_steps),
                   static_cast<unsigned long long>(spec.seed));
    try {
      std::optional<StopSignals> signals;
      if (first) signals.emplace(*trainer);
      TrainResult mine = trainer->run();
      if (first) r = std::move(mine);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "dqn train: error%s: %s\n", who.c_str(), e.what());
      if (!trainer->run_dir().empty())
        std::fprintf(stderr, "dqn train: what was written so far is in %s\n", trainer->run_dir().c_str());
      throw;
    }
  };
  try {
    run_ranks(group.get(), work);
  } catch (const std::exception&) {
    return 1;  // each rank's error was printed where it was caught
  }

  auto eval_text = [](const std::optional<double>& v) {
    char buf[32];
    if (!v) return std::string("none");
    std::snprintf(buf, sizeof buf, "%.1f", *v);
    return std::string(buf);
  };
  std::printf("run directory: %s\n", r.run_dir.c_str());
  // Over several devices: online, each rank's environment steps (and all of them); offline, each
  // rank's training steps (each on a batch of its own from the whole dataset).
  const std::string each = r.ranks > 1 ? " on each of " + std::to_string(r.ranks) + " ranks" : "";
  const std::string over = r.ranks > 1 && !is_offline ? each + " (" + std::to_string(r.env_steps_all_ranks) + " in all)" : "";
  std::printf("  %lld env steps%s, %lld training steps%s, %lld episodes, %.1f s, %lld skipped steps\n",
              static_cast<long long>(r.env_steps), over.c_str(), static_cast<long long>(r.train_steps),
              is_offline ? each.c_str() : "", static_cast<long long>(r.episodes), r.wall_s,
              static_cast<long long>(r.skipped_steps));
  if (r.final_eval)
    std::printf("  final eval return %s (mean of %d greedy episodes%s)", eval_text(r.final_eval).c_str(),
                spec.training.eval.episodes,
                r.final_success ? (", " + std::to_string(int(std::lround(*r.final_success * 100))) + " % successes").c_str()
                                : "");
  else
    std::printf("  no evaluation at the last step; the last was %s at step %lld", eval_text(r.last_eval).c_str(),
                static_cast<long long>(r.last_eval_step));
  std::printf(", best %s at step %lld%s\n", eval_text(r.best_eval).c_str(), static_cast<long long>(r.best_eval_step),
              !r.solved ? ""
              : spec.training.stop_at_success > 0 && r.final_success && *r.final_success >= spec.training.stop_at_success
                  ? ", solved (stop_at_success reached)"
                  : ", solved (stop_at_return reached)");
  std::printf("  weights: %s/weights.safetensors (best: best.safetensors), metrics: %s/metrics.jsonl\n",
              r.run_dir.c_str(), r.run_dir.c_str());
  for (const std::string& e : r.write_errors) std::fprintf(stderr, "dqn train: not written: %s\n", e.c_str());
  if (r.interrupted) {
    std::fprintf(stderr, "dqn train: stopped by %s after %lld env steps; final weights and metrics are written\n",
                 g_signal == SIGTERM ? "SIGTERM" : "SIGINT", static_cast<long long>(r.env_steps));
    if (!r.checkpoint.empty())
      std::fprintf(stderr, "dqn train: checkpoint %s; continue with: dqn train --resume %s\n", r.checkpoint.c_str(),
                   r.run_dir.c_str());
    return 130;
  }
  return r.write_errors.empty() ? 0 : 1;
}

}  // namespace dqn::cli
