// The auxiliary heads on the CPU reference, in f64: each head's loss against docs/step-math.md's formula,
// its gradient against central differences w.r.t. every parameter it reaches (and exactly zero
// where it does not), and the gradient budgets of a c51 + auxiliaries pipeline.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/engine_access.hpp"
#include "core/grad_check.hpp"
#include "pipeline/parse.hpp"
#include "core/plugin_loader.hpp"

namespace {
using namespace dqn;

const PluginLoader& loader() {
  static PluginLoader l(PluginLoader::search_path_from(""));
  return l;
}

// Small awkward sizes (as in step_test): nothing a multiple of 8, a narrow support.
std::string tiny_pipeline(const std::string& aux, const std::string& extra = "") {
  return R"(
name: tiny_heads
seed: 7
backend: cpu
precision: fp32
network: {state: 5, trunk: [7, 6], head_hidden: 4, branches: 2, actions: 3, atoms: 5, v_min: -2, v_max: 2}
heads:
  - {plugin: c51, role: primary}
)" + aux + R"(batch: 6
gamma: 0.9
report_every: 1
)" + extra;
}

PipelineSpec parse(const std::string& text) {
  ParseOptions o;
  o.plugins = &loader();
  return parse_pipeline(text, "tiny_heads.yaml", o);
}

std::unique_ptr<Engine> make(const PipelineSpec& spec, bool f64, std::uint64_t batch_seed = 3) {
  EngineOptions eo;
  eo.f64 = f64;
  auto e = std::make_unique<Engine>(spec, loader(), eo);
  init_weights(*e, spec.seed);
  set_batch(*e, HostBatch::random(spec, batch_seed));
  return e;
}

double norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

/// ∂loss/<head> from grad/<head> against central differences for a sample of entries of every
/// parameter tensor (core/grad_check, what `dqn check-head` runs); `reaches` says which tensors
/// must get a non-zero gradient, the others an exactly zero one.
void fd_check(Engine& e, const std::string& head, bool (*reaches)(const std::string&)) {
  e.forward_backward();
  const std::vector<double> grad = host_buffer(e, "grad/" + head);
  int checked = 0;
  for (const GradCheckRow& r : check_head_gradients(e, head)) {
    INFO(head << ": " << r.param << ": worst [" << r.worst_index << "] fd " << r.worst_fd << " analytic "
              << r.worst_analytic);
    CHECK_MESSAGE(r.reaches == reaches(r.param), head << (r.reaches ? " reaches " : " does not reach ") << r.param);
    CHECK(r.ok);
    checked += r.checked;
  }
  CHECK(checked > 0);
  e.forward_backward();
  CHECK(host_buffer(e, "grad/" + head) == grad);
}

bool trunk_or_c51(const std::string& n) { return starts_with(n, "trunk.") || starts_with(n, "c51."); }
}  // namespace

TEST_CASE("heads.cql.loss_matches_spec") {
  const PipelineSpec spec = parse(tiny_pipeline("  - {plugin: cql, alpha: 0.75}\n"));
  auto e = make(spec, true);
  e->forward_backward();
  const int B = spec.batch, D = spec.network.branches, A = spec.network.actions;
  const auto q = host_buffer(*e, "c51/q");  // [2B, D, A], rows 0..B-1: states
  const auto act = host_buffer(*e, "batch/actions");
  double want = 0;
  for (int b = 0; b < B; ++b)
    for (int d = 0; d < D; ++d) {
      double s = 0;
      for (int a = 0; a < A; ++a) s += std::exp(q[std::size_t((b * D + d) * A + a)]);
      want += std::log(s) - q[std::size_t((b * D + d) * A + int(act[std::size_t(b * D + d)]))];
    }
  want *= 0.75 / (B * D);  // α exact in f32
  CHECK(host_buffer(*e, "loss/cql")[0] == doctest::Approx(want).epsilon(1e-12));
  CHECK(want > 0);
}

