// The whole step on the GPU: CUDA vs the CPU reference over 100 steps (C51 alone, and with each
// auxiliary head and all of them), graph replay vs the same stages uncaptured (bit for bit),
// budget fractions changed without re-capture, one capture, and zero syncs counted with CUPTI
// callbacks (C51 alone and all four heads).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#if DQN_HAVE_CUPTI
#include <cupti.h>
#endif

#include "dqn/head.hpp"
#include "core/engine.hpp"
#include "pipeline/parse.hpp"
#include "core/plugin_loader.hpp"

namespace {
using namespace dqn;

const PluginLoader& loader() {
  static PluginLoader l(PluginLoader::search_path_from(""));
  return l;
}

// Awkward sizes (nothing a multiple of 32) around the ref workload's shape unless `network` and
// `batch` say otherwise; `aux` is head lines after the C51 primary (aux_heads()).
constexpr const char* kTestNetwork =
    "{state: 37, trunk: [61, 45], head_hidden: 29, branches: 3, actions: 5, atoms: 51, v_min: -10, v_max: 10}";
std::string pipeline(const std::string& precision, const std::string& extra = "", const std::string& aux = "",
                     const std::string& network = kTestNetwork, int batch = 67) {
  return "name: gpu-test\nseed: 5\nbackend: cuda\nprecision: " + precision + "\nnetwork: " + network + R"(
heads:
  - {plugin: c51, role: primary}
)" + aux + "batch: " + std::to_string(batch) + R"(
gamma: 0.99
spectral_norm: {enabled: true, sigma_max: 2}
target: {polyak: 0.005}
report_every: 10
)" + extra;
}

// pipelines/ref.yaml's sizes (B = 256) and, for ref_pipeline's aux, its auxiliary heads (K = 4,
// N = N' = 32, E = 64), enabled.
constexpr const char* kRefAuxHeads =
    "  - {plugin: iqn, role: auxiliary, budget: 0.2, quantiles: 32, target_quantiles: 32, embed: 64}\n"
    "  - {plugin: ensemble, role: auxiliary, budget: 0.1, members: 4}\n"
    "  - {plugin: cql, role: auxiliary, budget: 0.1, alpha: 1.0}\n";
std::string ref_pipeline(const std::string& aux = "", const std::string& precision = "tf32") {
  return pipeline(precision, "", aux,
                  "{state: 64, trunk: [256, 256], head_hidden: 128, branches: 3, actions: 5, atoms: 51, v_min: -10, "
                  "v_max: 10}",
                  256);
}

// The auxiliary heads at small awkward sizes (IQN: N = 7 online and N' = 9 target samples, so a
// mix-up of the two shows, and E = 13; three ensemble members), 0.1 of the budget each: the
// primary keeps 0.9 beside one of them and 0.7 beside all three.
struct AuxHead {
  const char* plugin;
  const char* line;
};
const AuxHead kAuxHeads[] = {
    {"iqn", "  - {plugin: iqn, role: auxiliary, budget: 0.1, quantiles: 7, target_quantiles: 9, embed: 13, kappa: 1.0}\n"},
    {"ensemble", "  - {plugin: ensemble, role: auxiliary, budget: 0.1, members: 3}\n"},
    {"cql", "  - {plugin: cql, role: auxiliary, budget: 0.1, alpha: 1.0}\n"},
};

