// Trains an agent on its pipeline's environment (CartPole-v1 for pipelines/default.yaml) through the
// engine's C++ API, following the pipeline's training settings: the program steps the environment's
// copies, acts ε-greedily with the agent's greedy actions, shows it every step (it assembles the
// n-step transitions), trains it, and evaluates it until a mean return of 475.
//   cartpole_agent PIPELINE [key=value …] [--backend cpu|cuda] [--save FILE]
// Exit status: 0 once solved, 1 if not within training.total_steps, 2 on an error (its message printed).
#include <dqn/agent.hpp>
#include <dqn/environment.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PIPELINE [key=value …] [--backend cpu|cuda] [--save FILE]\n", argv[0]);
    return 2;
  }
  dqn::AgentOptions options;
  std::string save;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--backend" && i + 1 < argc)
      options.backend = argv[++i];
    else if (a == "--save" && i + 1 < argc)
      save = argv[++i];
    else
      options.overrides.push_back(a);
  }
  try {
    dqn::Agent agent = dqn::Agent::from_file(argv[1], options);
    // The pipeline's own training settings: copies, warm-up, ε schedule, evaluation.
    const dqn::AgentTraining t = agent.training();
    const int copies = t.num_envs;
    dqn::Environment env = dqn::Environment::make(t.env, copies, agent.seed());
    const int S = env.observation_size(), D = env.branches();
    const std::vector<int> bins = env.actions_per_branch();
    const auto n = static_cast<std::size_t>(copies);
    std::vector<float> obs(n * std::size_t(S)), next(obs.size()), last(obs.size()), rewards(n);
    std::vector<std::uint8_t> terminated(n), truncated(n);
    std::vector<std::int32_t> actions(n * std::size_t(D));
    std::mt19937_64 rng(agent.seed() + 1);
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    std::printf("%s on %s, %d copies\n", argv[1], agent.describe().c_str(), copies);
    env.reset(agent.seed(), obs.data());
    std::int64_t next_train = t.learning_starts, next_eval = t.eval_every;
    for (std::int64_t step = 0; step < t.total_steps;) {
      const double eps = step < t.learning_starts ? 1.0 : t.epsilon(step);
      agent.act(obs.data(), copies, actions.data());
      for (int c = 0; c < copies; ++c)
        if (coin(rng) < eps)
          for (int d = 0; d < D; ++d) actions[std::size_t(c * D + d)] = std::int32_t(rng() % std::uint64_t(bins[std::size_t(d)]));
      env.step(actions.data(), next.data(), rewards.data(), terminated.data(), truncated.data(), last.data());
      agent.observe(obs.data(), actions.data(), rewards.data(), last.data(), terminated.data(), truncated.data(), copies);
      obs.swap(next);
      step += copies;
      for (; step >= t.learning_starts && next_train <= step; next_train += t.train_every)
        agent.train(t.gradient_steps);
      if (step >= next_eval) {
        next_eval += t.eval_every;
        const dqn::AgentEval e = agent.evaluate(t.eval_episodes);
        std::printf("step %lld: %lld training steps, eval mean %.1f (min %.1f, max %.1f)\n", static_cast<long long>(step),
                    static_cast<long long>(agent.train_steps()), e.mean, e.min, e.max);
        std::fflush(stdout);
        if (e.mean >= 475) {
          if (!save.empty()) agent.save(save);
          std::printf("solved at step %lld\n", static_cast<long long>(step));
          return 0;
        }
      }
    }
    std::printf("not solved within %lld steps\n", static_cast<long long>(t.total_steps));
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cartpole_agent: %s\n", e.what());
    return 2;
  }
}