TEST_CASE("heads.cql.fd_every_parameter") {
  const PipelineSpec spec = parse(tiny_pipeline("  - {plugin: cql, alpha: 0.75}\n"));
  auto e = make(spec, true);
  fd_check(*e, "cql", trunk_or_c51);
  // The primary's gradient is unchanged by the auxiliary's presence.
  const PipelineSpec alone = parse(tiny_pipeline(""));
  auto p = make(alone, true);
  p->forward_backward();
  e->forward_backward();
  const auto g0 = host_buffer(*p, "grad/c51"), g1 = host_buffer(*e, "grad/c51");
  REQUIRE(g0.size() == g1.size());
  CHECK(g0 == g1);
}

TEST_CASE("heads.cql.alpha_zero_gives_zero_gradient") {
  const PipelineSpec spec = parse(tiny_pipeline("  - {plugin: cql, alpha: 0}\n"));
  auto e = make(spec, true);
  e->forward_backward();
  CHECK(host_buffer(*e, "loss/cql")[0] == 0.0);
  CHECK(norm(host_buffer(*e, "grad/cql")) == 0.0);
}

TEST_CASE("heads.budget.c51_cql") {
  const double G = 1e-4;
  PipelineSpec spec = parse(tiny_pipeline("  - {plugin: cql}\n", "max_grad_norm: 0.0001\n"));
  auto e = make(spec, true);
  REQUIRE(e->head_names() == std::vector<std::string>{"c51", "cql"});
  const auto f = e->update().fractions();
  CHECK(f[1] == doctest::Approx(0.1));  // cql's default budget
  CHECK(f[0] + f[1] == doctest::Approx(1.0).epsilon(1e-15));
  e->step();
  StepReport r = e->read_report();
  REQUIRE(r.heads.size() == 2);
  double total = 0;
  for (std::size_t h = 0; h < 2; ++h) {
    CAPTURE(h);
    CHECK(r.grad_norms[h] > G);  // tiny G: both heads are clipped
    CHECK(r.clips[h] == doctest::Approx(f[h] * G / (r.grad_norms[h] + 1e-6)).epsilon(1e-6));
    CHECK(r.clips[h] * r.grad_norms[h] <= f[h] * G * (1 + 1e-6));
    total += r.losses[h];
  }
  CHECK(r.total_loss == doctest::Approx(total).epsilon(1e-12));
  // ‖g‖ ≤ Σ_h c_h‖g_h‖ ≤ G.
  CHECK(norm(host_buffer(*e, "grad/total")) <= G * (1 + 1e-6));

  // A fraction changed between steps takes effect on the next step.
  e->update().set_fraction(1, 0.02);
  e->update().set_fraction(0, 0.98);
  e->step();
  r = e->read_report();
  CHECK(r.fractions[1] == doctest::Approx(0.02));
  CHECK(r.clips[1] == doctest::Approx(0.02 * G / (r.grad_norms[1] + 1e-6)).epsilon(1e-5));
  CHECK(r.clips[0] == doctest::Approx(0.98 * G / (r.grad_norms[0] + 1e-6)).epsilon(1e-5));
  CHECK(r.clips[1] * r.grad_norms[1] <= 0.02 * G * (1 + 1e-5));
}

namespace {
bool trunk_or_ensemble(const std::string& n) { return starts_with(n, "trunk.") || starts_with(n, "ensemble."); }
}  // namespace

