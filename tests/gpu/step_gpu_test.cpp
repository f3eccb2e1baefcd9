// The whole step on the GPU: CUDA vs the CPU reference over 100 steps (C51 alone, and with each
// auxiliary head and all of them), graph replay vs the same stages uncaptured (bit for bit),
// budget fractions changed without re-capture, one capture, and zero syncs counted with CUPTI
// callbacks (C51 alone and all four heads).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cupti_count.hpp"

#include "dqn/head.hpp"
#include "core/engine_access.hpp"
#include "pipeline/parse.hpp"
#include "core/plugin_loader.hpp"
#include "engine_gpu_util.hpp"
#include "cuda/cuda_lab.hpp"

namespace {
using namespace dqn;

using engine_gpu::loader;
using engine_gpu::parse;
using engine_gpu::rel;

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

// The head lines of the named auxiliaries, in that order. Their plugins are built with the
// engine: one not found fails the test (naming the plugin and the search path).
std::string aux_heads(const std::vector<std::string>& names) {
  std::string lines;
  for (const auto& n : names) {
    REQUIRE_MESSAGE(loader().find(n), "plugin '" << n << "' not found in " << loader().search_path());
    const auto* a = std::find_if(std::begin(kAuxHeads), std::end(kAuxHeads),
                                 [&](const AuxHead& x) { return n == x.plugin; });
    REQUIRE_MESSAGE(a != std::end(kAuxHeads), "no test configuration for auxiliary head '" << n << "'");
    lines += a->line;
  }
  return lines;
}

std::unique_ptr<Engine> make(const PipelineSpec& spec, BackendKind b) {
  EngineOptions eo;
  eo.backend = b;
  auto e = std::make_unique<Engine>(spec, loader(), eo);
  init_weights(*e, spec.seed);
  set_batch(*e, HostBatch::random(spec, 9));
  return e;
}

/// 20 replayed steps on each of two engines, a step of one then of the other.
void step_both(Engine& a, Engine& b) {
  for (int i = 0; i < 20; ++i) {
    a.step();
    b.step();
  }
}

/// Two engines of spec, the first with the CUDA backend's choices `a`, the second with `b`, after
/// 20 replayed steps each.
std::pair<std::unique_ptr<Engine>, std::unique_ptr<Engine>> cuda_pair(PipelineSpec spec, const CudaSpec& a,
                                                                      const CudaSpec& b) {
  spec.cuda = a;
  auto ea = make(spec, BackendKind::cuda);
  spec.cuda = b;
  auto eb = make(spec, BackendKind::cuda);
  step_both(*ea, *eb);
  return {std::move(ea), std::move(eb)};
}
bool bit_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

// Each named buffer the same to the bit in both engines (a check per buffer, named in its message).
void check_same_bits(Engine& a, Engine& b, std::initializer_list<const char*> buffers) {
  for (const char* buf : buffers) {
    INFO(std::string(buf));
    CHECK(bit_equal(host_buffer(a, buf), host_buffer(b, buf)));
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
  const auto ag = host_buffer(gpu, buf::a_star), ac = host_buffer(cpu, buf::a_star);
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
  // tf32 runs five times: with the default kernels (GEMMs on cuBLASLt or tile_gemm, as tuned),
  // cuBLASLt only (cuda.gemm: cublaslt), tile_gemm always (tile), the update as its separate
  // kernels (cuda.update_cluster: off) and 8 blocks a cluster; bf16 also without programmatic
  // launch (cuda.pdl: off). The CPU engine ignores the cuda: section.
  struct Case {
    const char* precision;
    double params, loss;
    const char* cuda;  // the pipeline's cuda: section ("": the defaults)
  };
  const Case cases[] = {
      {"fp32", 2e-4, 1e-4, ""},
      {"tf32", 5e-3, 5e-3, ""},
      {"tf32", 5e-3, 5e-3, "cuda: {gemm: cublaslt}\n"},
      {"tf32", 5e-3, 5e-3, "cuda: {gemm: tile, autotune: false}\n"},
      {"tf32", 5e-3, 5e-3, "cuda: {update_cluster: off}\n"},
      {"tf32", 5e-3, 5e-3, "cuda: {update_cluster: 8}\n"},
      {"bf16", 3e-2, 3e-2, ""},
      {"bf16", 3e-2, 3e-2, "cuda: {pdl: off}\n"},
  };
  for (const Case& c : cases) {
    INFO("precision " << std::string(c.precision) << " " << std::string(c.cuda));
    const PipelineSpec spec = parse(pipeline(c.precision, c.cuda));
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
      INFO(std::string(b));
      CHECK(rel(host_buffer(*gpu, b), host_buffer(*cpu, b)) < (std::string(b) == "adam.m" ? 20 : 1) * c.params);
    }
    CHECK(gpu->captures() == 1);
  }
}

TEST_CASE("gpu.step.replay_equals_uncaptured") {
  // tf32 also with tile_gemm everywhere and every kernel launched programmatically, and with the
  // update as its separate kernels and no programmatic launch
  for (const auto& [p, cuda] : {std::pair<const char*, const char*>{"fp32", ""}, {"tf32", ""},
                                {"tf32", "cuda: {gemm: tile, pdl: all}\n"},
                                {"tf32", "cuda: {update_cluster: off, pdl: off}\n"}, {"bf16", ""}}) {
    INFO("precision " << std::string(p) << " " << std::string(cuda));
    const PipelineSpec spec = parse(pipeline(p, cuda));
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
  e->update().set_fraction(0, 0.5);
  e->step();
  const StepReport r = e->read_report();
  CHECK(r.clips[0] == doctest::Approx(std::min(1.0, 0.5 * 0.001 / (r.grad_norms[0] + 1e-6))).epsilon(1e-5));
  CHECK(n > 0);
  e->update().set_lr(0.5);
  e->step();
  CHECK(e->captures() == 1);
}

TEST_CASE("gpu.step.aux_fraction_change_without_recapture") {
  // All four heads; each auxiliary's fraction changed in turn between steps: the next report's clip
  // factor of every head is min(1, f·G/(‖g_h‖ + 1e-6)) with the fractions as they now are, and the
  // graph is never re-captured. With G = 0.25 (norms about c51 0.1, iqn 0.2, ensemble 0.06, cql
  // 0.05) the changes move clips both ways: iqn 0.1 → 0.02 and cql 0.1 → 0.03 clip harder, the
  // ensemble 0.1 → 0.8 is no longer clipped (clip 1).
  const std::string aux = aux_heads({"iqn", "ensemble", "cql"});
  const double G = 0.25;
  const PipelineSpec spec = parse(pipeline("fp32", "max_grad_norm: 0.25\n", aux));
  auto e = make(spec, BackendKind::cuda);
  REQUIRE(e->head_names() == std::vector<std::string>{"c51", "iqn", "ensemble", "cql"});
  // The kernel forms the clip in double from the float fraction and G and rounds it and the norm
  // to float: recomputed from the reported norm it is off by a few float roundings (≲ 3e-7), so
  // 1e-5 relative.
  auto check_clips = [&](const StepReport& r) {
    REQUIRE(r.clips.size() == 4);
    for (std::size_t h = 0; h < 4; ++h) {
      INFO("head " << r.heads[h] << ", fraction " << e->update().fractions()[h] << ", norm " << r.grad_norms[h]);
      CHECK(r.grad_norms[h] > 0);
      CHECK(r.fractions[h] == e->update().fractions()[h]);
      const double want = std::min(1.0, e->update().fractions()[h] * G / (r.grad_norms[h] + 1e-6));
      CHECK_MESSAGE(near(r.clips[h], want, 1e-5), "clip " << r.clips[h] << ", want " << want);
    }
  };
  e->step();
  check_clips(e->read_report());
  // The fractions may not sum above 1: the primary gives up most of its share first (its clip
  // stays below 1: 0.1·G over a norm of about 0.1), and CQL's cut comes before the ensemble's raise.
  e->update().set_fraction(0, 0.1);
  struct Change { std::size_t head; double f; };
  for (const Change c : {Change{1, 0.02}, Change{3, 0.03}, Change{2, 0.8}}) {
    const double old_f = e->update().fractions()[c.head];
    e->update().set_fraction(c.head, c.f);
    CHECK(e->update().fractions()[c.head] == c.f);
    e->step();
    const StepReport r = e->read_report();
    INFO("changed " << r.heads[c.head] << " from " << old_f << " to " << c.f);
    check_clips(r);
    // The change shows: the old fraction would have given a clearly different clip.
    const double n = r.grad_norms[c.head];
    CHECK(!near(std::min(1.0, old_f * G / (n + 1e-6)), std::min(1.0, c.f * G / (n + 1e-6)), 0.1));
  }
  e->update().set_lr(0.5);
  e->step();
  check_clips(e->read_report());
  CHECK(e->captures() == 1);
  // The four heads' stages fit the lanes: no stage of the captured step waits for one it does
  // not depend on.
  CHECK(e->plan().lanes.false_deps == 0);
  CHECK(lanes_used(*e) > 1);
}

TEST_CASE("gpu.step.nan_skips_on_device") {
  const PipelineSpec spec = parse(pipeline("tf32"));
  auto e = make(spec, BackendKind::cuda);
  e->step();
  const auto p = host_buffer(*e, "params"), t = host_buffer(*e, "target"), m = host_buffer(*e, "adam.m");
  host_write(*e, "batch/is_weights", 3, std::nan(""));
  e->step();
  CHECK(bit_equal(host_buffer(*e, "params"), p));
  CHECK(bit_equal(host_buffer(*e, "target"), t));
  CHECK(bit_equal(host_buffer(*e, "adam.m"), m));
  const StepReport r = e->read_report();
  CHECK(r.skipped_steps == 1);
  CHECK(r.adam_step == 1);
}

#if DQN_HAVE_CUPTI
namespace {
// Over 1,000 steps the only CUDA calls are graph launches and the asynchronous report copies
// (a copy and an event record each report_every steps): no synchronize, no allocation, no
// blocking copy, no query of anything.
// With `replay` (uniform or prioritized) the step draws its batch from a replay of its own.
void check_zero_syncs(const std::string& text, const std::string& replay = "") {
  const PipelineSpec spec = parse(text);
  std::unique_ptr<Engine> e;
  if (replay.empty()) {
    e = make(spec, BackendKind::cuda);
  } else {
    EngineOptions eo;
    eo.backend = BackendKind::cuda;
    EngineReplay r;
    r.spec.capacity = 4096;
    r.spec.prioritized = replay == "prioritized";
    r.staging_rows = 4096;
    eo.replay = r;
    e = std::make_unique<Engine>(spec, loader(), eo);
    init_weights(*e, spec.seed);
    const HostBatch b = HostBatch::random(spec, 9);  // its rows, repeated, fill the replay
    std::vector<float> st, nx, rw, dn;
    std::vector<std::int32_t> ac;
    for (int k = 0; k < 4096; ++k) {
      const std::size_t i = std::size_t(k % b.B), S = std::size_t(b.S), D = std::size_t(b.D);
      st.insert(st.end(), b.states.begin() + long(i * S), b.states.begin() + long((i + 1) * S));
      nx.insert(nx.end(), b.next_states.begin() + long(i * S), b.next_states.begin() + long((i + 1) * S));
      ac.insert(ac.end(), b.actions.begin() + long(i * D), b.actions.begin() + long((i + 1) * D));
      rw.push_back(b.rewards[i]);
      dn.push_back(b.dones[i]);
    }
    e->replay().add(Transitions{4096, st.data(), nx.data(), ac.data(), rw.data(), dn.data()}, 4096);
  }
  for (int i = 0; i < 10; ++i) e->step();
  e->read_report();
  gpu_test::CallCount count;
  const auto lookups = e->registry().lookups();
  count.set_on(true);
  for (int i = 0; i < 1000; ++i) e->step();
  const std::map<std::string, long> calls = count.stop();
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
  SUBCASE("c51 drawing from a uniform replay inside the step") { check_zero_syncs(pipeline("tf32"), "uniform"); }
  SUBCASE("c51 drawing from a prioritised replay inside the step") {
    check_zero_syncs(pipeline("tf32"), "prioritized");
  }
  SUBCASE("c51 + iqn + ensemble + cql") {
    check_zero_syncs(pipeline("tf32", "", aux_heads({"iqn", "ensemble", "cql"})));
  }
  SUBCASE("the QR-DQN example plugin as the primary, with its own kernels") {
    REQUIRE_MESSAGE(loader().find("qr_dqn"), "the qr_dqn example is not built among the test fixtures");
    std::string text = pipeline("tf32", "", aux_heads({"iqn"}));  // (cql and ensemble learn on a c51 primary's outputs)
    const std::string c51 = "  - {plugin: c51, role: primary}\n";
    text.replace(text.find(c51), c51.size(), "  - {plugin: qr_dqn, role: primary, quantiles: 17}\n");
    check_zero_syncs(text);
  }
}
#else
TEST_CASE("gpu.step.zero_syncs" * doctest::skip() * doctest::description("built without CUPTI: no call counts")) {}
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
    const std::string aux = aux_heads(c.aux);
    const PipelineSpec spec = parse(pipeline("fp32", "max_grad_norm: 0.25\n", aux));
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
      const auto g = host_buffer(*gpu, b.name), r = host_buffer(*cpu, b.name);
      REQUIRE(g.size() == r.size());
      const double e = rel(g, r);
      CHECK_MESSAGE(e < b.tol, "‖Δ‖/‖ref‖ = " << e);
    }

    // Step 101 from the GPU's state on both (weights, target, Adam moments and step, sn.u): each
    // head's loss, gradient norm and clip at trained weights, with one-step tolerances again.
    load_weights(*cpu, save_weights(*gpu, false));
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
  aux_heads({"iqn", "ensemble", "cql"});  // (their plugins are there)
  heads.emplace_back("all four heads", kRefAuxHeads);
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
        const auto g = host_buffer(*gpu, b), r = host_buffer(*cpu, b);
        REQUIRE(g.size() == r.size());
        const double e = rel(g, r);
        CHECK_MESSAGE(e < tol, "‖Δ‖/‖ref‖ = " << e);
      }
      CHECK(gpu->read_report().adam_step == 3);
      CHECK(gpu->captures() == 1);
    }
  }
}

