// The whole C51 step on the CPU reference: finite-difference gradients w.r.t. every parameter
// tensor (f64), budgets, the NaN/Inf skip, Adam/target semantics, no allocation or lookup per step.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <random>
#include <string>

#include "core/engine_access.hpp"
#include "pipeline/parse.hpp"
#include "core/plugin_loader.hpp"

namespace {
std::atomic<long> g_allocations{0};
std::atomic<bool> g_counting{false};
}  // namespace

#pragma GCC diagnostic ignored "-Wmismatched-new-delete"  // malloc/free back these replacements
// Count every heap allocation made while g_counting is set (the per-step no-allocation test). Every
// form is replaced (array, sized, aligned, nothrow), so that no allocation made by one allocator is
// freed by another (AddressSanitizer reports such a pair).
namespace {
void* counted(std::size_t n, std::size_t align) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  n = n ? n : 1;
  void* p = align > alignof(std::max_align_t) ? std::aligned_alloc(align, (n + align - 1) / align * align) : std::malloc(n);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace
void* operator new(std::size_t n) { return counted(n, 0); }
void* operator new[](std::size_t n) { return counted(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return counted(n, std::size_t(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted(n, std::size_t(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return counted(n, std::size_t(a));
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t& t) noexcept { return operator new(n, a, t); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {
using namespace dqn;

const PluginLoader& loader() {
  static PluginLoader l(PluginLoader::search_path_from(""));
  return l;
}

// Small awkward sizes: nothing a multiple of 8, a support narrow enough that the projection clamps.
std::string tiny_pipeline(const std::string& extra = "") {
  return R"(
name: tiny
seed: 7
backend: cpu
precision: fp32
network: {state: 5, trunk: [7, 6], head_hidden: 4, branches: 2, actions: 3, atoms: 5, v_min: -2, v_max: 2}
heads:
  - {plugin: c51, role: primary}
batch: 6
gamma: 0.9
report_every: 1
)" + extra;
}

PipelineSpec parse(const std::string& text) {
  ParseOptions o;
  o.plugins = &loader();
  return parse_pipeline(text, "tiny.yaml", o);
}

std::unique_ptr<Engine> make(const PipelineSpec& spec, bool f64, std::uint64_t batch_seed = 3) {
  EngineOptions eo;
  eo.f64 = f64;
  auto e = std::make_unique<Engine>(spec, loader(), eo);
  init_weights(*e, spec.seed);
  set_batch(*e, HostBatch::random(spec, batch_seed));
  return e;
}

double loss_of(Engine& e) {
  e.forward_backward();
  return host_buffer(e, "loss/c51")[0];
}

double norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}
}  // namespace

TEST_CASE("step.c51.fd_every_parameter") {
  // ∂L_c51/∂θ from the backward stages against central differences of the forward, in double,
  // for every parameter tensor (trunk and head).
  const PipelineSpec spec = parse(tiny_pipeline("spectral_norm: {enabled: true, sigma_max: 2}\n"));
  auto e = make(spec, true);
  e->forward_backward();
  const std::vector<double> grad = host_buffer(*e, "grad/c51");
  const std::vector<double> theta = host_buffer(*e, "params");
  const double eps = 1e-6;
  std::mt19937 rng(11);
  int checked = 0;
  for (const auto& p : e->registry().params()) {
    std::vector<std::int64_t> idx{0, p.numel() / 2, p.numel() - 1};
    std::uniform_int_distribution<std::int64_t> pick(0, p.numel() - 1);
    for (int k = 0; k < 3; ++k) idx.push_back(pick(rng));
    double max_abs = 0;
    for (std::int64_t i = 0; i < p.numel(); ++i) max_abs = std::max(max_abs, std::fabs(grad[std::size_t(p.offset + i)]));
    CHECK_MESSAGE(max_abs > 0, "no gradient reaches " << p.name);
    for (auto i : idx) {
      const std::int64_t at = p.offset + i;
      host_write(*e, "params", at, theta[std::size_t(at)] + eps);
      const double lp = loss_of(*e);
      host_write(*e, "params", at, theta[std::size_t(at)] - eps);
      const double lm = loss_of(*e);
      host_write(*e, "params", at, theta[std::size_t(at)]);
      const double fd = (lp - lm) / (2 * eps);
      const double an = grad[std::size_t(at)];
      INFO(p.name << "[" << i << "]: fd " << fd << " analytic " << an);
      CHECK(std::fabs(fd - an) <= 1e-7 + 1e-5 * std::max(std::fabs(fd), max_abs));
      ++checked;
    }
  }
  CHECK(checked == 6 * int(e->registry().params().size()));
  // Restored parameters give the original gradient back.
  e->forward_backward();
  CHECK(host_buffer(*e, "grad/c51") == grad);
}

TEST_CASE("step.c51.loss_matches_report_and_td_error") {
  const PipelineSpec spec = parse(tiny_pipeline());
  auto e = make(spec, true);
  e->step();
  const StepReport r = e->read_report();
  REQUIRE(r.heads.size() == 1);
  CHECK(r.losses[0] > 0);
  CHECK(r.total_loss == doctest::Approx(r.losses[0]).epsilon(1e-12));
  // loss = (1/B) Σ w_b td_error(b)
  const auto w = host_buffer(*e, "batch/is_weights");
  double s = 0;
  for (int b = 0; b < spec.batch; ++b) s += w[std::size_t(b)] * r.td_error[std::size_t(b)];
  CHECK(r.losses[0] == doctest::Approx(s / spec.batch).epsilon(1e-6));
  CHECK(r.adam_step == 1);
  CHECK(r.skipped_steps == 0);
}

TEST_CASE("step.budget.primary_alone_takes_full_norm") {
  // Tiny G: the clipped gradient has norm G exactly (up to the 1e-6 guard); huge G: untouched.
  for (double G : {1e-4, 1e6}) {
    CAPTURE(G);
    PipelineSpec spec = parse(tiny_pipeline("max_grad_norm: " + std::to_string(G) + "\n"));
    auto e = make(spec, true);
    e->step();
    const auto gh = host_buffer(*e, "grad/c51");
    const auto g = host_buffer(*e, "grad/total");
    const StepReport r = e->read_report();
    CHECK(r.fractions[0] == 1.0);
    CHECK(r.grad_norms[0] == doctest::Approx(norm(gh)).epsilon(1e-12));
    const double c = std::min(1.0, G / (norm(gh) + 1e-6));
    CHECK(r.clips[0] == doctest::Approx(c).epsilon(1e-6));  // G travels as f32
    CHECK(norm(g) == doctest::Approx(std::min(G * norm(gh) / (norm(gh) + 1e-6), norm(gh))).epsilon(1e-10));
    if (G < 1) CHECK(norm(g) == doctest::Approx(G).epsilon(1e-3));
    else CHECK(g == gh);
  }
}

TEST_CASE("step.budget.fraction_changes_between_steps") {
  PipelineSpec spec = parse(tiny_pipeline("max_grad_norm: 0.001\n"));
  auto e = make(spec, true);
  e->update().set_fraction(0, 0.25);
  e->step();
  const StepReport r = e->read_report();
  CHECK(r.clips[0] == doctest::Approx(0.25 * 0.001 / (r.grad_norms[0] + 1e-6)).epsilon(1e-6));
  CHECK(norm(host_buffer(*e, "grad/total")) == doctest::Approx(0.25 * 0.001).epsilon(1e-3));
  CHECK_THROWS_AS(e->update().set_fraction(0, 1.5), std::invalid_argument);
  CHECK_THROWS_AS(e->update().set_fraction(3, 0.5), std::out_of_range);
  CHECK_THROWS_AS(e->update().set_fractions({0.5, 0.5}), std::invalid_argument);  // one head
  CHECK(e->update().fractions() == std::vector<double>{0.25});
}

TEST_CASE("step.nonfinite_gradient_skips_every_update") {
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    CAPTURE(bad);
    PipelineSpec spec = parse(tiny_pipeline("spectral_norm: {enabled: true, sigma_max: 0.5}\ntarget: {polyak: 0.5}\n"));
    auto e = make(spec, false);
    e->step();  // a normal step first so moments and t are non-trivial
    const std::vector<std::string> state{"params", "target", "adam.m", "adam.v", "opt/t",
                                         "sn.u.trunk.0.weight", "sn.u.c51.value.1.weight"};
    std::vector<std::vector<double>> before;
    for (const auto& s : state) before.push_back(host_buffer(*e, s));
    // An importance weight of NaN or Inf poisons the loss and so the gradient (a reward would
    // not: Tz is clamped to the support).
    const double w0 = host_buffer(*e, "batch/is_weights")[0];
    host_write(*e, "batch/is_weights", 0, bad);
    e->step();
    for (std::size_t k = 0; k < state.size(); ++k) {
      INFO(state[k]);
      const auto after = host_buffer(*e, state[k]);
      REQUIRE(after.size() == before[k].size());
      for (std::size_t i = 0; i < after.size(); ++i) CHECK(std::memcmp(&after[i], &before[k][i], sizeof(double)) == 0);
    }
    StepReport r = e->read_report();
    CHECK(r.skipped_steps == 1);
    CHECK(r.adam_step == 1);
    host_write(*e, "batch/is_weights", 0, w0);
    e->step();
    r = e->read_report();
    CHECK(r.skipped_steps == 1);
    CHECK(r.adam_step == 2);
    CHECK(host_buffer(*e, "params") != before[0]);
  }
}

TEST_CASE("step.target.polyak_and_hard_period") {
  {
    PipelineSpec spec = parse(tiny_pipeline("target: {polyak: 0.25}\n"));
    auto e = make(spec, true);
    const auto t0 = host_buffer(*e, "target");
    e->step();
    const auto p1 = host_buffer(*e, "params");
    const auto t1 = host_buffer(*e, "target");
    for (std::size_t i = 0; i < t1.size(); i += 7) CHECK(t1[i] == doctest::Approx(t0[i] + 0.25 * (p1[i] - t0[i])).epsilon(1e-12));
  }
  {
    PipelineSpec spec = parse(tiny_pipeline("target: {period: 3}\n"));
    auto e = make(spec, true);
    const auto t0 = host_buffer(*e, "target");
    e->step();
    e->step();
    CHECK(host_buffer(*e, "target") == t0);
    CHECK(host_buffer(*e, "params") != t0);
    e->step();
    CHECK(host_buffer(*e, "target") == host_buffer(*e, "params"));
  }
}

TEST_CASE("step.no_allocation_or_lookup_during_steps") {
  PipelineSpec spec = parse(tiny_pipeline("spectral_norm: {enabled: true, sigma_max: 2}\n"));
  auto e = make(spec, false);
  e->step();  // first step outside the window (lazy library state, if any)
  const auto lookups = e->registry().lookups();
  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < 50; ++i) e->step();
  g_counting = false;
  CHECK(g_allocations.load() == 0);
  CHECK(e->registry().lookups() == lookups);
  CHECK(e->registry().lookups_after_seal() == 0);
  CHECK(e->registry().arena_allocations() == 1);
  // A lookup by name during steps is refused, and counted.
  CHECK_THROWS_AS((void)e->registry().real("params"), std::logic_error);
  CHECK(e->registry().lookups_after_seal() == 1);
}

TEST_CASE("step.deterministic_and_f32_matches_f64") {
  const PipelineSpec spec = parse(tiny_pipeline("spectral_norm: {enabled: true, sigma_max: 2}\n"));
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
}

TEST_CASE("step.adam_moves_params_and_counts") {
  const PipelineSpec spec = parse(tiny_pipeline());
  auto e = make(spec, true);
  const auto p0 = host_buffer(*e, "params");
  e->forward_backward();
  const auto g = host_buffer(*e, "grad/c51");
  e->step();
  const auto p1 = host_buffer(*e, "params");
  // First Adam step: θ1 = θ0 − lr·g/(|g| + ε) elementwise (bias corrections cancel), clip 1 here.
  for (std::size_t i = 0; i < p0.size(); i += 5)
    CHECK(p1[i] == doctest::Approx(p0[i] - 1e-4 * g[i] / (std::fabs(g[i]) + 1e-8)).epsilon(1e-9));
  CHECK(host_buffer(*e, "opt/t")[0] == 1);
}

TEST_CASE("step.checkpoint_roundtrip") {
  const PipelineSpec spec = parse(tiny_pipeline("spectral_norm: {enabled: true, sigma_max: 2}\n"));
  auto a = make(spec, false);
  for (int i = 0; i < 3; ++i) a->step();
  const st::File f = save_weights(*a, false);
  // 2 + 2 + 2D spectrally normed matrices.
  int sn = 0;
  for (const auto& n : f.names()) sn += n.rfind("sn.u.", 0) == 0;
  CHECK(sn == 2 + 2 + 2 * spec.network.branches);
  CHECK(f.get_scalar_i64("adam.step") == 3);
  auto b = make(spec, false);
  load_weights(*b, f);
  a->step();
  b->step();
  CHECK(host_buffer(*a, "params") == host_buffer(*b, "params"));
  CHECK(host_buffer(*a, "target") == host_buffer(*b, "target"));
  // A file for another network is refused, naming what is missing.
  st::File wrong = f;
  wrong.tensors.erase("target.trunk.1.bias");
  CHECK_THROWS_WITH_AS(load_weights(*b, wrong), doctest::Contains("target.trunk.1.bias"), std::invalid_argument);
  st::File shape = f;
  shape.put_f32("trunk.0.bias", {3}, std::vector<float>(3, 0.f).data());
  CHECK_THROWS_WITH(load_weights(*b, shape), doctest::Contains("trunk.0.bias"));
  // Values that cannot be trained from are refused, and a refused file changes nothing.
  const std::vector<double> before = host_buffer(*b, "params"), v_before = host_buffer(*b, "adam.v");
  st::File nan = f;
  const float bad = std::nanf("");
  std::memcpy(nan.tensors.at("adam.m.trunk.1.weight").bytes.data() + 4 * 9, &bad, 4);
  CHECK_THROWS_WITH(load_weights(*b, nan), doctest::Contains("tensor 'adam.m.trunk.1.weight': element 9 is nan"));
  st::File negative = f;
  const float minus = -0.5f;
  std::memcpy(negative.tensors.at("adam.v.trunk.0.bias").bytes.data(), &minus, 4);
  CHECK_THROWS_WITH(load_weights(*b, negative), doctest::Contains("must be finite and >= 0"));
  CHECK(host_buffer(*b, "params") == before);
  CHECK(host_buffer(*b, "adam.v") == v_before);
  // A batch with a non-finite state is refused, naming it.
  HostBatch hb = HostBatch::random(spec, 2);
  hb.next_states[std::size_t(3 * hb.S + 1)] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_WITH_AS(set_batch(*b, hb), doctest::Contains("next_states[3,1] is not finite"), std::invalid_argument);
}

TEST_CASE("step.sizes_the_ops_cannot_index_are_refused_before_allocating") {
  // 2^31 elements or more in one buffer: named with its owner, before any memory is taken.
  PipelineSpec spec = parse(tiny_pipeline(""));
  spec.batch = 1 << 26;
  spec.network.trunk[0] = 64;
  CHECK_THROWS_WITH_AS(Engine(spec, loader()), doctest::Contains("more than the 2^31 - 1 the ops index"),
                       std::invalid_argument);
}