TEST_CASE("heads.ensemble.loss_and_disagreement_match_spec") {
  const PipelineSpec spec = parse(tiny_pipeline("  - {plugin: ensemble, members: 4}\n"));  // 1/K exact in f32
  auto e = make(spec, true);
  e->forward_backward();
  const int K = 4, B = spec.batch, D = spec.network.branches, A = spec.network.actions, Z = spec.network.atoms;
  const auto logp = host_buffer(*e, "ensemble/logp");  // [K,B,D,A,Z]
  const auto m = host_buffer(*e, "target/m");          // [B,D,Z]
  const auto act = host_buffer(*e, "batch/actions");
  const auto w = host_buffer(*e, "batch/is_weights");
  REQUIRE(logp.size() == std::size_t(K) * B * D * A * Z);
  double want = 0;
  for (int k = 0; k < K; ++k)
    for (int b = 0; b < B; ++b) {
      double lb = 0;
      for (int d = 0; d < D; ++d) {
        const int a = int(act[std::size_t(b * D + d)]);
        for (int i = 0; i < Z; ++i)
          lb -= m[std::size_t((b * D + d) * Z + i)] * logp[std::size_t((((k * B + b) * D + d) * A + a) * Z + i)];
      }
      want += w[std::size_t(b)] * lb / D;
    }
  want /= double(K) * B;
  CHECK(host_buffer(*e, "loss/ensemble")[0] == doctest::Approx(want).epsilon(1e-12));
  // The members start from different weights, so they disagree; the metric is the mean std of Q.
  const auto q = host_buffer(*e, "ensemble/q");  // [K,B,D,A]
  const auto dis = host_buffer(*e, "ensemble/disagreement");
  for (int b = 0; b < B; ++b) {
    double s = 0;
    for (int j = 0; j < D * A; ++j) {
      double mean = 0, var = 0;
      for (int k = 0; k < K; ++k) mean += q[std::size_t((k * B + b) * D * A + j)] / K;
      for (int k = 0; k < K; ++k) var += std::pow(q[std::size_t((k * B + b) * D * A + j)] - mean, 2) / K;
      s += std::sqrt(var);
    }
    CHECK(dis[std::size_t(b)] == doctest::Approx(s / (D * A)).epsilon(1e-12));
    CHECK(dis[std::size_t(b)] > 0);
  }
}

TEST_CASE("heads.ensemble.fd_every_parameter") {
  // The target m comes from the primary's target network at a* (argmax): no gradient into c51.
  // At these tiny sizes a branch's hidden layer can be dead for the whole batch (then no
  // gradient reaches it, correctly): take the first init seed where every member's value and
  // branch layers have a live unit.
  const int Hh = 4, D = 2, B = 6, K = 2;
  std::unique_ptr<Engine> e;
  for (int seed = 7; seed < 60 && !e; ++seed) {
    std::string text = tiny_pipeline("  - {plugin: ensemble, members: 2}\n");
    text.replace(text.find("seed: 7"), 7, "seed: " + std::to_string(seed));
    auto c = make(parse(text), true);
    c->forward_backward();
    const auto h = host_buffer(*c, "ensemble/hidden");  // [K,B,(1+D)Hh]
    bool all_live = true;
    for (int k = 0; k < K; ++k)
      for (int g = 0; g < 1 + D; ++g) {
        bool live = false;
        for (int b = 0; b < B; ++b)
          for (int u = 0; u < Hh; ++u) live = live || h[std::size_t((k * B + b) * (1 + D) * Hh + g * Hh + u)] > 0;
        all_live = all_live && live;
      }
    if (all_live) e = std::move(c);
  }
  REQUIRE(e);
  fd_check(*e, "ensemble", trunk_or_ensemble);
}

TEST_CASE("heads.ensemble.members_param") {
  const PipelineSpec spec = parse(tiny_pipeline("  - {plugin: ensemble, members: 1}\n"));
  auto e = make(spec, true);
  int members = 0;
  for (const auto& p : e->registry().params()) members += p.name == "ensemble.0.value.0.weight" || p.name == "ensemble.1.value.0.weight";
  CHECK(members == 1);
  CHECK_THROWS(parse(tiny_pipeline("  - {plugin: ensemble, members: 0}\n")));
  CHECK_THROWS(parse(tiny_pipeline("  - {plugin: ensemble, members: 65}\n")));
}

TEST_CASE("heads.budget.c51_cql_ensemble") {
  const double G = 1e-4;
  PipelineSpec spec = parse(tiny_pipeline("  - {plugin: cql}\n  - {plugin: ensemble, members: 2}\n", "max_grad_norm: 0.0001\n"));
  auto e = make(spec, true);
  REQUIRE(e->head_names() == std::vector<std::string>{"c51", "cql", "ensemble"});
  const auto f = e->update().fractions();
  CHECK(f[0] == doctest::Approx(0.8));
  CHECK(f[1] == doctest::Approx(0.1));
  CHECK(f[2] == doctest::Approx(0.1));
  CHECK(f[0] + f[1] + f[2] == doctest::Approx(1.0).epsilon(1e-15));
  e->step();
  const StepReport r = e->read_report();
  REQUIRE(r.heads.size() == 3);
  for (std::size_t h = 0; h < 3; ++h) {
    CAPTURE(h);
    CHECK(r.grad_norms[h] > G);
    CHECK(r.clips[h] * r.grad_norms[h] <= f[h] * G * (1 + 1e-6));
    CHECK(r.clips[h] == doctest::Approx(f[h] * G / (r.grad_norms[h] + 1e-6)).epsilon(1e-6));
  }
  CHECK(norm(host_buffer(*e, "grad/total")) <= G * (1 + 1e-6));
}

