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
    Agent agent = policy_agent(a.common, a.source, a.pipeline, a.best);
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