TEST_CASE("gpu.step.options: the pipeline's cuda choices change where and how kernels run, not what they compute") {
  // Programmatic launch off and for every kernel, and tile_gemm's fragments by plain loads and by
  // ldmatrix, change when kernels are placed and how loads are issued, never what they compute:
  // 20 replayed steps give the same bits both ways, C51 alone and with all three auxiliary heads
  // (more lanes). Both engines run every GEMM on tile_gemm's first shape, not autotuned
  // (cuda.gemm: tile, cuda.autotune: false): autotuning keys its choices by the fragment loads,
  // so two engines could time their way to different kernels, and with tile_gemm everywhere the
  // loads reach every GEMM.
  CudaSpec off, all;
  off.gemm = all.gemm = CudaSpec::Gemm::tile;
  off.autotune = all.autotune = false;
  off.pdl = CudaSpec::Pdl::off;
  off.tile_loads = CudaSpec::TileLoads::plain;
  all.pdl = CudaSpec::Pdl::all;
  all.tile_loads = CudaSpec::TileLoads::ldmatrix;
  for (const std::string& aux : {std::string(), aux_heads({"iqn", "ensemble", "cql"})}) {
    INFO(std::string(aux.empty() ? "C51 alone" : "all four heads"));
    const auto [a, b] = cuda_pair(parse(pipeline("tf32", "", aux)), off, all);
    check_same_bits(*a, *b, {"params", "target", "adam.m", "adam.v", "report/td_error", "report/losses"});
    CHECK(a->runtime().graph_nodes() == b->runtime().graph_nodes());
  }
}

