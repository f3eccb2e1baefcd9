/** @file agent_run.cpp
 *  @brief Agent::resume, Agent::run and Agent::request_stop: the pipeline's own training loop (the
 *  Trainer) on the agent's engine, or on one engine per device where the pipeline names several,
 *  each starting from the agent's parameters.
 */
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "agent_impl.hpp"
#include "core/engine_access.hpp"
#include "core/rank_group.hpp"
#include "core/runtime.hpp"
#include "training/env/vec_env.hpp"
#include "training/trainer.hpp"

namespace dqn {

namespace fs = std::filesystem;

namespace {

AgentRun to_run(const TrainResult& r, bool offline) {
  AgentRun a;
  a.run_dir = r.run_dir;
  a.env_steps = r.env_steps, a.train_steps = r.train_steps, a.episodes = r.episodes, a.skipped_steps = r.skipped_steps;
  a.env_steps_all_ranks = r.env_steps_all_ranks;
  a.ranks = r.ranks;
  a.offline = offline;
  a.final_eval = r.final_eval, a.final_success = r.final_success, a.last_eval = r.last_eval, a.best_eval = r.best_eval;
  a.last_eval_step = r.last_eval_step, a.best_eval_step = r.best_eval_step;
  a.solved = r.solved, a.interrupted = r.interrupted;
  a.wall_s = r.wall_s;
  a.checkpoint = r.checkpoint;
  a.write_errors = r.write_errors;
  return a;
}

/// The line that says what runs: the pipeline, the runtime, the ranks, the environment or the dataset.
void start_line(const Agent::Impl& m, Engine& e, const RankGroup* group) {
  const PipelineSpec& spec = m.spec;
  const int R = group ? group->ranks() : 1;
  const std::string ranks = R > 1 ? ", " + std::to_string(R) + " ranks (" + group->describe() + ")" : "";
  char mean[32] = "none (no episode of it ended)";
  if (m.behaviour_return) std::snprintf(mean, sizeof mean, "%.1f", *m.behaviour_return);
  if (m.offline)
    std::fprintf(stderr,
                 "dqn train: pipeline '%s' on %s%s, offline from %s (%lld steps in %lld episodes, %lld transitions, "
                 "behaviour policy's mean return %s%s), %lld training steps, seed %llu\n",
                 spec.name.c_str(), e.runtime().describe().c_str(), ranks.c_str(), spec.training.dataset.c_str(),
                 static_cast<long long>(m.dataset_steps), static_cast<long long>(m.dataset_episodes),
                 static_cast<long long>(m.offline->size()), mean,
                 R > 1 ? "; the whole of it in each rank's replay" : "", static_cast<long long>(spec.training.total_steps),
                 static_cast<unsigned long long>(spec.seed));
  else
    std::fprintf(stderr, "dqn train: pipeline '%s' on %s%s, %s x%d%s, %lld steps, seed %llu\n", spec.name.c_str(),
                 e.runtime().describe().c_str(), ranks.c_str(), env_label(spec.training.env).c_str(),
                 spec.training.num_envs, R > 1 ? " on each" : "", static_cast<long long>(spec.training.total_steps),
                 static_cast<unsigned long long>(spec.seed));
}

/// An error of a run: which rank, and where what was written so far is.
std::string said(const Trainer& t, const std::string& who, const std::exception& e) {
  std::string why = (who.empty() ? "" : who.substr(1) + ": ") + e.what();
  if (!t.run_dir().empty()) why += "\nwhat was written so far is in " + t.run_dir();
  return why;
}

}  // namespace

Agent Agent::resume(const std::string& run_dir, const AgentOptions& options) {
  if (!options.overrides.empty())
    throw std::invalid_argument("resume: the run goes on as it was set up, with its own pipeline.yaml: no overrides ('" +
                                options.overrides.front() + "')");
  std::error_code ec;
  const std::string file = (fs::path(run_dir) / "pipeline.yaml").string();
  if (!fs::is_directory(run_dir, ec)) throw std::invalid_argument("'" + run_dir + "': no such directory");
  if (!fs::is_regular_file(file, ec))
    throw std::invalid_argument("'" + run_dir + "' holds no pipeline.yaml: not a run directory of dqn train");
  const std::string text = agent_detail::read_text(file);
  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  if (fs::exists(metrics, ec))
    if (const auto step = finished_at(agent_detail::read_text(metrics.string())))
      throw std::invalid_argument("'" + run_dir + "': the run finished at step " + std::to_string(*step) +
                                  ": there is nothing to resume\n  hint: to train on from its weights, start a new run: "
                                  "`dqn train " + file + " --weights " + (fs::path(run_dir) / "weights.safetensors").string() +
                                  " --out DIR`");
  Agent a(agent_detail::build(options, [&](const ParseOptions& po) { return parse_pipeline(text, file, po); }, file));
  Impl& m = *a.impl_;
  // The newest checkpoint that reads back whole; each one passed over is named.
  m.resume_from = checkpoint::newest(run_dir, text);
  for (const std::string& s : m.resume_from.skipped) m.warnings.push_back("checkpoint " + s);
  if (!m.resume_from.found) {
    std::string why = "'" + run_dir + "': no whole checkpoint in " + run_dir + "/checkpoints";
    if (m.resume_from.skipped.empty()) why += " (the run ended before its first one, at training.checkpoint_every)";
    for (const std::string& s : m.resume_from.skipped) why += "\n  " + s;
    why += "\n  hint: there is nothing to continue from: start the run again (`dqn train " + file +
           " --out DIR` with a new DIR, or remove " + run_dir + " first)";
    throw std::invalid_argument(why);
  }
  m.resume_dir = run_dir;
  m.resume_text = text;
  return a;
}

std::optional<AgentCheckpoint> Agent::resume_point() const {
  const Impl& m = *impl_;
  if (m.resume_dir.empty() || !m.resume_from.found) return std::nullopt;
  return AgentCheckpoint{m.resume_from.found->path, m.resume_from.found->clock};
}

const std::vector<std::string>& Agent::warnings() const { return impl_->warnings; }

void Agent::request_stop() noexcept {
  impl_->stop.store(true, std::memory_order_relaxed);
  if (Trainer* t = impl_->trainer.load(std::memory_order_acquire)) t->request_stop();
}

AgentRun Agent::run(const AgentRunOptions& o) {
  Impl& m = *impl_;
  const bool resuming = !m.resume_dir.empty();
  if (resuming && !o.run_dir.empty() && fs::path(o.run_dir) != fs::path(m.resume_dir))
    throw std::invalid_argument("run: this agent resumes '" + m.resume_dir + "', whose run goes on there, not in '" +
                                o.run_dir + "'");
  const BackendKind backend = resolve_backend(m.spec, std::nullopt);
  const std::vector<int> devices = rank_devices(m.spec, backend);
  // Several devices: one engine per rank, each from the agent's parameters; rank 0 writes the run
  // directory and prints, and its final parameters come back to the agent.
  std::shared_ptr<RankGroup> group = devices.size() > 1 ? make_rank_group(backend, devices) : nullptr;
  const int R = group ? group->ranks() : 1;
  const std::optional<st::File> start = group ? std::optional<st::File>(save_weights(*m.engine, false)) : std::nullopt;
  std::optional<st::File> final_weights;
  TrainResult result;
  const agent_detail::StopScope stop_scope{m.stop};
  auto work = [&](int rank) {
    const bool first = rank == 0;
    const std::string who = R > 1 ? " rank " + std::to_string(rank) : "";
    std::unique_ptr<Engine> own;
    Engine* engine = m.engine.get();
    if (group) {
      EngineOptions eo = training_engine_options(m.spec, m.offline ? &*m.offline : nullptr);
      eo.group = group;
      eo.rank = rank;
      own = std::make_unique<Engine>(m.spec, m.loader, eo);
      load_weights(*own, *start);
      engine = own.get();
    }
    TrainerOptions topt;
    topt.run_dir = resuming ? m.resume_dir : o.run_dir;
    if (resuming) topt.resume = &m.resume_from.found->file;
    topt.pipeline_yaml = resuming ? m.resume_text : m.yaml;
    topt.progress = o.progress && first ? TrainerOptions::Progress::automatic : TrainerOptions::Progress::none;
    if (!first) topt.progress_out = nullptr;
    if (m.offline) topt.offline = &*m.offline;
    topt.ranks = group.get();
    topt.rank = rank;
    topt.plugins = &m.loader;
    Trainer trainer(*engine, topt);
    if (first && o.progress && !resuming) start_line(m, *engine, group.get());
    struct Published {  // request_stop() reaches rank 0's trainer while it exists
      Impl& m;
      Published(Impl& i, Trainer& t) : m(i) { m.trainer.store(&t, std::memory_order_release); }
      ~Published() { m.trainer.store(nullptr, std::memory_order_release); }
    };
    std::optional<Published> published;
    if (first) {
      published.emplace(m, trainer);
      if (m.stop.load(std::memory_order_relaxed)) trainer.request_stop();  // asked before there was a trainer
    }
    try {
      TrainResult r = trainer.run();
      if (first) {
        result = std::move(r);
        if (group) final_weights = save_weights(*engine, false);
      }
    } catch (const std::invalid_argument& e) {  // refused (a run directory that holds anything, a finished run)
      throw std::invalid_argument(said(trainer, who, e));
    } catch (const std::exception& e) {
      throw std::runtime_error(said(trainer, who, e));
    }
  };
  run_ranks(group.get(), work);
  if (final_weights) load_weights(*m.engine, *final_weights);
  m.train_steps += result.train_steps;
  m.resume_dir.clear();
  m.resume_text.clear();
  m.resume_from = {};
  return to_run(result, m.offline.has_value());
}

}  // namespace dqn
