/** @file agent_impl.hpp
 *  @brief What an Agent holds (dqn/agent.hpp): its plugins, pipeline, engine and replay, the n-step
 *  assembly of observed transitions, an offline pipeline's dataset, the run it resumes, and the
 *  stop request that ends run() and collect(). Shared by agent.cpp (acting, learning, evaluation,
 *  files), agent_run.cpp (the pipeline's own training loop) and agent_collect.cpp (datasets).
 */
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/engine.hpp"
#include "core/plugin_loader.hpp"
#include "dqn/agent.hpp"
#include "pipeline/parse.hpp"
#include "training/checkpoint.hpp"
#include "training/replay.hpp"

namespace dqn {

class Trainer;

struct Agent::Impl {
  explicit Impl(const std::string& plugin_path) : loader(PluginLoader::search_path_from(plugin_path)) {}
  PluginLoader loader;
  PipelineSpec spec;
  std::string yaml;  ///< the resolved pipeline
  std::unique_ptr<Engine> engine;
  std::optional<NStepAssembler> nstep;  ///< made by the first observe()
  int copies = 0;
  TransitionBatch fresh;
  std::int64_t observed = 0;  ///< environment steps observed, over all copies (β's schedule)
  std::int64_t train_steps = 0;
  /// training.dataset's n-step transitions (offline pipelines), and what the file says of itself.
  std::optional<TransitionBatch> offline;
  std::int64_t dataset_steps = 0, dataset_episodes = 0;
  std::optional<double> behaviour_return;
  /// Agent::resume: the run directory, its pipeline.yaml as written, the checkpoint found.
  std::string resume_dir, resume_text;
  checkpoint::Search resume_from;
  std::vector<std::string> warnings;
  std::string weights_source;  ///< the file load() read last (a dataset's `source`)
  /// request_stop(): the flag collect() polls, and the trainer of the run in progress (rank 0's).
  std::atomic<bool> stop{false};
  std::atomic<Trainer*> trainer{nullptr};
};

namespace agent_detail {

/// Clears the stop request when run() or collect() returns (a request made before they began
/// still ends them).
struct StopScope {
  std::atomic<bool>& stop;
  ~StopScope() { stop.store(false, std::memory_order_relaxed); }
};

using ParseFn = std::function<PipelineSpec(const ParseOptions&)>;
/// A new agent's state: the pipeline parsed (errors as one std::invalid_argument, each on a line
/// and "<source>: N errors" last), an offline pipeline's dataset read, the engine built and
/// initialised from the pipeline's seed.
std::unique_ptr<Agent::Impl> build(const AgentOptions& o, const ParseFn& parse, const std::string& source);
/// A file's whole text; std::invalid_argument naming it when it cannot be read.
std::string read_text(const std::string& path);

}  // namespace agent_detail

}  // namespace dqn