TEST_CASE("gpu.step.update_paths: the fused update's choices where its grid is resident, and against its separate "
          "kernels" * doctest::skip(!cuda::lab::cluster_launch_available())) {
  // The cluster update decides from what the device holds at once: the reference C51 step (176
  // blocks, resident) stages its normed blocks' second tiles in shared memory, keeps their rows
  // there, pushes its power iteration's sums to every block, runs trunk.1's cluster (two tiles a
  // block) in a wide launch beside the main one, and with one head takes g in float; the four
  // heads at the reference sizes (690 blocks, in waves) none of the areas and no wide launch. One
  // step against the same step with the update as its separate kernels (cuda.update_cluster:
  // off): g and so Adam's moments the same bits, the normed matrices (whose power iteration sums
  // in another order), the target and u within float rounding.
  struct Config {
    const char* name;
    std::string aux;
    bool resident;
  };
  const Config configs[] = {{"C51 alone", "", true}, {"all four heads", kRefAuxHeads, false}};
  aux_heads({"iqn", "ensemble", "cql"});  // (their plugins are there)
  for (const Config& cfg : configs) {
    INFO(std::string(cfg.name));
    PipelineSpec spec = parse(ref_pipeline(cfg.aux));
    auto fused = make(spec, BackendKind::cuda);
    spec.cuda.update_cluster = -1;
    auto separate = make(spec, BackendKind::cuda);
    fused->step();
    separate->step();
    const cuda::lab::UpdateInfo info = cuda::lab::update_info(fused->runtime());
    REQUIRE(info.cluster_size > 0);
    CHECK(cuda::lab::update_info(separate->runtime()).cluster_size == 0);
    CHECK(info.last.staged == cfg.resident);
    CHECK(info.last.kept == cfg.resident);
    CHECK(info.last.pushed == cfg.resident);
    CHECK(info.last.wide() == cfg.resident);
    CHECK(info.last.one == cfg.aux.empty());
    check_same_bits(*fused, *separate, {"adam.m", "adam.v", "grad/total", "report/td_error", "report/norms",
                                        "report/clips"});
    for (const char* b : {"params", "target", "sn.u.trunk.1.weight"}) {
      INFO(std::string(b));
      CHECK(rel(host_buffer(*fused, b), host_buffer(*separate, b)) < 1e-6);
    }
  }
}

