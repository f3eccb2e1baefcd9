// Data parallel on the CPU reference (devices: one rank per listed device, as threads, reducing on
// the host): two ranks on two halves of a batch step as one rank on the whole batch; the ranks'
// parameters stay bit-identical; the gradient all-reduce's buckets follow the backward; a
// non-finite gradient on one rank skips the step on every rank; a rank that fails stops the others;
// the pipeline's `devices` key. tests/gpu/ranks_gpu_test.cpp holds the CUDA ranks (NCCL) to the same.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/engine_access.hpp"
#include "core/plugin_loader.hpp"
#include "core/rank_group.hpp"
#include "pipeline/parse.hpp"

using namespace dqn;

namespace {

const PluginLoader& loader() {
  static PluginLoader l(PluginLoader::search_path_from(""));
  return l;
}

// Small awkward sizes.
std::string pipeline(int batch, const std::string& heads, const std::string& extra = "") {
  return "name: ranks\nseed: 7\nbackend: cpu\nprecision: fp32\n"
         "network: {state: 5, trunk: [7, 6], head_hidden: 4, branches: 2, actions: 3, atoms: 5, v_min: -2, v_max: 2}\n"
         "heads:\n" + heads + "batch: " + std::to_string(batch) +
         "\ngamma: 0.9\nreport_every: 1\nmax_grad_norm: 0.05\n"  // small: the clips are active
         "optimizer: {adam: {lr: 0.01}}\nspectral_norm: {enabled: true, sigma_max: 1.5}\n" + extra;
}
const std::string kC51 = "  - {plugin: c51, role: primary}\n";
const std::string kThree = kC51 + "  - {plugin: ensemble, role: auxiliary, budget: 0.2, members: 2}\n"
                                  "  - {plugin: cql, role: auxiliary, budget: 0.1}\n";
// All four: IQN draws its fractions per row of the global batch (each rank its rows' share).
const std::string kFour =
    kThree + "  - {plugin: iqn, role: auxiliary, budget: 0.2, quantiles: 3, target_quantiles: 4, embed: 4}\n";

PipelineSpec parse(const std::string& text, std::vector<std::string> overrides = {}) {
  ParseOptions o;
  o.plugins = &loader();
  o.overrides = std::move(overrides);
  return parse_pipeline(text, "ranks.yaml", o);
}

struct Ranks {
  std::shared_ptr<RankGroup> group;
  std::vector<std::unique_ptr<Engine>> engines;
};

/// `n` ranks on the CPU (f64 or f32), each built, initialised and given its batch on its own
/// thread, then `steps` steps each.
Ranks run(const PipelineSpec& spec, int n, bool f64, const std::vector<HostBatch>& batches, int steps) {
  Ranks r;
  std::vector<int> devices;
  for (int i = 0; i < n; ++i) devices.push_back(i);
  r.group = make_host_group(devices);
  r.engines.resize(std::size_t(n));
  run_ranks(*r.group, [&](int rank) {
    EngineOptions eo;
    eo.f64 = f64;
    eo.group = r.group;
    eo.rank = rank;
    auto e = std::make_unique<Engine>(spec, loader(), eo);
    init_weights(*e, spec.seed);
    set_batch(*e, batches[std::size_t(rank)]);
    for (int s = 0; s < steps; ++s) e->step();
    r.engines[std::size_t(rank)] = std::move(e);
  });
  return r;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace

TEST_CASE("ranks.two_ranks_on_halves_step_as_one_rank_on_the_whole_batch") {
  for (const std::string& heads : {kC51, kThree, kFour}) {
    CAPTURE(heads);
    const int B = 6, steps = 4;
    const PipelineSpec whole = parse(pipeline(2 * B, heads));
    const PipelineSpec half = parse(pipeline(B, heads));
    const HostBatch batch = HostBatch::random(whole, 3);

    EngineOptions eo;
    eo.f64 = true;
    Engine one(whole, loader(), eo);
    init_weights(one, whole.seed);
    set_batch(one, batch);
    for (int s = 0; s < steps; ++s) one.step();

    Ranks two = run(half, 2, true, {batch.rows(0, B), batch.rows(B, B)}, steps);
    REQUIRE(two.engines[0]->parallel().buckets().size() == 3);  // the heads', trunk.1's, trunk.0's
    // The clips are active (max_grad_norm 0.05), so a clip computed per rank would differ.
    const StepReport r1 = one.read_report();
    CHECK(*std::min_element(r1.clips.begin(), r1.clips.end()) < 1.0);
    for (auto& e : two.engines) {
      const StepReport r2 = e->read_report();
      for (std::size_t h = 0; h < r1.losses.size(); ++h) {
        CAPTURE(r1.heads[h]);
        CHECK(r2.losses[h] == doctest::Approx(r1.losses[h]).epsilon(1e-12));
        CHECK(r2.grad_norms[h] == doctest::Approx(r1.grad_norms[h]).epsilon(1e-12));
        CHECK(r2.clips[h] == doctest::Approx(r1.clips[h]).epsilon(1e-12));
      }
      CHECK(r2.total_loss == doctest::Approx(r1.total_loss).epsilon(1e-12));
      for (const char* name : {"params", "target", "adam.m", "adam.v"}) {
        CAPTURE(name);
        CHECK(max_abs_diff(host_buffer(*e, name), host_buffer(one, name)) < 1e-12);
      }
      CHECK(host_buffer(*e, buf::step)[0] == steps);
    }
    if (heads == kFour)  // the last step's fractions: each rank's rows of the whole batch's draw
      for (const char* tau : {"iqn/tau", "iqn/tau_target"}) {
        CAPTURE(tau);
        const std::vector<double> all = host_buffer(one, tau);
        const std::vector<double> r0 = host_buffer(*two.engines[0], tau), r1 = host_buffer(*two.engines[1], tau);
        REQUIRE(all.size() == r0.size() + r1.size());
        std::vector<double> joined = r0;
        joined.insert(joined.end(), r1.begin(), r1.end());
        CHECK(joined == all);
        CHECK(r0 != r1);
      }
  }
}

TEST_CASE("ranks.parameters_stay_bit_identical_over_the_ranks") {
  const PipelineSpec spec = parse(pipeline(6, kThree));
  std::vector<HostBatch> batches;
  for (int r = 0; r < 3; ++r) batches.push_back(HostBatch::random(spec, 11 + std::uint64_t(r)));
  Ranks three = run(spec, 3, false, batches, 60);
  for (const char* name : {"params", "target", "adam.m", "adam.v"}) {
    CAPTURE(name);
    const auto first = host_buffer(*three.engines[0], name);
    for (std::size_t r = 1; r < 3; ++r) CHECK(host_buffer(*three.engines[r], name) == first);  // exact
  }
  // and they moved: the ranks' batches differ, the averaged gradient is not rank 0's own
  EngineOptions eo;
  Engine alone(spec, loader(), eo);
  init_weights(alone, spec.seed);
  set_batch(alone, batches[0]);
  for (int s = 0; s < 60; ++s) alone.step();
  CHECK(host_buffer(alone, "params") != host_buffer(*three.engines[0], "params"));
}

TEST_CASE("ranks.the_all_reduce_follows_the_backward") {
  const PipelineSpec spec = parse(pipeline(6, kThree));
  auto group = make_host_group({0, 1});
  std::vector<std::vector<std::pair<std::string, std::vector<std::string>>>> waits(2);
  std::vector<std::vector<std::pair<std::string, std::int64_t>>> buckets(2);
  run_ranks(*group, [&](int rank) {
    Engine e(spec, loader(), EngineOptions::of_rank(group, rank));
    waits[std::size_t(rank)] = stage_waits(e);
    buckets[std::size_t(rank)] = e.parallel().buckets();
  });
  CHECK(buckets[0] == buckets[1]);
  REQUIRE(buckets[0].size() == 3);
  CHECK(buckets[0][0].first == "ranks.reduce.heads");
  CHECK(buckets[0][1].first == "ranks.reduce.trunk.1");
  CHECK(buckets[0][2].first == "ranks.reduce.trunk.0");
  // trunk.1's rows: weight 6×7 and bias 6 per head, padded as the registry stores them; 3 heads
  CHECK(buckets[0][1].second >= 3 * (6 * 7 + 6));
  auto waits_of = [&](const std::string& stage) {
    for (const auto& [name, w] : waits[0])
      if (name == stage) return w;
    FAIL("no stage " << stage);
    return std::vector<std::string>{};
  };
  auto has = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  // trunk layer 1's bucket waits for that layer's gradients, not for the layer below's, so it runs
  // while layer 0's are computed; the buckets chain; the update waits for the last
  const auto t1 = waits_of("ranks.reduce.trunk.1");
  CHECK(has(t1, "trunk.weights.1"));
  CHECK(has(t1, "trunk.bias.1"));
  CHECK_FALSE(has(t1, "trunk.weights.0"));
  CHECK_FALSE(has(t1, "trunk.backward.1"));
  CHECK(has(t1, "ranks.reduce.heads"));
  CHECK(has(waits_of("ranks.reduce.trunk.0"), "ranks.reduce.trunk.1"));
  CHECK(has(waits_of("update"), "ranks.reduce.trunk.0"));
  CHECK_FALSE(has(waits_of("ranks.reduce.heads"), "trunk.weights.1"));
}

TEST_CASE("ranks.a_non_finite_gradient_on_one_rank_skips_the_step_on_every_rank") {
  const PipelineSpec spec = parse(pipeline(6, kC51));
  auto group = make_host_group({0, 1});
  std::vector<std::vector<double>> before(2), after(2);
  std::vector<std::int64_t> skipped(2);
  run_ranks(*group, [&](int rank) {
    Engine e(spec, loader(), EngineOptions::of_rank(group, rank));
    init_weights(e, spec.seed);
    set_batch(e, HostBatch::random(spec, 5 + std::uint64_t(rank)));
    if (rank == 1) host_write(e, buf::rewards, 2, std::numeric_limits<double>::quiet_NaN());
    before[std::size_t(rank)] = host_buffer(e, "params");
    e.step();
    after[std::size_t(rank)] = host_buffer(e, "params");
    skipped[std::size_t(rank)] = e.read_report().skipped_steps;
  });
  CHECK(skipped == std::vector<std::int64_t>{1, 1});
  CHECK(after[0] == before[0]);
  CHECK(after[1] == before[1]);
  CHECK(after[0] == after[1]);
}

TEST_CASE("ranks.a_rank_that_fails_stops_the_others") {
  const PipelineSpec spec = parse(pipeline(6, kC51));
  auto group = make_host_group({0, 1, 2});
  std::vector<int> stepped(3, 0);
  CHECK_THROWS_WITH_AS(run_ranks(*group,
                                 [&](int rank) {
                                   Engine e(spec, loader(), EngineOptions::of_rank(group, rank));
                                   if (rank == 2) throw std::invalid_argument("rank two's batch is bad");
                                   init_weights(e, spec.seed);  // broadcasts: waits for rank 2
                                   ++stepped[std::size_t(rank)];
                                 }),
                       "rank two's batch is bad", std::invalid_argument);
  CHECK(stepped == std::vector<int>{0, 0, 0});
}

TEST_CASE("ranks.the_devices_key") {
  CHECK(parse(pipeline(6, kC51)).devices == std::vector<int>{0});
  CHECK(parse(pipeline(6, kC51, "devices: all\n")).devices.empty());
  CHECK(parse(pipeline(6, kC51), {"devices=[1,0,3]"}).devices == std::vector<int>{1, 0, 3});
  CHECK(parse(pipeline(6, kC51), {"devices=all"}).devices.empty());
  auto error_of = [](const std::string& text) {
    try {
      parse(text);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string twice = error_of(pipeline(6, kC51, "devices: [0, 1, 0]\n"));
  CAPTURE(twice);
  CHECK(twice.find("ranks.yaml:14:17: key 'devices[2]' = '0'") != std::string::npos);
  CHECK(twice.find("devices[2]") != std::string::npos);
  CHECK(twice.find("0 is listed twice (also at index 0)") != std::string::npos);
  const std::string word = error_of(pipeline(6, kC51, "devices: every\n"));
  CHECK(word.find("devices") != std::string::npos);
  CHECK(word.find("a list of device ordinals, or all") != std::string::npos);
  CHECK(error_of(pipeline(6, kC51, "devices: [-1]\n")).find("devices[0]") != std::string::npos);
  CHECK(error_of(pipeline(6, kC51, "devices: []\n")).find("needs 1 to 64 devices") != std::string::npos);
  // the CPU backend runs as many ranks as listed, one for all; CUDA checks the GPUs present
  PipelineSpec s = parse(pipeline(6, kC51, "devices: [4, 2]\n"));
  CHECK(rank_devices(s, BackendKind::cpu) == std::vector<int>{4, 2});
  s.devices.clear();
  CHECK(rank_devices(s, BackendKind::cpu) == std::vector<int>{0});
  if (cuda_device_count() == 0) {
    s.devices = {0};
    CHECK_THROWS_WITH_AS(rank_devices(s, BackendKind::cuda), "devices[0]: 0: no such GPU (this machine has 0)",
                         std::invalid_argument);
  }
}
