// The whole C51 step on the GPU: CUDA vs the CPU reference over 100 steps, graph replay vs the
// same stages uncaptured (bit for bit), one capture, and zero syncs counted with CUPTI callbacks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#if DQN_HAVE_CUPTI
#include <cupti.h>
#endif

#include "engine.hpp"
#include "pipeline_parse.hpp"
#include "plugin_loader.hpp"

namespace {
using namespace dqn;

const PluginLoader& loader() {
  static PluginLoader l(PluginLoader::search_path_from(""));
  return l;
}

// Awkward sizes (nothing a multiple of 32) around the ref workload's shape.
std::string pipeline(const std::string& precision, const std::string& extra = "") {
  return "name: gpu-test\nseed: 5\nbackend: cuda\nprecision: " + precision + R"(
network: {state: 37, trunk: [61, 45], head_hidden: 29, branches: 3, actions: 5, atoms: 51, v_min: -10, v_max: 10}
heads:
  - {plugin: c51, role: primary}
batch: 67
gamma: 0.99
spectral_norm: {enabled: true, sigma_max: 2}
target: {polyak: 0.005}
report_every: 10
)" + extra;
}

PipelineSpec parse(const std::string& text) {
  ParseOptions o;
  o.plugins = &loader();
  return parse_pipeline(text, "gpu-test.yaml", o);
}

std::unique_ptr<Engine> make(const PipelineSpec& spec, BackendKind b) {
  EngineOptions eo;
  eo.backend = b;
  auto e = std::make_unique<Engine>(spec, loader(), eo);
  e->init_weights(spec.seed);
  e->set_batch(HostBatch::random(spec, 9));
  return e;
}

double rel(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0, r = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d += (a[i] - b[i]) * (a[i] - b[i]);
    r += b[i] * b[i];
  }
  return std::sqrt(d / std::max(r, 1e-300));
}

bool bit_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}
}  // namespace

TEST_CASE("gpu.step.matches_cpu") {
  // Tolerances on ‖Δ‖/‖ref‖ after 100 steps. fp32: summation order only. tf32 keeps 10 mantissa
  // bits in the GEMM operands (≈5e-4 per product) and bf16 7 bits (≈4e-3), and Adam's
  // normalised update turns small gradient differences into lr-sized parameter differences, so
  // those get looser bounds.
  struct Case { const char* precision; double params, loss; };
  for (const Case c : {Case{"fp32", 2e-4, 1e-4}, Case{"tf32", 5e-3, 5e-3}, Case{"bf16", 3e-2, 3e-2}}) {
    CAPTURE(c.precision);
    const PipelineSpec spec = parse(pipeline(c.precision));
    auto gpu = make(spec, BackendKind::cuda);
    auto cpu = make(spec, BackendKind::cpu);
    // One step: everything from identical weights.
    gpu->step();
    cpu->step();
    StepReport rg = gpu->read_report(), rc = cpu->read_report();
    CHECK(rg.losses[0] == doctest::Approx(rc.losses[0]).epsilon(c.loss));
    CHECK(rg.grad_norms[0] == doctest::Approx(rc.grad_norms[0]).epsilon(10 * c.loss));
    {
      std::vector<double> tg(rg.td_error.begin(), rg.td_error.end()), tc(rc.td_error.begin(), rc.td_error.end());
      CHECK(rel(tg, tc) < c.loss);
    }
    for (int i = 1; i < 100; ++i) {
      gpu->step();
      cpu->step();
    }
    rg = gpu->read_report();
    rc = cpu->read_report();
    CHECK(rg.adam_step == 100);
    CHECK(rg.skipped_steps == 0);
    CHECK(rg.losses[0] == doctest::Approx(rc.losses[0]).epsilon(10 * c.loss));
    for (const char* b : {"params", "target", "adam.m", "sn.u.trunk.1.weight"}) {
      INFO(b);
      CHECK(rel(gpu->host_buffer(b), cpu->host_buffer(b)) < (std::string(b) == "adam.m" ? 20 : 1) * c.params);
    }
    CHECK(gpu->captures() == 1);
  }
}

TEST_CASE("gpu.step.replay_equals_uncaptured") {
  for (const char* p : {"fp32", "tf32", "bf16"}) {
    CAPTURE(p);
    const PipelineSpec spec = parse(pipeline(p));
    auto a = make(spec, BackendKind::cuda);
    auto b = make(spec, BackendKind::cuda);
    for (int i = 0; i < 20; ++i) {
      a->step();
      b->step_uncaptured();
    }
    for (const char* buf : {"params", "target", "adam.m", "adam.v", "report/td_error", "report/losses"}) {
      INFO(buf);
      CHECK(bit_equal(a->host_buffer(buf), b->host_buffer(buf)));
    }
  }
}

TEST_CASE("gpu.step.fraction_and_lr_change_without_recapture") {
  const PipelineSpec spec = parse(pipeline("fp32", "max_grad_norm: 0.001\n"));
  auto e = make(spec, BackendKind::cuda);
  e->step();
  const double n = e->read_report().grad_norms[0];
  e->set_fraction(0, 0.5);
  e->step();
  const StepReport r = e->read_report();
  CHECK(r.clips[0] == doctest::Approx(std::min(1.0, 0.5 * 0.001 / (r.grad_norms[0] + 1e-6))).epsilon(1e-5));
  CHECK(n > 0);
  e->set_lr(0.5);
  e->step();
  CHECK(e->captures() == 1);
}