// The head lines of the named auxiliaries, in that order; nullopt (and a message) when one of their
// plugins is not built, for the caller to skip.
std::optional<std::string> aux_heads(const std::vector<std::string>& names) {
  std::string lines;
  for (const auto& n : names) {
    if (!loader().find(n)) {
      MESSAGE("plugin '" << n << "' not found: skipped");
      return std::nullopt;
    }
    const auto* a = std::find_if(std::begin(kAuxHeads), std::end(kAuxHeads),
                                 [&](const AuxHead& x) { return n == x.plugin; });
    REQUIRE_MESSAGE(a != std::end(kAuxHeads), "no test configuration for auxiliary head '" << n << "'");
    lines += a->line;
  }
  return lines;
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

/// 20 replayed steps on each of two engines, a step of one then of the other.
void step_both(Engine& a, Engine& b) {
  for (int i = 0; i < 20; ++i) {
    a.step();
    b.step();
  }
}

/// Sets (value not null) an environment variable for one scope and puts back what it was, so a
/// switch given to the whole binary (DQN_TILE_GEMM=0 test_gpu_step) still holds in the
/// cases after one that sets its own.
class EnvOverride {
 public:
  EnvOverride(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
    if (value) setenv(name, value, 1);
  }
  ~EnvOverride() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }
  EnvOverride(const EnvOverride&) = delete;
  EnvOverride& operator=(const EnvOverride&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};
/// One EnvOverride per name, each to `value` (null: left as it is, put back after).
std::vector<std::unique_ptr<EnvOverride>> env_overrides(std::initializer_list<const char*> names, const char* value) {
  std::vector<std::unique_ptr<EnvOverride>> o;
  for (const char* name : names) o.push_back(std::make_unique<EnvOverride>(name, value));
  return o;
}
/// Two engines of spec, made with the switch `name` at `off` and at `on` (a backend reads its
/// switches when it is made), after 20 replayed steps each.
std::pair<std::unique_ptr<Engine>, std::unique_ptr<Engine>> switch_pair(const PipelineSpec& spec, const char* name,
                                                                        const char* off, const char* on) {
  std::unique_ptr<Engine> a, b;
  {
    const EnvOverride o(name, off);
    a = make(spec, BackendKind::cuda);
  }
  {
    const EnvOverride o(name, on);
    b = make(spec, BackendKind::cuda);
  }
  step_both(*a, *b);
  return {std::move(a), std::move(b)};
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

/// Whether describe() text d says the cluster update runs (a message where it does not: nothing
/// to compare on this device).
bool cluster_update_runs(const std::string& d) {
  if (d.find("update cluster") != std::string::npos) return true;
  MESSAGE("the cluster update does not run on this device: nothing to compare");
  return false;
}

// Each named buffer the same to the bit in both engines (a check per buffer, named in its message).
void check_same_bits(Engine& a, Engine& b, std::initializer_list<const char*> buffers) {
  for (const char* buf : buffers) {
    INFO(std::string(buf));
    CHECK(bit_equal(a.host_buffer(buf), b.host_buffer(buf)));
  }
}

// |a − b| ≤ tol·max(|a|, |b|): relative. (doctest's Approx adds 1 to its scale, which makes it an
// absolute bound for values below 1, as grad norms and clip factors are.)
bool near(double a, double b, double tol) { return std::fabs(a - b) <= tol * std::max(std::fabs(a), std::fabs(b)); }

// What one CUDA report may differ from the CPU's by (relative; td_error as ‖Δ‖/‖ref‖).
struct ReportTol {
  double loss;      ///< every head's loss but IQN's
  double iqn_loss;  ///< IQN's (see gpu.step.aux_heads_match_cpu)
  double norm;      ///< grad norms, and clip factors (clip = f·G/(norm + 1e-6) inherits its error)
  double td;
};

// The newest reports of both engines, head by head; `what` names the step in the messages.
void compare_reports(Engine& gpu, Engine& cpu, const ReportTol& t, const char* what) {
  INFO(std::string(what));  // (doctest 2.4 logs a bare const char* as a pointer)
  const StepReport rg = gpu.read_report(), rc = cpu.read_report();
  REQUIRE(rg.heads == rc.heads);
  REQUIRE(rg.losses.size() == rg.heads.size());
  REQUIRE(rc.losses.size() == rc.heads.size());
  for (std::size_t h = 0; h < rg.heads.size(); ++h) {
    INFO("head " << rg.heads[h]);
    const double lt = rg.heads[h] == "iqn" ? t.iqn_loss : t.loss;
    CHECK_MESSAGE(near(rg.losses[h], rc.losses[h], lt), "loss: cuda " << rg.losses[h] << ", cpu " << rc.losses[h]);
    CHECK_MESSAGE(near(rg.grad_norms[h], rc.grad_norms[h], t.norm),
                  "grad norm: cuda " << rg.grad_norms[h] << ", cpu " << rc.grad_norms[h]);
    CHECK_MESSAGE(near(rg.clips[h], rc.clips[h], t.norm), "clip: cuda " << rg.clips[h] << ", cpu " << rc.clips[h]);
  }
  const std::vector<double> tg(rg.td_error.begin(), rg.td_error.end()), tc(rc.td_error.begin(), rc.td_error.end());
  REQUIRE(tg.size() == tc.size());
  CHECK(rel(tg, tc) < t.td);
  CHECK(rg.skipped_steps == 0);
  CHECK(rc.skipped_steps == 0);
}

// a* is an argmax: where the backends pick different actions for some pair (a tie within
// rounding), a step's reports are compared with the looser tolerances of diverged runs.
bool same_a_star(Engine& gpu, Engine& cpu) {
  const auto ag = gpu.host_buffer(buf::a_star), ac = cpu.host_buffer(buf::a_star);
  long differ = 0;
  for (std::size_t i = 0; i < ag.size() && i < ac.size(); ++i) differ += ag[i] != ac[i];
  if (differ) MESSAGE(differ << " of " << ag.size() << " a* differ: compared with the looser tolerances");
  return differ == 0 && ag.size() == ac.size();
}
}  // namespace

TEST_CASE("gpu.step.matches_cpu") {
  // Tolerances on ‖Δ‖/‖ref‖ after 100 steps. fp32: summation order only. tf32 keeps 10 mantissa
  // bits in the GEMM operands (≈5e-4 per product) and bf16 7 bits (≈4e-3), and Adam's
  // normalised update turns small gradient differences into lr-sized parameter differences, so
  // those get looser bounds.
  // tf32 runs four times: with the default kernels (GEMMs on cuBLASLt or tile_gemm, as tuned),
  // cuBLASLt only (DQN_TILE_GEMM=0), tile_gemm always (=1) and the trunk's top mask in the
  // head's GEMM (DQN_HEAD_MASK=1; the CPU engine keeps its stages: the same numbers,
  // heads_test); fp32 also with the loss one warp a (sample, branch) (DQN_LOSS_WARPS=1; two by
  // default); tf32 also with tile_gemm's split-k shape wherever it fits (DQN_TILE_GEMM=32x32k2);
  // tf32 and bf16 also with both networks' trunk layers in one GEMM each (DQN_TARGET_MERGE=1,
  // read when the engine is built: the GPU engine merged, the CPU one not).
  struct Case {
    const char* precision;
    double params, loss;
    std::vector<std::pair<const char*, const char*>> switches;  // set while the GPU engine is made
  };
  const Case cases[] = {
      {"fp32", 2e-4, 1e-4, {}},
      {"tf32", 5e-3, 5e-3, {}},
      {"tf32", 5e-3, 5e-3, {{"DQN_TILE_GEMM", "0"}}},
      {"tf32", 5e-3, 5e-3, {{"DQN_TILE_GEMM", "1"}}},
      {"bf16", 3e-2, 3e-2, {}},
      {"fp32", 2e-4, 1e-4, {{"DQN_LOSS_WARPS", "1"}}},
      {"tf32", 5e-3, 5e-3, {{"DQN_HEAD_MASK", "1"}}},
      {"tf32", 5e-3, 5e-3, {{"DQN_TILE_GEMM", "32x32k2"}}},
      {"tf32", 5e-3, 5e-3, {{"DQN_TARGET_MERGE", "1"}}},
      {"bf16", 3e-2, 3e-2, {{"DQN_TARGET_MERGE", "1"}}},
  };
  for (const Case& c : cases) {
    std::string named;
    for (const auto& [name, value] : c.switches) named += std::string(", ") + name + "=" + value;
    INFO("precision " << std::string(c.precision) << named);
    const PipelineSpec spec = parse(pipeline(c.precision));
    // read when the backend (the heads: DQN_HEAD_MASK; the engine: DQN_TARGET_MERGE) is made;
    // the CPU engine gets none
    std::unique_ptr<Engine> gpu;
    {
      std::deque<EnvOverride> env;
      for (const auto& [name, value] : c.switches) env.emplace_back(name, value);
      gpu = make(spec, BackendKind::cuda);
    }
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
      INFO(std::string(b));
      CHECK(rel(gpu->host_buffer(b), cpu->host_buffer(b)) < (std::string(b) == "adam.m" ? 20 : 1) * c.params);
    }
    CHECK(gpu->captures() == 1);
  }
}

