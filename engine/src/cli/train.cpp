// dqn train: an Agent from the pipeline (or the run it resumes), its run() with SIGINT and SIGTERM
// reaching request_stop() (StopSignals), and where everything went.
#include <csignal>
#include <cmath>
#include <cstdio>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "commands.hpp"
#include "dqn/agent.hpp"

namespace dqn::cli {

int cmd_train(const TrainArgs& a) {
  const bool resuming = !a.resume.empty();
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
  } else if (a.pipeline.empty()) {
    std::fprintf(stderr, "dqn train: a pipeline file is required (or --resume RUN_DIR to continue a run)\n");
    return 2;
  }
  // --seed and --steps are overrides like any other, so the resolved pipeline records them.
  AgentOptions opt;
  opt.plugin_path = a.common.plugin_path;
  opt.backend = a.common.backend;
  opt.overrides = a.common.overrides;
  if (a.seed >= 0) opt.overrides.push_back("seed=" + std::to_string(a.seed));
  if (a.total_steps >= 0) opt.overrides.push_back("training.total_steps=" + std::to_string(a.total_steps));
  std::optional<Agent> agent;
  try {
    agent.emplace(resuming ? Agent::resume(a.resume, opt) : Agent::from_file(a.pipeline, opt));
  } catch (const std::exception& e) {
    // (a pipeline's errors name their file, line and column, and end with their count)
    std::fprintf(stderr, "dqn train: %s%s\n", resuming ? "--resume " : "", e.what());
    return 1;
  }
  for (const std::string& w : agent->warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (const auto from = agent->resume_point())
    std::fprintf(stderr, "dqn train: resuming '%s' from %s (step %lld of %lld)\n", a.resume.c_str(), from->path.c_str(),
                 static_cast<long long>(from->step), static_cast<long long>(agent->training().total_steps));
  AgentRun r;
  try {
    if (!a.weights.empty()) agent->load(a.weights);
    AgentRunOptions ro;
    ro.run_dir = a.out_dir;
    ro.progress = !a.quiet;
    StopSignals signals(*agent);
    r = agent->run(ro);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dqn train: %s: %s\n", resuming ? a.resume.c_str() : a.pipeline.c_str(), e.what());
    return 1;
  }
  const AgentTraining t = agent->training();
  const bool is_offline = r.offline;

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
  if (t.eval_every == 0 || t.env.empty())
    std::printf("  no evaluation (%s)\n", t.env.empty() ? "no environment" : "training.eval.every is 0");
  else if (r.final_eval)
    std::printf("  final eval return %s (mean of %d greedy episodes%s)", eval_text(r.final_eval).c_str(),
                t.eval_episodes,
                r.final_success ? (", " + std::to_string(int(std::lround(*r.final_success * 100))) + " % successes").c_str()
                                : "");
  else
    std::printf("  no evaluation at the last step; the last was %s at step %lld", eval_text(r.last_eval).c_str(),
                static_cast<long long>(r.last_eval_step));
  if (t.eval_every != 0 && !t.env.empty())
    std::printf(", best %s at step %lld%s\n", eval_text(r.best_eval).c_str(), static_cast<long long>(r.best_eval_step),
              !r.solved ? ""
              : t.stop_at_success > 0 && r.final_success && *r.final_success >= t.stop_at_success
                  ? ", solved (stop_at_success reached)"
                  : ", solved (stop_at_return reached)");
  std::printf("  weights: %s/weights.safetensors%s, metrics: %s/metrics.jsonl, TensorBoard: tensorboard --logdir %s\n",
              r.run_dir.c_str(), r.best_eval ? " (best: best.safetensors)" : "", r.run_dir.c_str(), r.run_dir.c_str());
  for (const std::string& e : r.write_errors) std::fprintf(stderr, "dqn train: not written: %s\n", e.c_str());
  if (r.interrupted) {
    std::fprintf(stderr, "dqn train: stopped by %s after %lld env steps; final weights and metrics are written\n",
                 StopSignals::received() == SIGTERM ? "SIGTERM" : "SIGINT", static_cast<long long>(r.env_steps));
    if (!r.checkpoint.empty())
      std::fprintf(stderr, "dqn train: checkpoint %s; continue with: dqn train --resume %s\n", r.checkpoint.c_str(),
                   r.run_dir.c_str());
    return 130;
  }
  return r.write_errors.empty() ? 0 : 1;
}

}  // namespace dqn::cli
