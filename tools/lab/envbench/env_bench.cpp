/** @file env_bench.cpp
 *  @brief dqn-envbench: environment steps per second of a pipeline's training.env over several
 *  thread counts (uniform-random actions, the engine's VecEnv and thread pool, no learner).
 *    dqn-envbench PIPELINE [key=value …] [--threads 1,2,4,8] [--seconds 5] [--plugin-path DIR]
 *  Prints one line per thread count: copies, threads, steps/s (all copies), and the speed-up over
 *  the first count.
 */
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/plugin_loader.hpp"
#include "pipeline/parse.hpp"
#include "training/env/vec_env.hpp"

int main(int argc, char** argv) {
  CLI::App app{"dqn-envbench: environment steps per second over thread counts"};
  std::string pipeline, threads_text = "1,2,4,8", plugin_path;
  std::vector<std::string> overrides;
  double seconds = 5.0;
  app.add_option("pipeline", pipeline, "the pipeline whose training.env and num_envs are measured")->required();
  app.add_option("overrides", overrides, "key=value overrides (training.num_envs=64, …)");
  app.add_option("--threads", threads_text, "thread counts, comma separated");
  app.add_option("--seconds", seconds, "seconds of stepping per thread count (after one second of warm-up)");
  app.add_option("--plugin-path", plugin_path, "directories searched for plugins first");
  CLI11_PARSE(app, argc, argv);
  try {
    dqn::PluginLoader loader(dqn::PluginLoader::search_path_from(plugin_path));
    dqn::ParseOptions opt;
    opt.overrides = overrides;
    opt.plugins = &loader;
    opt.environments = dqn::environment_shapes(&loader);
    const dqn::PipelineSpec spec = dqn::load_pipeline(pipeline, opt);
    std::vector<int> counts;
    std::stringstream ss(threads_text);
    for (std::string t; std::getline(ss, t, ',');) counts.push_back(std::stoi(t));
    const int N = spec.training.num_envs;
    double first = 0;
    std::printf("# %s, %d copies, %.1f s per count\n", dqn::env_label(spec.training.env).c_str(), N, seconds);
    std::printf("%8s %8s %14s %8s\n", "copies", "threads", "steps/s", "speedup");
    for (int t : counts) {
      auto env = dqn::make_env(spec.training.env, N, spec.seed, t, &loader);
      const auto S = std::size_t(env->obs_dim()), D = std::size_t(env->branches()), n = std::size_t(N);
      const std::vector<int> bins = env->branch_actions();
      std::vector<float> obs(n * S), next(n * S), fin(n * S), rew(n);
      std::vector<std::uint8_t> term(n), trunc(n);
      std::vector<std::int32_t> act(n * D);
      std::mt19937_64 rng(7);
      env->reset(spec.seed, obs.data());
      auto run = [&](double for_s) {
        std::int64_t steps = 0;
        const auto t0 = std::chrono::steady_clock::now();
        double el = 0;
        while (el < for_s) {
          for (std::size_t i = 0; i < n; ++i)
            for (std::size_t d = 0; d < D; ++d) act[i * D + d] = std::int32_t(rng() % std::uint64_t(bins[d]));
          env->step(act.data(), next.data(), rew.data(), term.data(), trunc.data(), fin.data());
          steps += N;
          el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        return double(steps) / el;
      };
      run(1.0);
      const double rate = run(seconds);
      if (first == 0) first = rate;
      std::printf("%8d %8d %14.0f %8.2f\n", N, env->threads(), rate, rate / first);
      std::fflush(stdout);
    }
  } catch (const dqn::PipelineErrors& e) {
    for (const auto& err : e.errors()) std::fprintf(stderr, "%s\n", err.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dqn-envbench: %s\n", e.what());
    return 1;
  }
  return 0;
}