TEST_CASE("gpu.step.replay_equals_uncaptured") {
  // tf32 also with every switch below at once (the distribution a warp per action everywhere;
  // the loss's one warp, the default being two; the projection a stage of its own; the trunk's
  // top mask in the head's GEMM; both networks' trunk layers in one GEMM each)
  const std::pair<const char*, const char*> switches[] = {{"DQN_WARP_HEAD", "action"},
                                                          {"DQN_LOSS_WARPS", "1"},
                                                          {"DQN_C51_PROJECT", "1"},
                                                          {"DQN_HEAD_MASK", "1"},
                                                          {"DQN_TARGET_MERGE", "1"}};
  for (const auto& [p, fused] : {std::pair<const char*, bool>{"fp32", false}, {"tf32", false}, {"tf32", true},
                                 {"bf16", false}}) {
    INFO("precision " << std::string(p) << (fused ? ", with the switches" : ""));
    const PipelineSpec spec = parse(pipeline(p));
    std::deque<EnvOverride> env;
    if (fused)
      for (const auto& [name, value] : switches) env.emplace_back(name, value);
    auto a = make(spec, BackendKind::cuda);
    auto b = make(spec, BackendKind::cuda);
    for (int i = 0; i < 20; ++i) {
      a->step();
      b->step_uncaptured();
    }
    check_same_bits(*a, *b, {"params", "target", "adam.m", "adam.v", "report/td_error", "report/losses"});
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

TEST_CASE("gpu.step.aux_fraction_change_without_recapture") {
  // All four heads; each auxiliary's fraction changed in turn between steps: the next report's clip
  // factor of every head is min(1, f·G/(‖g_h‖ + 1e-6)) with the fractions as they now are, and the
  // graph is never re-captured. With G = 0.25 (norms about c51 0.1, iqn 0.2, ensemble 0.06, cql
  // 0.05) the changes move clips both ways: iqn 0.1 → 0.02 and cql 0.1 → 0.03 clip harder, the
  // ensemble 0.1 → 0.8 is no longer clipped (clip 1).
  const auto aux = aux_heads({"iqn", "ensemble", "cql"});
  if (!aux) return;
  const double G = 0.25;
  const PipelineSpec spec = parse(pipeline("fp32", "max_grad_norm: 0.25\n", *aux));
  auto e = make(spec, BackendKind::cuda);
  REQUIRE(e->head_names() == std::vector<std::string>{"c51", "iqn", "ensemble", "cql"});
  // The kernel forms the clip in double from the float fraction and G and rounds it and the norm
  // to float: recomputed from the reported norm it is off by a few float roundings (≲ 3e-7), so
  // 1e-5 relative.
  auto check_clips = [&](const StepReport& r) {
    REQUIRE(r.clips.size() == 4);
    for (std::size_t h = 0; h < 4; ++h) {
      INFO("head " << r.heads[h] << ", fraction " << e->fractions()[h] << ", norm " << r.grad_norms[h]);
      CHECK(r.grad_norms[h] > 0);
      CHECK(r.fractions[h] == e->fractions()[h]);
      const double want = std::min(1.0, e->fractions()[h] * G / (r.grad_norms[h] + 1e-6));
      CHECK_MESSAGE(near(r.clips[h], want, 1e-5), "clip " << r.clips[h] << ", want " << want);
    }
  };
  e->step();
  check_clips(e->read_report());
  // The fractions may not sum above 1: the primary gives up most of its share first (its clip
  // stays below 1: 0.1·G over a norm of about 0.1), and CQL's cut comes before the ensemble's raise.
  e->set_fraction(0, 0.1);
  struct Change { std::size_t head; double f; };
  for (const Change c : {Change{1, 0.02}, Change{3, 0.03}, Change{2, 0.8}}) {
    const double old_f = e->fractions()[c.head];
    e->set_fraction(c.head, c.f);
    CHECK(e->fractions()[c.head] == c.f);
    e->step();
    const StepReport r = e->read_report();
    INFO("changed " << r.heads[c.head] << " from " << old_f << " to " << c.f);
    check_clips(r);
    // The change shows: the old fraction would have given a clearly different clip.
    const double n = r.grad_norms[c.head];
    CHECK(!near(std::min(1.0, old_f * G / (n + 1e-6)), std::min(1.0, c.f * G / (n + 1e-6)), 0.1));
  }
  e->set_lr(0.5);
  e->step();
  check_clips(e->read_report());
  CHECK(e->captures() == 1);
  // The four heads' stages fit the lanes: no stage of the captured step waits for one it does
  // not depend on.
  CHECK(e->false_dependencies() == 0);
  CHECK(e->lanes_used() > 1);
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

// Over 1,000 steps the only CUDA calls are graph launches and the asynchronous report copies
// (a copy and an event record each report_every steps): no synchronize, no allocation, no
// blocking copy, no query of anything.
void check_zero_syncs(const std::string& text) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_calls.clear();  // nothing left from an earlier run
    g_on = false;
  }
  const PipelineSpec spec = parse(text);
  auto e = make(spec, BackendKind::cuda);
  for (int i = 0; i < 10; ++i) e->step();
  e->read_report();
  // Unsubscribed on every way out (a failed REQUIRE included): CUPTI takes one subscriber at a time.
  struct Subscription {
    CUpti_SubscriberHandle handle{};
    bool active = false;
    ~Subscription() {
      if (active) cuptiUnsubscribe(handle);
    }
  } sub;
  REQUIRE(cuptiSubscribe(&sub.handle, reinterpret_cast<CUpti_CallbackFunc>(on_api), nullptr) == CUPTI_SUCCESS);
  sub.active = true;
  REQUIRE(cuptiEnableDomain(1, sub.handle, CUPTI_CB_DOMAIN_RUNTIME_API) == CUPTI_SUCCESS);
  REQUIRE(cuptiEnableDomain(1, sub.handle, CUPTI_CB_DOMAIN_DRIVER_API) == CUPTI_SUCCESS);
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
  cuptiUnsubscribe(sub.handle);
  sub.active = false;
  std::map<std::string, long> calls;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    calls.swap(g_calls);
  }
  long launches = 0, copies = 0, records = 0;
  for (const auto& [name, n] : calls) {
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
  REQUIRE(rep->heads.size() == e->head_names().size());
  for (std::size_t h = 0; h < rep->heads.size(); ++h) {
    INFO("head " << rep->heads[h]);
    CHECK(std::isfinite(rep->losses[h]));
    CHECK(std::isfinite(rep->grad_norms[h]));
  }
}
}  // namespace

