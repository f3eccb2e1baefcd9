// dqn collect: a dataset of transitions from a trained policy acting ε-greedily on the pipeline's
// environment, written (atomically, never over an existing file unless asked) in the layout
// `training.dataset` reads.
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "commands.hpp"
#include "dqn/agent.hpp"

namespace dqn::cli {

int cmd_collect(const CollectArgs& a) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(a.source) && a.pipeline.empty()) {
    std::fprintf(stderr, "dqn collect: %s is a weights file: name its pipeline with --pipeline\n", a.source.c_str());
    return 2;
  }
  if (fs::exists(a.out) && !a.force) {
    std::fprintf(stderr, "dqn collect: %s exists; nothing was written (--force replaces it)\n", a.out.c_str());
    return 1;
  }
  try {
    Agent agent = policy_agent(a.common, a.source, a.pipeline, false);
    for (const std::string& w : agent.warnings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
    AgentDataset d;
    {
      StopSignals signals(agent);
      d = agent.collect(a.out, a.steps, a.epsilon, a.seed, a.force);
    }
    if (d.stopped) {
      std::fprintf(stderr, "dqn collect: stopped by a signal after %lld steps; nothing was written\n",
                   static_cast<long long>(d.steps));
      return 130;
    }
    char mean[64];
    if (d.behaviour_return)
      std::snprintf(mean, sizeof mean, "%.1f", *d.behaviour_return);
    else
      std::snprintf(mean, sizeof mean, "none yet (no episode ended)");
    std::printf("dataset: %s\n  %lld steps in %lld episodes (%lld complete), behaviour policy's mean return %s "
                "(ε %.3f)\n",
                d.path.c_str(), static_cast<long long>(d.steps), static_cast<long long>(d.episodes),
                static_cast<long long>(d.complete_episodes), mean, a.epsilon);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "dqn collect: %s: %s\n", a.source.c_str(), ex.what());
    return 1;
  }
  return 0;
}

}  // namespace dqn::cli
