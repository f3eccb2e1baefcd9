// dqn collect: a dataset of transitions from a trained policy acting ε-greedily on the pipeline's
// environment, written (atomically, never over an existing file unless asked) in the layout
// `training.dataset` reads.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "commands.hpp"
#include "core/engine_access.hpp"
#include "core/plugin_loader.hpp"
#include "core/safetensors.hpp"
#include "core/rank_group.hpp"
#include "pipeline/parse.hpp"
#include "training/dataset.hpp"
#include "training/env/vec_env.hpp"

namespace dqn::cli {

namespace {

volatile std::sig_atomic_t g_stop = 0;
extern "C" void on_collect_signal(int) { g_stop = 1; }

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

int cmd_collect(const CollectArgs& a) {
  namespace fs = std::filesystem;
  const bool run_dir = fs::is_directory(a.source);
  const std::string weights = run_dir ? (fs::path(a.source) / "weights.safetensors").string() : a.source;
  const std::string pipeline = !a.pipeline.empty() ? a.pipeline
                               : run_dir          ? (fs::path(a.source) / "pipeline.yaml").string()
                                                  : std::string();
  if (pipeline.empty()) {
    std::fprintf(stderr, "dqn collect: %s is a weights file: name its pipeline with --pipeline\n", a.source.c_str());
    return 2;
  }
  if (fs::exists(a.out) && !a.force) {
    std::fprintf(stderr, "dqn collect: %s exists; nothing was written (--force replaces it)\n", a.out.c_str());
    return 1;
  }
  PluginLoader loader(PluginLoader::search_path_from(a.common.plugin_path));
  PipelineSpec spec;
  Common c = a.common;
  c.trains = true;
  if (!load_with(loader, c, pipeline, spec)) return 1;
  try {
    // Acting needs no other rank: the first of the pipeline's devices (a run trained on several).
    EngineOptions eo;
    eo.device = rank_devices(spec, resolve_backend(spec, std::nullopt)).front();
    Engine e(spec, loader, eo);
    load_weights(e, st::read_file(weights));
    const int N = spec.training.num_envs, S = spec.network.state, D = spec.network.branches;
    std::unique_ptr<VecEnv> env = make_env(spec.training.env, N, a.seed, spec.training.env_threads, &loader);
    if (env->obs_dim() != S || env->branches() != D)
      throw std::invalid_argument("the environment " + env->label() + " does not fit the pipeline's network");
    const std::vector<int> branch = env->branch_actions();
    const auto n = std::size_t(N), s = std::size_t(S), dd = std::size_t(D);
    std::vector<float> obs(n * s), next(n * s), fin(n * s), rew(n);
    std::vector<std::uint8_t> term(n), trunc(n);
    std::vector<std::int32_t> act(n * dd);
    std::vector<Episode> open(n);
    std::mt19937_64 rng(a.seed * 0x9E3779B97F4A7C15ull + 7);
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    Dataset d;
    d.S = S;
    d.D = D;
    env->reset(a.seed, obs.data());
    struct sigaction sa {}, old_int {}, old_term {};
    sa.sa_handler = on_collect_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    std::int64_t steps = 0;
    while (steps < a.steps && !g_stop) {
      e.actor().act_snapshot(obs.data(), N, act.data());  // the loaded weights: the snapshot is them
      for (std::size_t k = 0; k < n; ++k)
        if (coin(rng) < a.epsilon)
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
      steps += N;
    }
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    if (g_stop) {
      std::fprintf(stderr, "dqn collect: stopped by a signal after %lld steps; nothing was written\n",
                   static_cast<long long>(steps));
      return 130;
    }
    const std::int64_t complete = d.episodes();
    const double behaviour = d.mean_return();
    for (const Episode& ep : open) append(d, ep);  // the unfinished ones, as truncated episodes
    d.path = a.out;
    d.metadata["source"] = weights;
    d.metadata["pipeline"] = spec.name;
    d.metadata["env"] = env->label();
    d.metadata["epsilon"] = std::to_string(a.epsilon);
    d.metadata["seed"] = std::to_string(a.seed);
    d.metadata["behaviour_return"] = std::to_string(behaviour);
    d.metadata["complete_episodes"] = std::to_string(complete);
    d.check(spec.network);
    write_dataset(a.out, d);
    std::printf("dataset: %s\n  %lld steps in %lld episodes (%lld complete), behaviour policy's mean return %.1f "
                "(ε %.3f)\n",
                a.out.c_str(), static_cast<long long>(d.steps()), static_cast<long long>(d.episodes()),
                static_cast<long long>(complete), behaviour, a.epsilon);
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "dqn collect: %s: %s\n", a.source.c_str(), ex.what());
    return 1;
  }
  return 0;
}

}  // namespace dqn::cli