TEST_CASE("gpu.step.zero_syncs") {
  SUBCASE("c51") { check_zero_syncs(pipeline("tf32")); }
  SUBCASE("c51 + iqn + ensemble + cql") {
    if (const auto aux = aux_heads({"iqn", "ensemble", "cql"})) check_zero_syncs(pipeline("tf32", "", *aux));
  }
}
#endif

TEST_CASE("gpu.step.aux_heads_match_cpu") {
  // Each auxiliary head beside the C51 primary, and all four together, in fp32: CUDA vs the CPU
  // reference after one step, after 100, and one more step from the GPU's state on both. With
  // G = 0.25 every auxiliary is clipped (clips about iqn 0.15, ensemble 0.4, cql 0.5) and the
  // primary is not (0.7·G = 0.175 against a norm of about 0.1): both sides of the min are compared.
  //
  // Tolerances are relative. "Measured": the CPU reference against itself with its parameters
  // perturbed by 1e-7 or 1e-6 relative every step (fp32 rounding, which the GPU's summation order
  // and GEMM algorithms redo differently), worst of 4 seeds × these 4 pipelines and C51 alone.
  // - One step from identical state: fp32 summation order only, so gpu.step.matches_cpu's fp32
  //   values (losses and td_error 1e-4, grad norms 1e-3); measured ≤ 2e-7.
  // - After 100 steps the trajectories have parted: where a trunk ReLU's pre-activation crosses 0
  //   in one run and not the other, that step's gradient jumps by up to 7 %, and Adam turns such
  //   differences (and those of near-zero gradients) into lr-sized parameter differences.
  const ReportTol one_step{1e-4, 1e-4, 1e-3, 1e-4};
  const ReportTol hundred{
      1e-3,  // losses: gpu.step.matches_cpu's after 100 steps; measured ≤ 1e-6
      3e-2,  // IQN's loss: a* is an argmax, and a near tie (gaps down to 1e-5 relative occur)
             // resolved the other way changes IQN's target quantiles for that (sample, branch):
             // one such flip of the 201 measured 4.2e-3; 3e-2 leaves room for several
      3e-2,  // grad norms and clips: ReLU flips in the last step's trunk; measured ≤ 5.3e-3
      1e-3,  // td_error: as the losses; measured ≤ 2e-5
  };
  struct BufTol {
    const char* name;
    double tol;
  };
  const BufTol buffers[] = {
      // Measured ≤ 2.9e-4 (the CPU's own f32 vs f64 already 1.8e-4 with cql; 7.2e-4 at a 1e-5
      // stress): gpu.step.matches_cpu's 2e-4 for C51 alone would sit on the noise.
      {"params", 2e-3},
      // The Polyak average (τ = 0.005) of params: measured ≤ 4e-5 (7.9e-5 at the 1e-5 stress).
      {"target", 4e-4},
      // The EMA of the last ~10 gradients keeps the ReLU-flip jumps: measured ≤ 9.6e-3 at both
      // noise levels (saturated; C51 alone 7.7e-3), so 5e-2.
      {"adam.m", 5e-2},
      // The EMA of g² over all the steps (β2 = 0.999), dominated by the large gradients: ≤ 1.9e-4.
      {"adam.v", 1e-3},
  };
  struct Case {
    const char* name;
    std::vector<std::string> aux;
  };
  const Case cases[] = {
      {"c51 + cql", {"cql"}},
      {"c51 + ensemble", {"ensemble"}},
      {"c51 + iqn", {"iqn"}},
      {"c51 + iqn + ensemble + cql", {"iqn", "ensemble", "cql"}},
  };
  for (const Case& c : cases) {
    INFO("heads: " << std::string(c.name));
    const auto aux = aux_heads(c.aux);
    if (!aux) continue;
    const PipelineSpec spec = parse(pipeline("fp32", "max_grad_norm: 0.25\n", *aux));
    auto gpu = make(spec, BackendKind::cuda);
    auto cpu = make(spec, BackendKind::cpu);
    std::vector<std::string> names{"c51"};
    names.insert(names.end(), c.aux.begin(), c.aux.end());
    REQUIRE(gpu->head_names() == names);
    REQUIRE(cpu->head_names() == names);
    gpu->step();
    cpu->step();
    compare_reports(*gpu, *cpu, same_a_star(*gpu, *cpu) ? one_step : hundred, "step 1");

    for (int i = 1; i < 100; ++i) {
      gpu->step();
      cpu->step();
    }
    CHECK(gpu->read_report().adam_step == 100);
    CHECK(cpu->read_report().adam_step == 100);
    compare_reports(*gpu, *cpu, hundred, "step 100");
    for (const BufTol& b : buffers) {
      INFO("buffer " << std::string(b.name));
      const auto g = gpu->host_buffer(b.name), r = cpu->host_buffer(b.name);
      REQUIRE(g.size() == r.size());
      const double e = rel(g, r);
      CHECK_MESSAGE(e < b.tol, "‖Δ‖/‖ref‖ = " << e);
    }

    // Step 101 from the GPU's state on both (weights, target, Adam moments and step, sn.u): each
    // head's loss, gradient norm and clip at trained weights, with one-step tolerances again.
    cpu->load_weights(gpu->save_state(false));
    gpu->step();
    cpu->step();
    compare_reports(*gpu, *cpu, same_a_star(*gpu, *cpu) ? one_step : hundred, "step 101 from the GPU's state");
    CHECK(gpu->read_report().adam_step == 101);
    CHECK(gpu->captures() == 1);
  }
}

