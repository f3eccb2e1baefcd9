// Plugins on the GPU: a stage that synchronises or allocates while the step is captured is refused
// naming its plugin and stage (the fixture capture_probe); one that only launches its kernel runs;
// the act step (the trunk, the primary's act stage and the argmax, a graph of its own) against the
// CPU reference, and acting with the newest parameters after steps.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/engine.hpp"
#include "core/plugin_loader.hpp"
#include "pipeline/parse.hpp"

namespace {
using namespace dqn;

std::string env_or_fail(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE_MESSAGE(v != nullptr, name << " is not set (run through meson test)");
  return v;
}

/// The build's plugins and the test fixtures (capture_probe among them).
const PluginLoader& loader() {
  static PluginLoader l([] {
    auto dirs = PluginLoader::search_path_from("");
    dirs.push_back(env_or_fail("DQN_TEST_FIXTURES"));
    return dirs;
  }());
  return l;
}

PipelineSpec parse(const std::string& text) {
  ParseOptions o;
  o.plugins = &loader();
  return parse_pipeline(text, "plugin-gpu-test.yaml", o);
}

std::string pipeline(const std::string& precision, const std::string& aux = "") {
  return "name: plugin-gpu-test\nseed: 3\nbackend: cuda\nprecision: " + precision +
         "\nnetwork: {state: 37, trunk: [61, 45], head_hidden: 29, branches: 3, actions: 5, atoms: 51}\n"
         "heads:\n  - {plugin: c51, role: primary}\n" +
         aux + "batch: 67\ntraining: {num_envs: 5, eval: {episodes: 11}}\n";
}

std::unique_ptr<Engine> make(const PipelineSpec& spec, BackendKind b) {
  EngineOptions eo;
  eo.backend = b;
  auto e = std::make_unique<Engine>(spec, loader(), eo);
  e->init_weights(spec.seed);
  return e;
}

std::vector<float> observations(int rows, int S, unsigned seed) {
  std::vector<float> x(std::size_t(rows) * std::size_t(S));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i) + seed));
  return x;
}

}  // namespace

TEST_CASE("gpu.plugins.capture: a stage that synchronises or allocates is refused, naming its plugin and stage") {
  REQUIRE_MESSAGE(loader().find("capture_probe"), "the capture_probe fixture is not built (a CUDA build has it)");
  for (const char* mode : {"sync", "malloc"}) {
    CAPTURE(mode);
    const PipelineSpec spec = parse(pipeline(
        "tf32", std::string("  - {plugin: capture_probe, role: auxiliary, budget: 0.05, mode: ") + mode + "}\n"));
    std::string what;
    try {
      make(spec, BackendKind::cuda);
    } catch (const std::exception& e) {
      what = e.what();
    }
    INFO(what);
    CHECK(what.find("plugin 'capture_probe'") != std::string::npos);
    CHECK(what.find("stage 'capture_probe.probe'") != std::string::npos);
    CHECK(what.find("broke the CUDA graph capture") != std::string::npos);
    CHECK(what.find("must not synchronise, allocate") != std::string::npos);
  }
  // The same plugin launching only its kernel is captured and steps; the device is fine after the
  // refusals above.
  const PipelineSpec spec =
      parse(pipeline("tf32", "  - {plugin: capture_probe, role: auxiliary, budget: 0.05, mode: kernel}\n"));
  auto e = make(spec, BackendKind::cuda);
  e->set_batch(HostBatch::random(spec, 4));
  for (int i = 0; i < 5; ++i) e->step();
  const StepReport r = e->read_report();
  CHECK(r.losses.at(1) == 0.0);
  CHECK(std::isfinite(r.losses.at(0)));
  CHECK(e->captures() == 1);
}

TEST_CASE("gpu.act: the act step's graph against the CPU reference, and acting with the newest parameters") {
  const PipelineSpec spec = parse(pipeline("fp32"));
  auto gpu = make(spec, BackendKind::cuda);
  auto cpu = make(spec, BackendKind::cpu);
  REQUIRE(gpu->act_rows() == 11);  // the larger of num_envs and eval.episodes
  const int S = 37, D = 3, A = 5;
  for (const int rows : {1, 5, 11}) {
    CAPTURE(rows);
    const auto obs = observations(rows, S, unsigned(rows));
    const auto qg = gpu->act_values(obs.data(), rows);
    const auto qc = cpu->act_values(obs.data(), rows);
    REQUIRE(qg.size() == std::size_t(rows * D * A));
    double worst = 0;
    for (std::size_t i = 0; i < qg.size(); ++i) worst = std::max(worst, std::fabs(double(qg[i]) - double(qc[i])));
    CHECK(worst < 1e-4);  // fp32 GEMMs against the CPU's double sums, Q within [-10, 10]
    std::vector<std::int32_t> act(std::size_t(rows * D), -1);
    gpu->act(obs.data(), rows, act.data());
    for (int k = 0; k < rows * D; ++k) {
      const float* row = qg.data() + std::size_t(k) * A;
      CHECK(act[std::size_t(k)] == int(std::max_element(row, row + A) - row));
    }
  }
  // After training steps the act step reads the new online parameters (no copy to refresh).
  const auto obs = observations(4, S, 9);
  const auto before = gpu->act_values(obs.data(), 4);
  gpu->set_batch(HostBatch::random(spec, 2));
  for (int i = 0; i < 20; ++i) gpu->step();
  const auto after = gpu->act_values(obs.data(), 4);
  double moved = 0;
  for (std::size_t i = 0; i < before.size(); ++i) moved = std::max(moved, std::fabs(double(after[i]) - double(before[i])));
  CHECK(moved > 1e-6);
  CHECK(gpu->captures() == 1);
  CHECK_THROWS_AS(gpu->act_values(obs.data(), 12), std::invalid_argument);
}