namespace {
bool trunk_or_iqn(const std::string& n) { return starts_with(n, "trunk.") || starts_with(n, "iqn."); }
const char* kIqn = "  - {plugin: iqn, quantiles: 3, target_quantiles: 4, embed: 5}\n";
}  // namespace

TEST_CASE("heads.iqn.loss_matches_spec") {
  const PipelineSpec spec = parse(tiny_pipeline(kIqn));
  auto e = make(spec, true);
  e->forward_backward();
  const int B = spec.batch, D = spec.network.branches, A = spec.network.actions, N = 3, Nt = 4;
  const int ldq = (D * A + 3) / 4 * 4;  // q rows: D·A padded to 4 floats
  const auto q = host_buffer(*e, "iqn/q"), qt = host_buffer(*e, "iqn/target.q"), tau = host_buffer(*e, "iqn/tau");
  REQUIRE(q.size() == std::size_t(B) * N * ldq);
  const auto act = host_buffer(*e, "batch/actions"), ast = host_buffer(*e, "target/a_star");
  const auto r = host_buffer(*e, "batch/rewards"), dn = host_buffer(*e, "batch/dones"), w = host_buffer(*e, "batch/is_weights");
  double want = 0;
  for (int b = 0; b < B; ++b) {
    double L = 0;
    for (int d = 0; d < D; ++d)
      for (int i = 0; i < N; ++i)
        for (int j = 0; j < Nt; ++j) {
          const double theta = q[std::size_t((b * N + i) * ldq + d * A + int(act[std::size_t(b * D + d)]))];
          const double T = r[std::size_t(b)] + 0.9 * (1 - dn[std::size_t(b)]) *
                                                   qt[std::size_t((b * Nt + j) * ldq + d * A + int(ast[std::size_t(b * D + d)]))];
          const double delta = T - theta;
          const double rho = std::fabs(delta) <= 1 ? 0.5 * delta * delta : std::fabs(delta) - 0.5;
          L += std::fabs(tau[std::size_t(b * N + i)] - (delta < 0 ? 1.0 : 0.0)) * rho / Nt;
        }
    want += w[std::size_t(b)] * L / D;
  }
  // γⁿ travels as f32 (0.9f), hence the tolerance.
  CHECK(host_buffer(*e, "loss/iqn")[0] == doctest::Approx(want / B).epsilon(1e-7));
}

TEST_CASE("heads.iqn.tau_fresh_each_step_and_reproducible") {
  const PipelineSpec spec = parse(tiny_pipeline(kIqn));
  auto a = make(spec, true), b = make(spec, true);
  a->forward_backward();
  const auto t0 = host_buffer(*a, "iqn/tau"), tt0 = host_buffer(*a, "iqn/tau_target");
  CHECK(t0.size() == std::size_t(spec.batch) * 3);
  CHECK(tt0.size() == std::size_t(spec.batch) * 4);
  for (double x : t0) CHECK((x >= 0 && x < 1));
  CHECK(std::vector<double>(t0.begin(), t0.begin() + 3) != std::vector<double>(tt0.begin(), tt0.begin() + 3));
  a->step();
  a->forward_backward();
  CHECK(host_buffer(*a, "iqn/tau") != t0);  // keyed by the Adam step
  b->step();
  b->forward_backward();
  CHECK(host_buffer(*a, "iqn/tau") == host_buffer(*b, "iqn/tau"));
  CHECK(host_buffer(*a, "params") == host_buffer(*b, "params"));
}