TEST_CASE("gpu.step.reference_sizes_match_cpu") {
  // The benchmark's shapes (pipelines/ref.yaml: B = 256, trunk 256 × 256, head 128; with all four
  // heads K = 4, N = N' = 32, E = 64), whose kernels the small awkward sizes of the other cases do
  // not all reach: GEMM shapes autotuned at these sizes, and the cluster update's paths — C51
  // alone resident at once, the four heads' grid in waves (no staging or kept rows; one tile of a
  // normed block in registers), trunk.1's blocks of two tiles. CUDA against the CPU reference from
  // the same weights and batch: each head's loss, norm and clip and td_error after one step, and
  // params, target, Adam's moments and every normed matrix's u after three. fp32 with the one-step
  // tolerances of gpu.step.aux_heads_match_cpu (summation order only: a power iteration run on
  // the matrix before Adam, as fbb2c52's deferred θ did in the four heads' update, moves u by
  // about 1e-3); tf32 with gpu.step.matches_cpu's (GEMM operands of 10 mantissa bits); bf16 (7
  // bits, and the operands converted in kernels of their own: 72–74 graph nodes) with
  // gpu.step.matches_cpu's too, C51 alone (the benchmark reports it for C51).
  struct Case {
    const char* precision;
    ReportTol one;
    double params, moments, u;
    bool aux;  // also with all four heads
  };
  const Case cases[] = {
      {"fp32", {1e-4, 1e-4, 1e-3, 1e-4}, 2e-4, 1e-2, 2e-4, true},
      {"tf32", {5e-3, 3e-2, 5e-2, 5e-3}, 5e-3, 2e-1, 5e-3, true},
      {"bf16", {3e-2, 3e-2, 3e-1, 3e-2}, 3e-2, 5e-1, 3e-2, false},
  };
  std::vector<std::pair<const char*, std::string>> heads{{"C51 alone", ""}};
  if (aux_heads({"iqn", "ensemble", "cql"})) heads.emplace_back("all four heads", kRefAuxHeads);
  for (const Case& c : cases) {
    for (const auto& [name, aux] : heads) {
      if (!aux.empty() && !c.aux) continue;
      INFO((std::string(c.precision) + ", " + name));
      const PipelineSpec spec = parse(ref_pipeline(aux, c.precision));
      auto gpu = make(spec, BackendKind::cuda);
      auto cpu = make(spec, BackendKind::cpu);
      gpu->step();
      cpu->step();
      const ReportTol diverged{10 * c.one.loss, c.one.iqn_loss, c.one.norm, 10 * c.one.td};
      compare_reports(*gpu, *cpu, same_a_star(*gpu, *cpu) ? c.one : diverged, "step 1");
      for (int i = 1; i < 3; ++i) {
        gpu->step();
        cpu->step();
      }
      std::vector<std::pair<std::string, double>> bufs{
          {"params", c.params}, {"target", c.params}, {"adam.m", c.moments}, {"adam.v", c.moments}};
      for (const char* m : {"trunk.0", "trunk.1", "c51.value.0", "c51.value.1", "c51.branch.0.0", "c51.branch.2.1"})
        bufs.emplace_back(std::string("sn.u.") + m + ".weight", c.u);
      for (const auto& [b, tol] : bufs) {
        INFO("buffer " << b);
        const auto g = gpu->host_buffer(b), r = cpu->host_buffer(b);
        REQUIRE(g.size() == r.size());
        const double e = rel(g, r);
        CHECK_MESSAGE(e < tol, "‖Δ‖/‖ref‖ = " << e);
      }
      CHECK(gpu->read_report().adam_step == 3);
      CHECK(gpu->captures() == 1);
    }
  }
}

