// The replay's CUDA kernels against the CPU reference: the same rows and priorities in, the same
// tree (to the bit), the same drawn slots and rows, and importance weights within rounding; then
// the engine drawing its batch inside the captured step, slot for slot as the CPU engine draws.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../replay_harness.hpp"
#include "../test_util.hpp"
#include "core/engine_access.hpp"
#include "core/plugin_loader.hpp"
#include "dqn_config.h"
#include "pipeline/parse.hpp"

using namespace dqn;
using dqn::test::Draw;
using dqn::test::ReplayHarness;
using dqn::test::loader;
using dqn::test::source_dir;

namespace {

struct Pair {
  ReplayHarness cpu, gpu;
  Pair(std::int64_t capacity, int S, int D, bool per, int max_batch)
      : cpu(make_cpu_runtime(false), capacity, S, D, per, 0.6f, 1e-3f, max_batch),
        gpu(make_cuda_runtime(CudaSpec{}, Precision::fp32, 0), capacity, S, D, per, 0.6f, 1e-3f, max_batch) {}
};

bool same_nodes(const std::vector<replay::Node>& a, const std::vector<replay::Node>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(replay::Node)) == 0;
}

void check_same_draw(const Draw& c, const Draw& g) {
  CHECK(c.idx == g.idx);
  CHECK(c.states2 == g.states2);
  CHECK(c.actions == g.actions);
  CHECK(c.rewards == g.rewards);
  CHECK(c.dones == g.dones);
  REQUIRE(c.w.size() == g.w.size());
  for (std::size_t b = 0; b < c.w.size(); ++b) CHECK(g.w[b] == doctest::Approx(c.w[b]).epsilon(1e-6));
  for (std::size_t k = 0; k < c.stats.size(); ++k) CHECK(g.stats[k] == doctest::Approx(c.stats[k]).epsilon(1e-6));
}

void run_pair(bool per) {
  // 100,003 slots (levels 100003, 3126, 98, 4, 1), filled past the end so the ring wraps.
  const std::int64_t C = 100003;
  const int S = 5, D = 2, B = 256;
  Pair p(C, S, D, per, B);
  std::mt19937_64 rng(21);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (std::int64_t first = 0; first < 120000; first += 7919) {
    const std::int64_t n = std::min<std::int64_t>(7919, 120000 - first);
    p.cpu.insert_counting(first, n, first + n);
    p.gpu.insert_counting(first, n, first + n);
  }
  CHECK(p.cpu.cursor() == p.gpu.cursor());
  for (int round = 0; round < 30; ++round) {
    CAPTURE(round);
    const Draw c = p.cpu.sample(B, 77, 0.4f, 1.0f, 200000), g = p.gpu.sample(B, 77, 0.4f, 1.0f, 200000);
    check_same_draw(c, g);
    if (per) {
      // New priorities for what was drawn (some rows NaN: they keep theirs).
      std::vector<float> td(static_cast<std::size_t>(B));
      for (auto& x : td) x = u(rng);
      td[3] = std::nanf("");
      p.cpu.priorities(c.idx, td);
      p.gpu.priorities(c.idx, td);
      CHECK(same_nodes(p.cpu.nodes(), p.gpu.nodes()));
      CHECK(p.cpu.max_priority() == p.gpu.max_priority());
    }
  }
  CHECK(p.cpu.cursor() == p.gpu.cursor());
}

}  // namespace

TEST_CASE("gpu.replay.kernels_match_cpu") {
  SUBCASE("uniform") { run_pair(false); }
  SUBCASE("prioritized") { run_pair(true); }
}

TEST_CASE("gpu.replay.engine_draws_as_the_cpu_engine") {
  // The default pipeline's network with a prioritised replay: the same transitions added to a CPU
  // and a CUDA engine; the captured step's first stage draws the same slots as the CPU step's.
  ParseOptions o;
  o.plugins = &loader();
  o.overrides = {"precision=fp32", "training.replay.prioritized=true", "training.replay.capacity=5000"};
  const PipelineSpec spec = load_pipeline(source_dir() + "/pipelines/default.yaml", o);
  auto make = [&](BackendKind b) {
    EngineOptions eo;
    eo.backend = b;
    EngineReplay r;
    r.spec = spec.training.replay;
    r.beta_steps = 10000;
    r.staging_rows = 512;
    eo.replay = r;
    auto e = std::make_unique<Engine>(spec, loader(), eo);
    init_weights(*e, spec.seed);
    return e;
  };
  auto c = make(BackendKind::cpu), g = make(BackendKind::cuda);
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int S = spec.network.state, n = 500;
  const auto rows = static_cast<std::size_t>(n);
  std::vector<float> st(rows * std::size_t(S)), nx(st.size()), rw(rows), dn(rows, 0.0f);
  std::vector<std::int32_t> ac(rows);
  for (int k = 0; k < 7; ++k) {  // 3,500 transitions
    for (auto& x : st) x = u(rng);
    for (auto& x : nx) x = u(rng);
    for (auto& x : rw) x = u(rng);
    for (auto& x : ac) x = std::int32_t(rng() % 2);
    const Transitions t{n, st.data(), nx.data(), ac.data(), rw.data(), dn.data()};
    c->replay().add(t, (k + 1) * n);
    g->replay().add(t, (k + 1) * n);
  }
  c->step();
  g->step();
  const std::vector<std::int64_t> slots = c->replay().drawn_slots();
  CHECK(slots == g->replay().drawn_slots());
  // The batch is those slots' rows, in both.
  const std::vector<double> cs = host_buffer(*c, "batch/states2"), gs = host_buffer(*g, "batch/states2");
  CHECK(cs == gs);
  const std::vector<double> stored = host_buffer(*g, "replay/states");
  for (std::size_t b = 0; b < slots.size(); ++b)
    for (int k = 0; k < S; ++k) CHECK(gs[b * std::size_t(S) + std::size_t(k)] == stored[std::size_t(slots[b]) * std::size_t(S) + std::size_t(k)]);
  // Priorities were updated inside the step: the leaves of the drawn slots moved off the start.
  const ReplayState rc = c->replay().state(), rg = g->replay().state();
  CHECK(rg.draws == 2);  // the first batch, and the next one drawn at the end of the step
  CHECK(rg.size == 3500);
  CHECK(rg.max_priority == doctest::Approx(rc.max_priority).epsilon(1e-4));
  CHECK(rg.total_priority == doctest::Approx(rc.total_priority).epsilon(1e-4));
  for (int i = 0; i < 20; ++i) g->step();
  CHECK(g->replay().state().draws == 22);
  const StepReport rep = g->read_report();
  REQUIRE(rep.replay.has_value());
  CHECK(rep.replay->size == 3500);
}