TEST_CASE("heads.iqn.fd_every_parameter") {
  // No gradient into c51 (a* is an argmax) nor into the target.
  const PipelineSpec spec = parse(tiny_pipeline(kIqn));
  auto e = make(spec, true);
  fd_check(*e, "iqn", trunk_or_iqn);
}

TEST_CASE("heads.budget.full") {
  const double G = 1e-4;
  PipelineSpec spec = parse(tiny_pipeline(std::string(kIqn) + "  - {plugin: ensemble, members: 2}\n  - {plugin: cql}\n",
                                          "max_grad_norm: 0.0001\n"));
  auto e = make(spec, true);
  REQUIRE(e->head_names() == std::vector<std::string>{"c51", "iqn", "ensemble", "cql"});
  const auto f = e->update().fractions();
  CHECK(f[0] == doctest::Approx(0.6));
  CHECK(f[1] == doctest::Approx(0.2));
  CHECK(f[0] + f[1] + f[2] + f[3] == doctest::Approx(1.0).epsilon(1e-15));
  e->step();
  StepReport r = e->read_report();
  for (std::size_t h = 0; h < 4; ++h) {
    CAPTURE(h);
    CHECK(r.grad_norms[h] > G);
    CHECK(r.clips[h] * r.grad_norms[h] <= f[h] * G * (1 + 1e-6));
  }
  CHECK(norm(host_buffer(*e, "grad/total")) <= G * (1 + 1e-6));
  e->update().set_fraction(1, 0.05);
  e->update().set_fraction(0, 0.75);
  e->step();
  r = e->read_report();
  CHECK(r.clips[1] == doctest::Approx(0.05 * G / (r.grad_norms[1] + 1e-6)).epsilon(1e-5));
  CHECK(r.clips[0] == doctest::Approx(0.75 * G / (r.grad_norms[0] + 1e-6)).epsilon(1e-5));
}

TEST_CASE("heads.budget.fractions_sum_to_at_most_one") {
  // The budgets share max_grad_norm: a change that makes the fractions sum above 1 is refused,
  // names the heads and their fractions, and changes nothing (host or device); set_fractions
  // moves budget between heads in one call.
  PipelineSpec spec = parse(tiny_pipeline("  - {plugin: cql}\n", "max_grad_norm: 0.001\n"));
  auto e = make(spec, true);
  REQUIRE(e->update().fractions() == std::vector<double>{0.9, 0.1});
  std::string message;
  try {
    e->update().set_fraction(1, 0.3);
  } catch (const std::invalid_argument& x) {
    message = x.what();
  }
  INFO(message);
  CHECK(message.find("sum to 1.2") != std::string::npos);
  CHECK(message.find("c51 0.9") != std::string::npos);
  CHECK(message.find("cql 0.3") != std::string::npos);
  CHECK(message.find("nothing was changed") != std::string::npos);
  CHECK(e->update().fractions() == std::vector<double>{0.9, 0.1});
  e->step();
  StepReport r = e->read_report();
  CHECK(r.fractions[1] == doctest::Approx(0.1));  // the device kept the old fraction too
  CHECK(r.clips[1] == doctest::Approx(std::min(1.0, 0.1 * 0.001 / (r.grad_norms[1] + 1e-6))).epsilon(1e-5));
  CHECK_THROWS_AS(e->update().set_fractions({0.9, 0.2}), std::invalid_argument);
  CHECK_THROWS_AS(e->update().set_fractions({0.7}), std::invalid_argument);
  CHECK_THROWS_AS(e->update().set_fractions({-0.1, 0.2}), std::invalid_argument);
  e->update().set_fractions({0.7, 0.3});  // budget moved from c51 to CQL in one call
  CHECK(e->update().fractions() == std::vector<double>{0.7, 0.3});
  e->update().set_fraction(1, 0.05);  // a smaller share is fine: the sum may stay below 1
  e->step();
  r = e->read_report();
  CHECK(r.fractions[0] == doctest::Approx(0.7));
  CHECK(r.fractions[1] == doctest::Approx(0.05));
  CHECK(r.clips[0] == doctest::Approx(std::min(1.0, 0.7 * 0.001 / (r.grad_norms[0] + 1e-6))).epsilon(1e-5));
  CHECK(r.clips[1] == doctest::Approx(std::min(1.0, 0.05 * 0.001 / (r.grad_norms[1] + 1e-6))).epsilon(1e-5));
}