TEST_CASE("gpu.step.early: DQN_PDL_JOINS, DQN_UPDATE_EARLY, _STAGE, _GATHER, _KEEPW, _PUSH and DQN_TILE_LDMATRIX "
          "change no result") {
  // Programmatic joins (the runtime's rewrite of a join's plain edges between two kernels into
  // programmatic ones), the cluster update's optimizer state loaded before its wait, its second
  // tiles staged in shared memory with Wᵀu summed from registers, its Wᵀu gathered by shares
  // (pushed to every block instead, with DQN_UPDATE_PUSH=1, which the "on" engine sets too), its
  // normed rows kept in shared memory, one head's g in float (DQN_UPDATE_ONEHEAD: C51 alone), the
  // normed θ stored once (DQN_UPDATE_DEFER_THETA),
  // and tile_gemm's fragments by ldmatrix change when kernels are placed, how loads are issued,
  // how g is rounded, when θ is written and how the code is laid out, never what they compute: 20
  // replayed steps with all off give the same bits as with all on (the defaults lie between:
  // DQN_UPDATE_EARLY, _ONEHEAD and _DEFER_THETA on, DQN_PDL_JOINS off,
  // DQN_UPDATE_STAGE, _GATHER, _KEEPW and _PUSH where the grid fits, DQN_TILE_LDMATRIX timed per
  // GEMM), C51 alone and with all three auxiliary heads (more lanes, more joins). Both engines run
  // every GEMM on tile_gemm's first shape, not autotuned (DQN_TILE_GEMM=1, DQN_GEMM_AUTOTUNE=0):
  // autotuning keys its choices by the ldmatrix mode, so the two engines could time their way to
  // different kernels (an H100 did so on 2026-12-05, the bits then differing in every buffer),
  // and with tile_gemm everywhere the ldmatrix switch reaches every GEMM. describe() says how
  // many joins were made.
  const EnvOverride tile("DQN_TILE_GEMM", "1"), untuned("DQN_GEMM_AUTOTUNE", "0");
  std::vector<std::string> auxes{""};
  if (const auto all = aux_heads({"iqn", "ensemble", "cql"})) auxes.push_back(*all);
  for (const std::string& aux : auxes) {
    INFO(std::string(aux.empty() ? "C51 alone" : "all four heads"));
    const PipelineSpec spec = parse(pipeline("tf32", "", aux));
    // every switch of this case, all off for `late`, all on for `early`
    const auto all = [](const char* value) {
      return env_overrides({"DQN_PDL_JOINS", "DQN_UPDATE_EARLY", "DQN_TILE_LDMATRIX", "DQN_UPDATE_STAGE",
                            "DQN_UPDATE_GATHER", "DQN_UPDATE_KEEPW", "DQN_UPDATE_PUSH", "DQN_UPDATE_ONEHEAD",
                            "DQN_UPDATE_DEFER_THETA"},
                           value);
    };
    std::unique_ptr<Engine> late;
    {
      const auto off = all("0");
      late = make(spec, BackendKind::cuda);
    }
    const auto on = all("1");
    auto early = make(spec, BackendKind::cuda);
    step_both(*late, *early);
    check_same_bits(*late, *early, {"params", "target", "adam.m", "adam.v", "report/td_error", "report/losses"});
    const std::string dl = late->runtime().describe(), de = early->runtime().describe();
    INFO("late: " << dl);
    INFO("early: " << de);
    CHECK(dl.find(", 0 programmatic join(s) in the graph (DQN_PDL_JOINS off)") != std::string::npos);
    const auto at = de.find(" programmatic join(s) in the graph");
    REQUIRE(at != std::string::npos);
    const auto comma = de.rfind(", ", at);
    REQUIRE(comma != std::string::npos);
    const long joins = std::stol(de.substr(comma + 2, at - comma - 2));
    CHECK(joins >= 0);
    // (none is no failure: a driver whose stream capture already made the joins programmatic, or
    // one that refused them, leaves none to make; dqn-trace shows which edges are programmatic)
    MESSAGE("programmatic joins made: " << joins);
    CHECK(late->runtime().graph_nodes() == early->runtime().graph_nodes());
  }
}

