// Plugins on the GPU: a stage that synchronises or allocates while the step is captured is refused
// naming its plugin and stage (the fixture capture_probe); one that only launches its kernel runs;
// the act step (the trunk, the primary's act stage and the argmax, a graph of its own) against the
// CPU reference, and acting with the newest parameters after steps; the QR-DQN example plugin
// (examples/plugins/qr_dqn, built among the fixtures) as the primary against its host twin.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/engine_access.hpp"
#include "core/plugin_loader.hpp"
#include "engine_gpu_util.hpp"

namespace {
using namespace dqn;

using engine_gpu::loader;
using engine_gpu::parse;
using engine_gpu::rel;

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
  init_weights(*e, spec.seed);
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
  set_batch(*e, HostBatch::random(spec, 4));
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
  REQUIRE(gpu->actor().rows() == 11);  // the larger of num_envs and eval.episodes
  const int S = 37, D = 3, A = 5;
  for (const int rows : {1, 5, 11}) {
    CAPTURE(rows);
    const auto obs = observations(rows, S, unsigned(rows));
    const auto qg = gpu->actor().act_values(obs.data(), rows);
    const auto qc = cpu->actor().act_values(obs.data(), rows);
    REQUIRE(qg.size() == std::size_t(rows * D * A));
    double worst = 0;
    for (std::size_t i = 0; i < qg.size(); ++i) worst = std::max(worst, std::fabs(double(qg[i]) - double(qc[i])));
    CHECK(worst < 1e-4);  // fp32 GEMMs against the CPU's double sums, Q within [-10, 10]
    std::vector<std::int32_t> act(std::size_t(rows * D), -1);
    gpu->actor().act(obs.data(), rows, act.data());
    for (int k = 0; k < rows * D; ++k) {
      const float* row = qg.data() + std::size_t(k) * A;
      CHECK(act[std::size_t(k)] == int(std::max_element(row, row + A) - row));
    }
  }
  // After training steps the act step reads the new online parameters (no copy to refresh).
  const auto obs = observations(4, S, 9);
  const auto before = gpu->actor().act_values(obs.data(), 4);
  set_batch(*gpu, HostBatch::random(spec, 2));
  for (int i = 0; i < 20; ++i) gpu->step();
  const auto after = gpu->actor().act_values(obs.data(), 4);
  double moved = 0;
  for (std::size_t i = 0; i < before.size(); ++i) moved = std::max(moved, std::fabs(double(after[i]) - double(before[i])));
  CHECK(moved > 1e-6);
  CHECK(gpu->captures() == 1);
  CHECK_THROWS_AS(gpu->actor().act_values(obs.data(), 12), std::invalid_argument);
}

TEST_CASE("gpu.plugins.qr_dqn: the example primary's own kernels against its host twin, 100 steps") {
  // The tolerances of gpu.step.matches_cpu (‖Δ‖/‖ref‖): fp32 the summation order only; tf32 the
  // GEMM operands' 10 mantissa bits, which Adam's normalised update turns into lr-sized steps.
  REQUIRE_MESSAGE(loader().find("qr_dqn"), "the qr_dqn example is not built among the test fixtures");
  struct Case {
    const char* precision;
    double params, loss;
  };
  for (const Case c : {Case{"fp32", 2e-4, 1e-4}, Case{"tf32", 5e-3, 5e-3}}) {
    INFO("precision " << c.precision);
    std::string text = pipeline(c.precision);
    const std::string c51 = "  - {plugin: c51, role: primary}\n";
    text.replace(text.find(c51), c51.size(), "  - {plugin: qr_dqn, role: primary, quantiles: 17, kappa: 1.0}\n");
    const PipelineSpec spec = parse(text);
    auto gpu = make(spec, BackendKind::cuda);
    auto cpu = make(spec, BackendKind::cpu);
    const HostBatch batch = HostBatch::random(spec, 6);
    set_batch(*gpu, batch);
    set_batch(*cpu, batch);
    gpu->step();
    cpu->step();
    StepReport rg = gpu->read_report(), rc = cpu->read_report();
    CHECK(rg.heads.at(0) == "qr_dqn");
    CHECK(rg.losses[0] > 0);
    CHECK(rg.losses[0] == doctest::Approx(rc.losses[0]).epsilon(c.loss));
    CHECK(rg.grad_norms[0] == doctest::Approx(rc.grad_norms[0]).epsilon(10 * c.loss));
    CHECK(rel(std::vector<double>(rg.td_error.begin(), rg.td_error.end()),
              std::vector<double>(rc.td_error.begin(), rc.td_error.end())) < c.loss);
    for (int i = 1; i < 100; ++i) {
      gpu->step();
      cpu->step();
    }
    rg = gpu->read_report();
    rc = cpu->read_report();
    CHECK(rg.adam_step == 100);
    CHECK(rg.skipped_steps == 0);
    CHECK(rg.losses[0] == doctest::Approx(rc.losses[0]).epsilon(10 * c.loss));
    for (const char* b : {"params", "target"}) {
      INFO(std::string(b));
      CHECK(rel(host_buffer(*gpu, b), host_buffer(*cpu, b)) < c.params);
    }
    // Acting through the example's own act stage, on both backends.
    const auto obs = observations(5, 37, 2);
    const auto qg = gpu->actor().act_values(obs.data(), 5), qc = cpu->actor().act_values(obs.data(), 5);
    CHECK(rel(std::vector<double>(qg.begin(), qg.end()), std::vector<double>(qc.begin(), qc.end())) < 10 * c.params);
    CHECK(gpu->captures() == 1);
  }
}