TEST_CASE("heads.stages.weight_gradients_beside_the_trunk_backward") {
  // Every head's backward is its input side (∂L/∂h2) and its weight gradients as two stages: the
  // trunk's backward waits for the input sides only, the update for everything, and no weight
  // stage waits for the trunk (they run side by side in the captured graph).
  PipelineSpec spec = parse(tiny_pipeline(std::string(kIqn) + "  - {plugin: ensemble, members: 2}\n  - {plugin: cql}\n"));
  auto e = make(spec, false);
  const auto waits = stage_waits(*e);
  auto of = [&](const std::string& stage) {
    for (const auto& [name, w] : waits)
      if (name == stage) return w;
    FAIL("no stage " << stage);
    return std::vector<std::string>{};
  };
  auto has = [](const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  const std::vector<std::string> heads{"c51", "iqn", "ensemble", "cql"};
  const auto trunk = of("trunk.backward.1");
  const auto update = of("update");
  for (const auto& h : heads) {
    CAPTURE(h);
    // the ensemble's ∂L/∂h2 is a stage of its own after its input side (ensemble.trunk)
    CHECK(has(trunk, h == "ensemble" ? h + ".trunk" : h + ".backward"));
    CHECK_FALSE(has(trunk, h + ".weights"));
    CHECK(has(update, h + ".weights"));
    for (const auto& w : of(h + ".weights")) {
      const bool trunk_backward = w.rfind("trunk.", 0) == 0 && w.rfind("trunk.forward", 0) != 0;
      CHECK_MESSAGE(!trunk_backward, h << ".weights waits for " << w);
    }
  }
  CHECK_FALSE(has(trunk, "c51.weights.out"));
  CHECK(has(of("ensemble.trunk"), "ensemble.backward"));
  CHECK_FALSE(has(of("ensemble.weights"), "ensemble.trunk"));  // beside it
  CHECK_FALSE(has(of("ensemble.bias"), "ensemble.weights"));   // beside it
  CHECK(has(of("ensemble.bias.hidden"), "ensemble.backward"));
  CHECK_FALSE(has(of("ensemble.trunk"), "ensemble.bias.hidden"));  // dhidden comes masked: no wait for the sums
  CHECK(has(update, "ensemble.bias.hidden"));
  CHECK_FALSE(has(of("ensemble.loss"), "ensemble.disagreement"));  // the metric is off the loss's path
  // IQN: each layer's gradients start when its own input gradient is there
  CHECK(has(of("iqn.backward"), "iqn.backward.hidden"));
  CHECK_FALSE(has(of("iqn.weights.out"), "iqn.backward.hidden"));  // beside the whole input side
  CHECK_FALSE(has(of("iqn.weights.out"), "iqn.backward"));
  CHECK(has(of("iqn.weights.hidden"), "iqn.backward.hidden"));
  CHECK_FALSE(has(of("iqn.weights.hidden"), "iqn.backward"));
  CHECK(has(of("iqn.weights"), "iqn.backward"));
  for (const char* s : {"iqn.weights.out", "iqn.weights.hidden", "iqn.weights"}) CHECK(has(of(s), "iqn.ones"));
  for (const char* s : {"iqn.weights.out", "iqn.weights.hidden", "ensemble.bias"}) CHECK(has(update, s));
  CHECK(has(of("trunk.weights.1"), "trunk.backward.1"));
  CHECK_FALSE(has(of("trunk.weights.0"), "trunk.weights.1"));
  CHECK(has(of("trunk.weights.0"), "trunk.backward.1"));  // layer 0's gradient: masked in layer 1's GEMM
  CHECK(has(update, "trunk.weights.0"));
  CHECK(has(update, "trunk.weights.1"));
}

TEST_CASE("heads.nonfinite_in_one_auxiliary_skips_the_step") {
  // NaN iqn output biases poison only the iqn head's loss and gradient: the whole step's updates
  // are skipped, every parameter, moment, t and target unchanged, and the next good step runs.
  const PipelineSpec spec = parse(tiny_pipeline(std::string(kIqn) + "  - {plugin: cql}\n"));
  auto e = make(spec, false);
  e->step();
  const auto* p = e->registry().find_param("iqn.1.bias");
  REQUIRE(p);
  // Every output bias (ReLU maps a NaN pre-activation to 0, so a hidden bias would not do).
  const auto theta = host_buffer(*e, "params");
  for (std::int64_t i = 0; i < p->numel(); ++i)
    host_write(*e, "params", p->offset + i, std::numeric_limits<double>::quiet_NaN());
  const std::vector<std::string> state{"params", "target", "adam.m", "adam.v", "opt/t"};
  std::vector<std::vector<double>> before;
  for (const auto& s : state) before.push_back(host_buffer(*e, s));
  e->step();
  StepReport r = e->read_report();
  CHECK(std::isfinite(r.losses[0]));
  CHECK(std::isnan(r.losses[1]));
  CHECK(std::isfinite(r.losses[2]));
  CHECK(r.skipped_steps == 1);
  CHECK(r.adam_step == 1);
  for (std::size_t k = 0; k < state.size(); ++k) {
    INFO(state[k]);
    const auto after = host_buffer(*e, state[k]);
    REQUIRE(after.size() == before[k].size());
    CHECK(std::memcmp(after.data(), before[k].data(), after.size() * sizeof(double)) == 0);
  }
  for (std::int64_t i = 0; i < p->numel(); ++i) host_write(*e, "params", p->offset + i, theta[std::size_t(p->offset + i)]);
  e->step();
  r = e->read_report();
  CHECK(r.skipped_steps == 1);
  CHECK(r.adam_step == 2);
}

TEST_CASE("heads.full_pipeline_f32_matches_f64_and_is_deterministic") {
  const PipelineSpec spec =
      parse(tiny_pipeline(std::string(kIqn) + "  - {plugin: ensemble, members: 2}\n  - {plugin: cql}\n",
                          "spectral_norm: {enabled: true, sigma_max: 2}\n"));
  auto a = make(spec, false), b = make(spec, false), c = make(spec, true);
  for (int i = 0; i < 20; ++i) {
    a->step();
    b->step();
    c->step();
  }
  CHECK(host_buffer(*a, "params") == host_buffer(*b, "params"));
  const auto pa = host_buffer(*a, "params"), pc = host_buffer(*c, "params");
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    diff += (pa[i] - pc[i]) * (pa[i] - pc[i]);
    ref += pc[i] * pc[i];
  }
  CHECK(std::sqrt(diff / ref) < 1e-5);
  const StepReport ra = a->read_report(), rc = c->read_report();
  for (std::size_t h = 0; h < 4; ++h) CHECK(ra.losses[h] == doctest::Approx(rc.losses[h]).epsilon(1e-5));
  CHECK(ra.skipped_steps == 0);
}