TEST_CASE("gpu.step.fit: DQN_UPDATE_STAGE, _GATHER, _KEEPW and _PUSH unset act where the update's grid fits, with "
          "the same results") {
  // Unset, the cluster update stages its normed blocks' second tiles in shared memory, keeps their
  // rows there and pushes its power iteration's sums to every block (or gathers Wᵀu by shares,
  // where the slots do not fit) where its grid is resident at once (the reference C51 step: 176
  // blocks), else none of them (the four heads' 690): 20 replayed steps give the same bits as
  // never (0; with DQN_UPDATE_ONEHEAD=0 and DQN_UPDATE_DEFER_THETA=0 too: one head's g by the
  // double sum, the normed θ stored beside Adam), C51 alone and with all four heads, and the same
  // graph. describe() says what the last launch did. And the four heads at the reference sizes
  // (pipelines/ref.yaml's network, K = 4, N = N' = 32, B = 256), whose update runs its plain
  // blocks in waves, so none of it applies there while the deferred store of θ and one tile in
  // registers still do: the path the benchmark's four heads take, which the small grid does not.
  struct Config {
    const char* name;
    std::string text;
    bool c51 = false;    // C51 alone
    bool waves = false;  // the update's grid runs in waves (more blocks than two an SM)
  };
  std::vector<Config> configs{{"C51 alone", pipeline("tf32"), true}};
  if (const auto all = aux_heads({"iqn", "ensemble", "cql"})) {
    configs.push_back({"all four heads", pipeline("tf32", "", *all)});
    configs.push_back({"all four heads, reference sizes", ref_pipeline(kRefAuxHeads), false, true});
  }
  for (const Config& cfg : configs) {
    INFO(std::string(cfg.name));
    const bool c51 = cfg.c51;
    const PipelineSpec spec = parse(cfg.text);
    std::unique_ptr<Engine> never;
    {
      const auto off = env_overrides({"DQN_UPDATE_STAGE", "DQN_UPDATE_GATHER", "DQN_UPDATE_KEEPW", "DQN_UPDATE_PUSH",
                                      "DQN_UPDATE_ONEHEAD", "DQN_UPDATE_DEFER_THETA"},
                                     "0");
      never = make(spec, BackendKind::cuda);
    }
    const auto fits = {"DQN_UPDATE_STAGE", "DQN_UPDATE_GATHER", "DQN_UPDATE_KEEPW", "DQN_UPDATE_PUSH"};
    const auto kept = env_overrides(fits, nullptr);  // (put back after)
    for (const char* name : fits) unsetenv(name);
    auto fit = make(spec, BackendKind::cuda);
    step_both(*never, *fit);
    const std::string d = fit->runtime().describe();
    INFO(d);
    if (!cluster_update_runs(d)) return;
    CHECK(d.find("second tiles staged where the grid fits (last launch: ") != std::string::npos);
    CHECK(d.find("gathered by shares where the grid fits (last launch: ") != std::string::npos);
    CHECK(d.find("normed rows kept in shared memory where the grid fits (last launch: ") != std::string::npos);
    CHECK(d.find("sums pushed to every block where the grid fits (last launch: ") != std::string::npos);
    if (c51) {  // the reference C51 step's 176 blocks stay resident with all of it
      CHECK(d.find("staged where the grid fits (last launch: yes)") != std::string::npos);
      CHECK(d.find("kept in shared memory where the grid fits (last launch: yes)") != std::string::npos);
      CHECK(d.find("pushed to every block where the grid fits (last launch: yes)") != std::string::npos);
    }
    if (cfg.waves)  // (690 blocks on an H100 or H200): no kept rows, so no deferred θ either
      CHECK(d.find("kept in shared memory where the grid fits (last launch: no)") != std::string::npos);
    if (!std::getenv("DQN_UPDATE_ONEHEAD"))  // one head (C51 alone): its g in float; four: the double sum
      CHECK((d.find(", one head's g in float") != std::string::npos) == c51);
    MESSAGE(d.substr(d.find("update cluster")));
    check_same_bits(*never, *fit, {"params", "target", "adam.m", "adam.v", "report/td_error", "report/losses",
                                   "report/norms", "report/clips"});
    CHECK(fit->read_report().adam_step == never->read_report().adam_step);
    CHECK(fit->runtime().graph_nodes() == never->runtime().graph_nodes());
  }
}

