// dqn eval: episodes of a trained policy (a run directory or a weights file) on its environment
// or another, greedy or ε-greedy, summarised as text or JSON; built on dqn::Agent.
#include <cstdio>
#include <exception>
#include <stdexcept>

#include "commands.hpp"
#include "dqn/agent.hpp"

namespace dqn::cli {

int cmd_eval(const EvalArgs& a) {
  try {
    AgentOptions o;
    o.overrides = a.common.overrides;
    o.plugin_path = a.common.plugin_path;
    o.backend = a.common.backend;
    o.best = a.best;
    Agent agent = Agent::from_run(a.source, o, a.pipeline);
    const AgentEval r = agent.evaluate(a.episodes, a.seed_given ? std::optional<std::uint64_t>(a.seed) : std::nullopt,
                                       a.epsilon, a.env);
    if (a.json)
      std::printf("%s\n", r.json().c_str());
    else
      std::printf("%s", r.text().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dqn eval: %s\n", e.what());  // (each message names the file it is about)
    return 1;
  }
  return 0;
}

}  // namespace dqn::cli