TEST_CASE("heads.layout.aligned_groups") {
  // Every contiguous parameter group starts on 16 bytes (kParamAlign), with awkward sizes
  // everywhere (A·Z = 15, D·A = 6, member sizes odd before padding): the GEMMs on them, and the
  // batched ones across ensemble members, can get aligned kernels. Inside a group the tensors
  // follow directly (bdq reads them as one block), and the padding holds zeros.
  const PipelineSpec spec =
      parse(tiny_pipeline(std::string(kIqn) + "  - {plugin: ensemble, members: 3}\n  - {plugin: cql}\n"));
  auto e = make(spec, false);
  const Registry& reg = e->registry();
  int flagged = 0;
  std::vector<bool> covered(std::size_t(reg.param_count()), false);
  for (const auto& p : reg.params()) {
    for (std::int64_t i = 0; i < p.numel(); ++i) covered[std::size_t(p.offset + i)] = true;
    if (!(p.flags & kParamAlign)) continue;
    ++flagged;
    INFO(p.name);
    CHECK(p.offset % kParamAlignElems == 0);
  }
  auto off = [&](const std::string& n) {
    const auto* p = reg.find_param(n);
    REQUIRE(p);
    return p->offset;
  };
  for (const std::string pre : {"c51", "ensemble.0", "ensemble.1", "ensemble.2"}) {
    INFO(pre);
    for (const char* start : {".value.0.weight", ".value.0.bias", ".value.1.weight", ".value.1.bias", ".branch.0.1.weight",
                              ".branch.0.1.bias"})
      CHECK(off(pre + start) % kParamAlignElems == 0);
    // contiguous inside the blocks: branch 1 follows branch 0
    CHECK(off(pre + ".branch.1.0.weight") == off(pre + ".branch.0.0.weight") + reg.find_param(pre + ".branch.0.0.weight")->numel());
    CHECK(off(pre + ".branch.1.1.bias") == off(pre + ".branch.0.1.bias") + 16);  // A·Z = 15, padded (kParamPadRows)
    CHECK(off(pre + ".branch.1.1.weight") == off(pre + ".branch.0.1.weight") + 16 * reg.find_param(pre + ".branch.0.1.weight")->cols);
  }
  // one stride from member to member
  CHECK(off("ensemble.1.value.0.weight") - off("ensemble.0.value.0.weight") ==
        off("ensemble.2.value.0.weight") - off("ensemble.1.value.0.weight"));
  CHECK(flagged >= 4 * 6 + 6 + 4);  // 4 head blocks × 6 groups, IQN's 6 tensors, the trunk's 4
  // The padding is never a parameter, and stays zero after steps.
  e->step();
  e->step();
  const auto theta = host_buffer(*e, "params");
  int pad = 0, nonzero = 0;
  for (std::size_t i = 0; i < covered.size(); ++i)
    if (!covered[i]) {
      ++pad;
      nonzero += theta[i] != 0.0;
    }
  CHECK(pad > 0);
  CHECK(nonzero == 0);
}