TEST_CASE("gpu.step.wide: DQN_UPDATE_WIDE runs trunk.1's cluster in a launch of its own, with the same results") {
  // At the reference sizes the update's blocks of trunk.1 (256 × 256: 16 rows of 256 a block)
  // hold two tiles of a 256-thread block; with DQN_UPDATE_WIDE=1 its cluster runs in a second
  // launch of 512-thread blocks (one tile each) on the update's side slot, forked after the
  // partial sums and joined after the main launch. 20 replayed steps give the same bits as one
  // launch, with one graph node more; C51 alone (its update's grid resident at once: the kept
  // rows and pushed sums in both launches) and the four heads (in waves: neither). Unset, the
  // switch splits where the whole update is resident at once with it: the C51 step, not the four
  // heads' (their grid in waves, which the side launch's SMs would slow).
  struct Config {
    const char* name;
    std::string text;
    const char* by_default;  // describe()'s words, the switch unset
  };
  std::vector<Config> configs{{"C51 alone", ref_pipeline(), "(last launch: 1 normed matrix)"}};
  if (aux_heads({"iqn", "ensemble", "cql"}))
    configs.push_back({"all four heads", ref_pipeline(kRefAuxHeads), "(last launch: 0 normed matrices)"});
  for (const Config& c : configs) {
    INFO(std::string(c.name));
    const PipelineSpec spec = parse(c.text);
    {
      const EnvOverride unset("DQN_UPDATE_WIDE", nullptr);
      unsetenv("DQN_UPDATE_WIDE");
      auto plain = make(spec, BackendKind::cuda);
      plain->step();
      const std::string dd = plain->runtime().describe();
      INFO(dd);
      CHECK(dd.find(std::string(", a wide launch where the grid fits ") + c.by_default) != std::string::npos);
    }
    const auto [one, split] = switch_pair(spec, "DQN_UPDATE_WIDE", "0", "1");
    const std::string d = split->runtime().describe();
    INFO(d);
    if (!cluster_update_runs(d)) return;
    CHECK(d.find(", 1 normed matrix in a wide launch beside it)") != std::string::npos);
    CHECK(one->runtime().describe().find("wide launch") == std::string::npos);
    check_same_bits(*one, *split, {"params", "target", "adam.m", "adam.v", "report/td_error", "report/losses",
                                   "report/norms", "report/clips"});
    CHECK(split->read_report().adam_step == one->read_report().adam_step);
    CHECK(split->runtime().graph_nodes() == one->runtime().graph_nodes() + 1);
  }
}

TEST_CASE("gpu.step.mean: the C51 loss's batch mean a stage of its own (the default; DQN_C51_MEAN=0 keeps it in "
          "the loss) changes only the loss's rounding") {
  // By default the C51 loss kernels end without summing the batch, and c51.loss.mean takes
  // the head's loss from the per-sample losses (td_error) and the importance weights
  // (weighted_mean). No gradient depends on the loss's value: 20 replayed steps give the same
  // parameters, moments, target, td_error, norms and clip factors to the bit, the losses within
  // float rounding (each sample's loss is rounded to float before it is weighted), and one graph
  // node more. C51 alone and with all four heads.
  std::vector<std::string> auxes{""};
  if (const auto all = aux_heads({"iqn", "ensemble", "cql"})) auxes.push_back(*all);
  for (const std::string& aux : auxes) {
    INFO(std::string(aux.empty() ? "C51 alone" : "all four heads"));
    const auto [fused, own] = switch_pair(parse(pipeline("tf32", "", aux)), "DQN_C51_MEAN", "0", "1");
    check_same_bits(*fused, *own, {"params", "target", "adam.m", "adam.v", "report/td_error", "report/norms",
                                   "report/clips"});
    const auto lf = fused->host_buffer("report/losses"), lo = own->host_buffer("report/losses");
    REQUIRE(lf.size() == lo.size());
    for (std::size_t h = 0; h < lf.size(); ++h) {
      INFO("head " << h << ": " << lf[h] << " fused, " << lo[h] << " by its own stage");
      CHECK(near(lf[h], lo[h], 1e-6));
    }
    CHECK(own->runtime().graph_nodes() == fused->runtime().graph_nodes() + 1);
  }
}

TEST_CASE("gpu.step.update_clock: DQN_UPDATE_CLOCK=1 stamps the cluster update's phases in order and changes no result") {
  // The stamps dqn-trace reads (Runtime::update_clock): per block %globaltimer then clock64 at
  // placed, waited, clips, Adam, Wᵀu, gather, v, W v, σ, scaled, exit; a normed matrix's blocks reach them all in
  // that order, the other blocks placed … Adam and exit.
  const PipelineSpec spec = parse(pipeline("tf32"));
  std::unique_ptr<Engine> clocked;
  {
    const EnvOverride on("DQN_UPDATE_CLOCK", "1");
    clocked = make(spec, BackendKind::cuda);
  }
  const EnvOverride off("DQN_UPDATE_CLOCK", "0");
  auto plain = make(spec, BackendKind::cuda);
  for (int i = 0; i < 3; ++i) {
    clocked->step();
    plain->step();
  }
  clocked->runtime().synchronize();
  CHECK(plain->runtime().update_clock().stamps.empty());
  const Runtime::UpdateClock c = clocked->runtime().update_clock();
  if (c.stamps.empty()) {
    MESSAGE("the cluster update does not run on this device: nothing to check");
    return;
  }
  REQUIRE(c.slots == 11);
  CHECK(c.normed == 10);  // 2 + 2 + 2D (D = 3): the trunk's, the value stream's and each branch's
  const int S = c.slots, blocks = static_cast<int>(c.stamps.size()) / (2 * S);
  REQUIRE(blocks >= c.normed * c.cluster_size);
  for (int b = 0; b < blocks; ++b) {
    CAPTURE(b);
    const std::uint64_t* gt = &c.stamps[std::size_t(b) * 2 * S];
    const std::uint64_t* cl = gt + S;
    const bool normed = b < c.normed * c.cluster_size;
    std::vector<int> reached{0, 1, 2, 3, 10};
    if (normed) reached = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    for (std::size_t k = 1; k < reached.size(); ++k) {
      CHECK(gt[reached[k]] >= gt[reached[k - 1]]);
      CHECK(cl[reached[k]] >= cl[reached[k - 1]]);
    }
    CHECK(gt[0] > 0);
    CHECK(gt[10] - gt[0] < 10'000'000);  // ns: the same run, not a stale stamp
  }
  check_same_bits(*clocked, *plain, {"params", "target", "adam.m", "adam.v"});
}
