// The training loop on the GPU: between two reports of a learner-bound run (32 training steps per
// step of 8 CartPole copies, prioritised replay), CUPTI counts every CUDA call: the learner's side
// (graph launches, transitions' copies and inserts, snapshot refreshes, report copies) makes no
// synchronising call at all, and acting waits once per environment step at most.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

#include "core/engine_access.hpp"
#include "core/rank_group.hpp"
#include "dqn_config.h"
#include "cupti_count.hpp"
#include "engine_gpu_util.hpp"
#include "pipeline/parse.hpp"
#include "training/trainer.hpp"

using namespace dqn;

#if DQN_HAVE_CUPTI
namespace {
/// The learner-bound run with `group` in its engine (null: none), counted between two reports.
void check_zero_syncs(const std::shared_ptr<RankGroup>& group) {
  ParseOptions o;
  o.plugins = &engine_gpu::loader();
  o.overrides = {"backend=cuda", "training.total_steps=3600", "training.eval.every=1000000", "training.stop_at_return=0",
                 "training.epsilon.decay_steps=2000"};
  const PipelineSpec spec = load_pipeline(std::string(DQN_SOURCE_DIR) + "/pipelines/learner_bound.yaml", o);
  EngineOptions eo = training_engine_options(spec);
  eo.group = group;
  Engine engine(spec, engine_gpu::loader(), eo);
  init_weights(engine, spec.seed);
  gpu_test::CallCount count;
  std::int64_t from_env = -1, to_env = -1, from_train = -1, to_train = -1;
  TrainerOptions opt;
  opt.run_dir = (std::filesystem::temp_directory_path() / ("dqn-train-gpu-" + std::to_string(getpid()))).string();
  opt.progress = TrainerOptions::Progress::none;
  opt.log_every = 400;  // 50 steps of the 8 copies, 1,600 training steps
  opt.after_metrics_line = [&](Trainer& t) {
    if (t.env_steps() == 2800) {  // learning since 2,000: the queue is full and steady
      from_env = t.env_steps();
      from_train = t.train_steps();
      count.set_on(true);
    } else if (t.env_steps() == 3200) {
      count.set_on(false);
      to_env = t.env_steps();
      to_train = t.train_steps();
    }
  };
  Trainer trainer(engine, opt);
  trainer.run();
  const std::map<std::string, long> calls = count.stop();
  std::filesystem::remove_all(opt.run_dir);
  REQUIRE(from_env >= 0);
  REQUIRE(to_env > from_env);
  const long env_steps = long(to_env - from_env) / spec.training.num_envs;
  const long train_steps = long(to_train - from_train);
  CHECK(train_steps == 32 * env_steps);
  long stream_syncs = 0, launches = 0;
  for (const auto& [name, n] : calls) {
    MESSAGE(name << " × " << n);
    if (name == "runtime:cudaStreamSynchronize") stream_syncs += n;
    if (name.find("GraphLaunch") != std::string::npos && name.rfind("runtime:", 0) == 0) launches += n;
    const bool sync = name.find("Synchronize") != std::string::npos && name != "runtime:cudaStreamSynchronize" &&
                      name != "driver:cuStreamSynchronize";
    const bool blocking_copy = (name == "runtime:cudaMemcpy" || name.find("cuMemcpyHtoD_") != std::string::npos ||
                                name.find("cuMemcpyDtoH_") != std::string::npos);
    const bool alloc = name.find("Malloc") != std::string::npos || name.find("MemAlloc") != std::string::npos ||
                       name.find("Free") != std::string::npos;
    CHECK_MESSAGE(!sync, "a synchronising call in the loop: " << name << " × " << n);
    CHECK_MESSAGE(!blocking_copy, "a blocking copy in the loop: " << name << " × " << n);
    CHECK_MESSAGE(!alloc, "an allocation in the loop: " << name << " × " << n);
  }
  // The actor's one wait per environment step (none where every copy explored), and nothing else.
  CHECK(stream_syncs <= env_steps);
  CHECK(stream_syncs > 0);
  // Every training step a graph launch, and one act step per environment step.
  CHECK(launches >= train_steps);
  CHECK(launches <= train_steps + env_steps);
}
}  // namespace

TEST_CASE("gpu.train.zero_learner_syncs_between_reports") { check_zero_syncs(nullptr); }

#if DQN_HAVE_NCCL
// The same with the gradient all-reduce's NCCL calls in the captured step (a group of one rank).
TEST_CASE("gpu.train.zero_learner_syncs_between_reports_with_nccl_in_the_graph") {
  check_zero_syncs(make_nccl_group({0}));
}
#endif
#else
TEST_CASE("gpu.train.zero_learner_syncs_between_reports" * doctest::skip() *
          doctest::description("built without CUPTI: no call counts")) {}
#endif