TEST_CASE("heads.budget.reach_covers_every_written_gradient") {
  // The norms read each head's gradient row only inside its reach (Budget::reach, from the stages'
  // declared writes): after steps, every element outside it is exactly 0, each head's reach holds
  // the trunk, and the auxiliaries' reaches leave out most of the other heads' parameters.
  const PipelineSpec spec =
      parse(tiny_pipeline(std::string(kIqn) + "  - {plugin: ensemble, members: 3}\n  - {plugin: cql}\n"));
  auto e = make(spec, false);
  const Registry& reg = e->registry();
  const std::int64_t P = reg.param_count();
  e->step();
  e->step();
  const auto reach = host_buffer(*e, "budget/reach");
  const auto grads = host_buffer(*e, "grad/all");
  const std::vector<std::string> heads{"c51", "iqn", "ensemble", "cql"};
  REQUIRE(reach.size() == heads.size() * kBudgetReach * 2);
  REQUIRE(grads.size() == heads.size() * std::size_t(P));
  auto inside = [&](std::size_t h, std::int64_t i) {
    for (int q = 0; q < kBudgetReach; ++q)
      if (i >= std::int64_t(reach[(h * kBudgetReach + q) * 2]) && i < std::int64_t(reach[(h * kBudgetReach + q) * 2 + 1]))
        return true;
    return false;
  };
  for (std::size_t h = 0; h < heads.size(); ++h) {
    CAPTURE(heads[h]);
    std::int64_t in = 0, nonzero_in = 0, nonzero_out = 0;
    for (std::int64_t i = 0; i < P; ++i) {
      const double v = grads[h * std::size_t(P) + std::size_t(i)];
      if (inside(h, i)) {
        ++in;
        nonzero_in += v != 0.0;
      } else {
        nonzero_out += v != 0.0;
      }
    }
    CHECK(nonzero_out == 0);
    CHECK(nonzero_in > 0);
    const auto* t0 = reg.find_param("trunk.0.weight");
    REQUIRE(t0);
    CHECK(inside(h, t0->offset));
    if (heads[h] == "iqn") CHECK(in < P / 2);
    if (heads[h] != "ensemble") CHECK_FALSE(inside(h, reg.find_param("ensemble.1.value.0.weight")->offset));
  }
}