TEST_CASE("gpu.step.nan_skips_on_device") {
  const PipelineSpec spec = parse(pipeline("tf32"));
  auto e = make(spec, BackendKind::cuda);
  e->step();
  const auto p = e->host_buffer("params"), t = e->host_buffer("target"), m = e->host_buffer("adam.m");
  e->host_write("batch/is_weights", 3, std::nan(""));
  e->step();
  CHECK(bit_equal(e->host_buffer("params"), p));
  CHECK(bit_equal(e->host_buffer("target"), t));
  CHECK(bit_equal(e->host_buffer("adam.m"), m));
  const StepReport r = e->read_report();
  CHECK(r.skipped_steps == 1);
  CHECK(r.adam_step == 1);
}

#if DQN_HAVE_CUPTI
namespace {
std::mutex g_mu;
std::map<std::string, long> g_calls;
bool g_on = false;

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (cb->callbackSite != CUPTI_API_ENTER) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_on) return;
  g_calls[std::string(domain == CUPTI_CB_DOMAIN_RUNTIME_API ? "runtime:" : "driver:") + cb->functionName]++;
}
}  // namespace

TEST_CASE("gpu.step.zero_syncs") {
  // Over 1,000 steps the only CUDA calls are graph launches and the asynchronous report copies
  // (a copy and an event record each report_every steps): no synchronize, no allocation, no
  // blocking copy, no query of anything.
  const PipelineSpec spec = parse(pipeline("tf32"));
  auto e = make(spec, BackendKind::cuda);
  for (int i = 0; i < 10; ++i) e->step();
  e->read_report();
  CUpti_SubscriberHandle sub;
  REQUIRE(cuptiSubscribe(&sub, reinterpret_cast<CUpti_CallbackFunc>(on_api), nullptr) == CUPTI_SUCCESS);
  REQUIRE(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API) == CUPTI_SUCCESS);
  REQUIRE(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_DRIVER_API) == CUPTI_SUCCESS);
  const auto lookups = e->registry().lookups();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_on = true;
  }
  for (int i = 0; i < 1000; ++i) e->step();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_on = false;
  }
  cuptiUnsubscribe(sub);
  long launches = 0, copies = 0, records = 0;
  for (const auto& [name, n] : g_calls) {
    MESSAGE(name << " × " << n);
    if (name.find("GraphLaunch") != std::string::npos) launches += n;
    else if (name.find("MemcpyAsync") != std::string::npos || name.find("MemcpyDtoHAsync") != std::string::npos) copies += n;
    else if (name.find("EventRecord") != std::string::npos) records += n;
    else FAIL_CHECK("unexpected CUDA call in the step loop: " << name << " × " << n);
  }
  CHECK(launches >= 1000);
  CHECK(launches <= 2000);  // runtime + driver entry of the same call at most
  CHECK(copies <= 2 * (1000 / spec.report_every));
  CHECK(records <= 2 * (1000 / spec.report_every));
  CHECK(e->registry().lookups() == lookups);
  CHECK(e->registry().lookups_after_seal() == 0);
  CHECK(e->captures() == 1);
  // The copies land asynchronously; once the stream has drained, the newest report is there.
  e->runtime().synchronize();
  const auto rep = e->latest_report();
  REQUIRE(rep.has_value());
  CHECK(rep->step_index == 1010);
  CHECK(rep->losses[0] > 0);
}
#endif

TEST_CASE("gpu.step.aux_heads_match_cpu") {
  // Every auxiliary head plugin present composes with c51 in one graph and matches the CPU.
  std::string heads = "  - {plugin: c51, role: primary}\n";
  for (const char* aux : {"cql", "ensemble", "iqn"})
    if (loader().find(aux)) heads += std::string("  - {plugin: ") + aux + ", role: auxiliary}\n";
  if (heads.find("auxiliary") == std::string::npos) return;
  std::string text = pipeline("fp32");
  const auto at = text.find("heads:\n");
  const auto end = text.find("batch:");
  text = text.substr(0, at) + "heads:\n" + heads + text.substr(end);
  const PipelineSpec spec = parse(text);
  auto gpu = make(spec, BackendKind::cuda);
  auto cpu = make(spec, BackendKind::cpu);
  for (int i = 0; i < 50; ++i) {
    gpu->step();
    cpu->step();
  }
  const StepReport rg = gpu->read_report(), rc = cpu->read_report();
  REQUIRE(rg.heads.size() == rc.heads.size());
  for (std::size_t h = 0; h < rg.heads.size(); ++h) {
    INFO(rg.heads[h]);
    CHECK(rg.losses[h] == doctest::Approx(rc.losses[h]).epsilon(1e-3));
    CHECK(rg.grad_norms[h] == doctest::Approx(rc.grad_norms[h]).epsilon(1e-2));
  }
  CHECK(rel(gpu->host_buffer("params"), cpu->host_buffer("params")) < 2e-4);
  CHECK(gpu->captures() == 1);
}
