// Data parallel on CUDA (devices:), through NCCL inside the captured step. On one GPU: a group of
// one NCCL rank puts the all-reduce's nodes into the graph and steps exactly as no group does, and
// its replays make no synchronising call or allocation (CUPTI). On two GPUs or more: two ranks on
// halves of a batch step as one rank on the whole batch, and their parameters stay bit-identical
// over 1,000 steps. The CPU reference of the same: tests/unit/ranks_test.cpp.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/engine_access.hpp"
#include "core/rank_group.hpp"
#include "cupti_count.hpp"
#include "dqn_config.h"
#include "engine_gpu_util.hpp"

using namespace dqn;
using engine_gpu::loader;
using engine_gpu::rel;

namespace {

std::string pipeline(int batch, bool all_heads) {
  std::string heads = "  - {plugin: c51, role: primary}\n";
  if (all_heads)
    heads += "  - {plugin: ensemble, role: auxiliary, budget: 0.1, members: 4}\n"
             "  - {plugin: cql, role: auxiliary, budget: 0.1}\n"
             "  - {plugin: iqn, role: auxiliary, budget: 0.2, quantiles: 32, target_quantiles: 32, embed: 64}\n";
  return "name: ranks\nseed: 3\nbackend: cuda\nprecision: fp32\n"
         "network: {state: 64, trunk: [256, 256], head_hidden: 128, branches: 3, actions: 5, atoms: 51, "
         "v_min: -10, v_max: 10}\nheads:\n" + heads + "batch: " + std::to_string(batch) +
         "\nreport_every: 1\nmax_grad_norm: 0.5\nspectral_norm: {enabled: true, sigma_max: 2.0}\n"
         "cuda: {autotune: false}\n";
}

bool bit_equal(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

}  // namespace

#if DQN_HAVE_NCCL
TEST_CASE("gpu.ranks.one_nccl_rank_in_the_graph_steps_as_no_group") {
  for (bool all : {false, true}) {
    CAPTURE(all);
    const PipelineSpec spec = engine_gpu::parse(pipeline(256, all));
    const HostBatch batch = HostBatch::random(spec, 5);
    Engine alone(spec, loader());
    init_weights(alone, spec.seed);
    set_batch(alone, batch);
    EngineOptions eo;
    eo.group = make_nccl_group({0});
    MESSAGE("collectives: " << eo.group->describe());
    Engine ranked(spec, loader(), eo);
    init_weights(ranked, spec.seed);
    set_batch(ranked, batch);
    CHECK(ranked.runtime().graph_nodes() > alone.runtime().graph_nodes());  // the buckets' NCCL nodes
    REQUIRE(ranked.parallel().buckets().size() == 3);
    for (int s = 0; s < 10; ++s) {
      alone.step();
      ranked.step();
    }
    // the mean over one rank is the rank's own gradient, to the bit
    for (const char* b : {"params", "target", "adam.m", "adam.v", "report/losses", "report/norms"}) {
      CAPTURE(b);
      CHECK(bit_equal(host_buffer(ranked, b), host_buffer(alone, b)));
    }
  }
}

#if DQN_HAVE_CUPTI
TEST_CASE("gpu.ranks.replays_with_nccl_in_the_graph_make_no_synchronising_call") {
  const PipelineSpec spec = engine_gpu::parse(pipeline(256, true));
  EngineOptions eo;
  eo.group = make_nccl_group({0});
  Engine e(spec, loader(), eo);
  init_weights(e, spec.seed);
  set_batch(e, HostBatch::random(spec, 5));
  for (int s = 0; s < 20; ++s) e.step();  // warm: NCCL's connections made, the report ring used
  e.runtime().synchronize();
  gpu_test::CallCount count;
  count.set_on(true);
  for (int s = 0; s < 400; ++s) e.step();
  count.set_on(false);
  const std::map<std::string, long> calls = count.stop();
  e.runtime().synchronize();
  long launches = 0;
  for (const auto& [name, n] : calls) {
    MESSAGE(name << " × " << n);
    if (name.find("GraphLaunch") != std::string::npos && name.rfind("runtime:", 0) == 0) launches += n;
    const bool sync = name.find("Synchronize") != std::string::npos || name.find("EventSynchronize") != std::string::npos;
    const bool alloc = name.find("Malloc") != std::string::npos || name.find("MemAlloc") != std::string::npos ||
                       name.find("Free") != std::string::npos;
    CHECK_MESSAGE(!sync, "a synchronising call between steps: " << name << " × " << n);
    CHECK_MESSAGE(!alloc, "an allocation between steps: " << name << " × " << n);
  }
  CHECK(launches == 400);
}
#endif

TEST_CASE("gpu.ranks.two_gpus") {
  const int gpus = cuda_device_count();
  if (gpus < 2) {
    MESSAGE("skipped: two ranks need two GPUs; this machine has " << gpus);
    return;
  }
  SUBCASE("two ranks on halves step as one rank on the whole batch") {
    const int B = 256;
    const PipelineSpec whole = engine_gpu::parse(pipeline(2 * B, true));
    const PipelineSpec half = engine_gpu::parse(pipeline(B, true));
    const HostBatch batch = HostBatch::random(whole, 7);
    Engine one(whole, loader());
    init_weights(one, whole.seed);
    set_batch(one, batch);
    for (int s = 0; s < 3; ++s) one.step();
    auto group = make_nccl_group({0, 1});
    std::vector<std::map<std::string, std::vector<double>>> got(2);
    run_ranks(*group, [&](int rank) {
      Engine e(half, loader(), EngineOptions::of_rank(group, rank));
      init_weights(e, half.seed);
      set_batch(e, batch.rows(rank * B, B));
      for (int s = 0; s < 3; ++s) e.step();
      for (const char* b : {"params", "target", "adam.m", "adam.v", "report/losses", "report/norms", "report/clips"})
        got[std::size_t(rank)][b] = host_buffer(e, b);
    });
    // fp32 sums in another order: the tolerances of gpu.step's CUDA-against-CUDA comparisons
    for (const char* b : {"report/losses", "report/norms", "report/clips"}) {
      CAPTURE(b);
      CHECK(rel(got[0][b], host_buffer(one, b)) < 1e-5);
    }
    for (const char* b : {"params", "target"}) {
      CAPTURE(b);
      CHECK(rel(got[0][b], host_buffer(one, b)) < 1e-5);
    }
    CHECK(rel(got[0]["adam.v"], host_buffer(one, "adam.v")) < 1e-4);
    for (const auto& [name, v] : got[0]) CHECK(bit_equal(v, got[1][name]));
  }
  SUBCASE("parameters stay bit-identical over 1,000 steps") {
    const PipelineSpec spec = engine_gpu::parse(pipeline(256, true));
    auto group = make_nccl_group({0, 1});
    std::vector<std::vector<double>> params(2), adam(2);
    run_ranks(*group, [&](int rank) {
      Engine e(spec, loader(), EngineOptions::of_rank(group, rank));
      init_weights(e, spec.seed);
      set_batch(e, HostBatch::random(spec, 100 + std::uint64_t(rank)));
      for (int s = 0; s < 1000; ++s) e.step();
      params[std::size_t(rank)] = host_buffer(e, "params");
      adam[std::size_t(rank)] = host_buffer(e, "adam.v");
    });
    CHECK(bit_equal(params[0], params[1]));
    CHECK(bit_equal(adam[0], adam[1]));
  }
}
#else
TEST_CASE("gpu.ranks.nccl" * doctest::skip()) {
  MESSAGE("skipped: this build has no NCCL (-Dnccl=enabled, -Dnccl_root=DIR)");
}
#endif