TEST_CASE("gpu.step.update_clock_absent: a build that is not a lab build has no phase stamps" *
          doctest::skip(DQN_LAB != 0 || !cuda::lab::cluster_launch_available())) {
  CHECK_FALSE(cuda::lab::record_update_clock(true));
  auto e = make(parse(pipeline("tf32")), BackendKind::cuda);
  e->step();
  e->runtime().synchronize();
  CHECK(cuda::lab::update_clock(e->runtime()).stamps.empty());
}

TEST_CASE("gpu.step.update_clock: the cluster update's phase stamps (dqn-trace --update-clock) in order, no result "
          "changed (a lab build)" * doctest::skip(DQN_LAB == 0 || !cuda::lab::cluster_launch_available())) {
  // The stamps dqn-trace reads (lab::update_clock): per block %globaltimer then clock64 at placed,
  // waited, clips, Adam, Wᵀu, gather, v, W v, σ, scaled, exit; a normed matrix's blocks reach them
  // all in that order, the other blocks placed … Adam and exit.
  const PipelineSpec spec = parse(pipeline("tf32"));
  cuda::lab::record_update_clock(true);
  auto clocked = make(spec, BackendKind::cuda);
  cuda::lab::record_update_clock(false);
  auto plain = make(spec, BackendKind::cuda);
  for (int i = 0; i < 3; ++i) {
    clocked->step();
    plain->step();
  }
  clocked->runtime().synchronize();
  CHECK(cuda::lab::update_clock(plain->runtime()).stamps.empty());
  const cuda::lab::UpdateClock c = cuda::lab::update_clock(clocked->runtime());
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
