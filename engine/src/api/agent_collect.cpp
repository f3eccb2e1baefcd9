/** @file agent_collect.cpp
 *  @brief Agent::collect: a dataset of transitions from the agent's policy acting ε-greedily on the
 *  pipeline's environment, written (atomically) in the layout training.dataset reads.
 */
#include <filesystem>
#include <random>
#include <stdexcept>

#include "agent_impl.hpp"
#include "training/dataset.hpp"
#include "training/env/vec_env.hpp"
#include "training/trainer.hpp"

namespace dqn {

namespace {

/// One environment copy's episode in progress.
struct Episode {
  std::vector<float> states, next_states, rewards, dones;
  std::vector<std::int32_t> actions;
  void clear() { states.clear(), next_states.clear(), rewards.clear(), dones.clear(), actions.clear(); }
};

void append(Dataset& d, const Episode& e) {
  if (e.rewards.empty()) return;
  d.states.insert(d.states.end(), e.states.begin(), e.states.end());
  d.next_states.insert(d.next_states.end(), e.next_states.begin(), e.next_states.end());
  d.actions.insert(d.actions.end(), e.actions.begin(), e.actions.end());
  d.rewards.insert(d.rewards.end(), e.rewards.begin(), e.rewards.end());
  d.dones.insert(d.dones.end(), e.dones.begin(), e.dones.end());
  d.episode_ends.push_back(d.steps() - 1);
}

}  // namespace

AgentDataset Agent::collect(const std::string& path, std::int64_t steps, double epsilon, std::uint64_t seed,
                            bool replace) {
  Impl& m = *impl_;
  const PipelineSpec& spec = m.spec;
  std::error_code ec;
  if (!replace && std::filesystem::exists(path, ec))
    throw std::invalid_argument("collect: " + path + " exists; nothing was written");
  if (steps < 1) throw std::invalid_argument("collect: steps must be at least 1, not " + std::to_string(steps));
  if (!(epsilon >= 0.0 && epsilon <= 1.0))
    throw std::invalid_argument("collect: epsilon must be in [0, 1], not " + std::to_string(epsilon));
  if (spec.training.env.none())
    throw std::invalid_argument("collect: the pipeline names no environment (training.env)");
  const int N = spec.training.num_envs, S = spec.network.state, D = spec.network.branches;
  std::unique_ptr<VecEnv> env = make_env(spec.training.env, N, seed, spec.training.env_threads, &m.loader);
  check_env_fits(spec, *env);
  const std::vector<int> branch = env->branch_actions();
  const auto n = std::size_t(N), s = std::size_t(S), dd = std::size_t(D);
  std::vector<float> obs(n * s), next(n * s), fin(n * s), rew(n);
  std::vector<std::uint8_t> term(n), trunc(n);
  std::vector<std::int32_t> act(n * dd);
  std::vector<Episode> open(n);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 7);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  Dataset d;
  d.S = S;
  d.D = D;
  env->reset(seed, obs.data());
  const agent_detail::StopScope stop_scope{m.stop};
  std::int64_t done = 0;
  while (done < steps) {
    if (m.stop.load(std::memory_order_relaxed)) {  // nothing is written
      AgentDataset stopped;
      stopped.env = env->label();
      stopped.steps = done;
      stopped.stopped = true;
      return stopped;
    }
    m.engine->actor().act(obs.data(), N, act.data());
    for (std::size_t k = 0; k < n; ++k)
      if (coin(rng) < epsilon)
        for (std::size_t j = 0; j < dd; ++j)
          act[k * dd + j] = std::int32_t(std::uniform_int_distribution<int>(0, branch[j] - 1)(rng));
    env->step(act.data(), next.data(), rew.data(), term.data(), trunc.data(), fin.data());
    for (std::size_t k = 0; k < n; ++k) {
      Episode& ep = open[k];
      ep.states.insert(ep.states.end(), obs.begin() + long(k * s), obs.begin() + long((k + 1) * s));
      ep.next_states.insert(ep.next_states.end(), fin.begin() + long(k * s), fin.begin() + long((k + 1) * s));
      ep.actions.insert(ep.actions.end(), act.begin() + long(k * dd), act.begin() + long((k + 1) * dd));
      ep.rewards.push_back(rew[k]);
      ep.dones.push_back(term[k] ? 1.0f : 0.0f);
      if (term[k] || trunc[k]) {
        append(d, ep);
        ep.clear();
      }
    }
    obs.swap(next);
    done += N;
  }
  AgentDataset out;
  out.path = path;
  out.env = env->label();
  out.complete_episodes = d.episodes();
  if (out.complete_episodes > 0) out.behaviour_return = d.mean_return();
  for (const Episode& ep : open) append(d, ep);  // the unfinished ones, as truncated episodes
  d.path = path;
  if (!m.weights_source.empty()) d.metadata["source"] = m.weights_source;
  d.metadata["pipeline"] = spec.name;
  d.metadata["env"] = out.env;
  d.metadata["epsilon"] = std::to_string(epsilon);
  d.metadata["seed"] = std::to_string(seed);
  if (out.behaviour_return) d.metadata["behaviour_return"] = std::to_string(*out.behaviour_return);
  d.metadata["complete_episodes"] = std::to_string(out.complete_episodes);
  d.check(spec.network);
  write_dataset(path, d);
  out.steps = d.steps();
  out.episodes = d.episodes();
  return out;
}

}  // namespace dqn
