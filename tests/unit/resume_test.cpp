// Checkpoints and resuming through the API: a run stopped in the middle of an evaluation resumes
// with that evaluation and ends as the uninterrupted run does, and so does a run over two ranks
// (devices), whose checkpoint holds both ranks' states; a checkpoint of another pipeline is
// refused naming the tensor; checkpoint files are sealed, pruned to the newest K, and a torn,
// damaged or half-written one is passed over with the reason.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dqn_config.h"
#include "core/engine_access.hpp"
#include "core/plugin_loader.hpp"
#include "core/rank_group.hpp"
#include "core/safetensors.hpp"
#include "pipeline/parse.hpp"
#include "training/checkpoint.hpp"
#include "training/env/vec_env.hpp"
#include "training/trainer.hpp"
#include "../test_util.hpp"

using namespace dqn;
using test::loader;
using test::source_dir;
namespace fs = std::filesystem;

namespace {

struct TempDir : test::TempDir {
  explicit TempDir(const std::string& tag) : test::TempDir("dqn-resume-test", tag) {}
};

// CartPole whose evaluation copies (the instance made with kEvalCopies copies) ask the trainer to
// stop after a set number of their steps, once armed: a stop that lands inside an evaluation.
constexpr int kEvalCopies = 3;
Trainer* g_stop_target = nullptr;
std::int64_t g_stop_from = -1;  ///< the evaluation at this env step stops after its 5th step

class StopInEval final : public Env {
 public:
  explicit StopInEval(const EnvCreateInfo& info) : eval_(info.num_envs == kEvalCopies) {
    const ParamValue limit{"max_episode_steps", ParamType::integer, 500, 500.0, "500"};
    const EnvCreateInfo cart{"CartPole-v1", info.num_envs, info.seed, &limit, 1};
    char err[256] = {0};
    inner_ = task().create(&cart, err, sizeof err);
    if (!inner_) throw std::runtime_error(err);
  }
  ~StopInEval() override { task().destroy(inner_); }
  const EnvSpec& spec() const noexcept override { return inner_->spec(); }
  std::int32_t num_envs() const noexcept override { return inner_->num_envs(); }
  int reset(std::uint64_t seed, std::int32_t b, std::int32_t e, float* obs, char* err, std::uint32_t n) noexcept override {
    return inner_->reset(seed, b, e, obs, err, n);
  }
  int step(std::int32_t b, std::int32_t e, const EnvStep& io, char* err, std::uint32_t n) noexcept override {
    const int rc = inner_->step(b, e, io, err, n);
    if (eval_ && g_stop_target && g_stop_from >= 0 && g_stop_target->env_steps() >= g_stop_from && ++calls_ == 5)
      g_stop_target->request_stop();
    return rc;
  }
  int save_state(StateWriter& w) const noexcept override { return inner_->save_state(w); }
  int load_state(const StateReader& r) noexcept override { return inner_->load_state(r); }

 private:
  /// CartPole-v1 from its plugin.
  static const EnvDescriptor& task() { return loader().find("cartpole")->envs[0]; }
  Env* inner_ = nullptr;
  bool eval_;
  int calls_ = 0;
};

PipelineSpec small(std::vector<std::string> extra = {}) {
  static const bool registered = [] {
    register_env("StopInEval-v0", [](const EnvCreateInfo& info) { return std::make_unique<StopInEval>(info); });
    return true;
  }();
  (void)registered;
  ParseOptions o;
  o.plugins = &loader();
  o.environments = environment_shapes();
  o.program_envs = program_env_names();
  o.overrides = {"backend=cpu", "training.env=StopInEval-v0", "training.env_threads=1", "training.num_envs=4", "training.total_steps=800",
                 "training.learning_starts=200", "training.eval.every=200",
                 "training.eval.episodes=" + std::to_string(kEvalCopies), "training.stop_at_return=0",
                 "training.epsilon.decay_steps=400", "training.checkpoint_every=100", "training.checkpoint_keep=2"};
  for (auto& e : extra) o.overrides.push_back(e);
  return load_pipeline(source_dir() + "/pipelines/default.yaml", o);
}

TrainerOptions quiet(const fs::path& dir) {
  TrainerOptions o;
  o.run_dir = dir.string();
  o.progress = TrainerOptions::Progress::none;
  o.progress_out = nullptr;
  o.log_every = 100;
  return o;
}

std::vector<nlohmann::json> rows(const fs::path& file) {
  std::ifstream in(file);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    for (const char* k : {"wall_s", "steps_per_s", "train_steps_per_s"}) j.erase(k);  // times, not results
    out.push_back(j);
  }
  return out;
}

std::vector<std::uint8_t> bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

/// A run over two CPU ranks into `dir` (resumed from `resume` when set; rank 1 asks to stop once
/// past `stop_at` environment steps when positive): rank 0's result and each rank's parameters.
struct TwoRanks {
  TrainResult res;
  std::vector<std::vector<double>> params{2};
};
TwoRanks run_two_ranks(const PipelineSpec& spec, const fs::path& dir, const st::File* resume, std::int64_t stop_at) {
  TwoRanks out;
  auto group = make_host_group({0, 1});
  run_ranks(*group, [&](int rank) {
    EngineOptions eo = training_engine_options(spec);
    eo.group = group;
    eo.rank = rank;
    Engine e(spec, loader(), eo);
    if (!resume) init_weights(e, spec.seed);
    TrainerOptions o = quiet(dir);
    o.ranks = group.get();
    o.rank = rank;
    o.resume = resume;
    if (rank == 1 && stop_at > 0)
      o.after_metrics_line = [stop_at](Trainer& t) {
        if (t.env_steps() >= stop_at) t.request_stop();
      };
    Trainer t(e, o);
    const TrainResult r = t.run();
    if (rank == 0) out.res = r;
    out.params[std::size_t(rank)] = host_buffer(e, "params");
  });
  return out;
}

}  // namespace

TEST_CASE("resume.stopped_inside_an_evaluation_ends_as_the_uninterrupted_run") {
  TempDir tmp("eval");
  const PipelineSpec spec = small();
  Engine a(spec, loader(), training_engine_options(spec));
  init_weights(a, spec.seed);
  Trainer full(a, quiet(tmp.path / "full"));
  const TrainResult rf = full.run();
  REQUIRE_FALSE(rf.interrupted);

  Engine b(spec, loader(), training_engine_options(spec));
  init_weights(b, spec.seed);
  TrainResult rs;
  {
    Trainer part(b, quiet(tmp.path / "part"));
    g_stop_target = &part;
    g_stop_from = 400;  // CartPole's episodes last at least 8 steps: the stop lands inside it
    rs = part.run();
    g_stop_target = nullptr;
    g_stop_from = -1;
  }
  REQUIRE(rs.interrupted);
  REQUIRE_FALSE(rs.checkpoint.empty());
  const checkpoint::Search found = checkpoint::newest((tmp.path / "part").string(), to_yaml(spec));
  REQUIRE(found.found);
  CHECK(found.found->path == rs.checkpoint);
  const nlohmann::json state = nlohmann::json::parse(found.found->file.metadata.at("trainer"));
  CHECK_FALSE(state["loop"]["iteration_done"].get<bool>());  // the evaluation is still to do

  Engine c(spec, loader(), training_engine_options(spec));
  TrainerOptions o = quiet(tmp.path / "part");
  o.resume = &found.found->file;
  Trainer resumed(c, o);
  const TrainResult rr = resumed.run();
  CHECK_FALSE(rr.interrupted);
  CHECK(rr.env_steps == rf.env_steps);
  CHECK(rr.best_eval == rf.best_eval);
  CHECK(online_params(c) == online_params(a));
  CHECK(rows(tmp.path / "part" / "metrics.jsonl") == rows(tmp.path / "full" / "metrics.jsonl"));
  CHECK(bytes_of(tmp.path / "part" / "weights.safetensors") == bytes_of(tmp.path / "full" / "weights.safetensors"));
  // The interrupted run's final line went aside; only the newest two checkpoints are kept.
  CHECK(fs::exists(tmp.path / "part" / ("metrics.after-step-" + std::to_string(found.found->clock) + ".jsonl")));
  int kept = 0;
  for (const auto& e : fs::directory_iterator(tmp.path / "part" / checkpoint::kFolder)) kept += e.is_regular_file();
  CHECK(kept == 2);

  // A finished run is not resumed.
  const checkpoint::Search again = checkpoint::newest((tmp.path / "part").string(), to_yaml(spec));
  REQUIRE(again.found);
  Engine d(spec, loader(), training_engine_options(spec));
  TrainerOptions o2 = quiet(tmp.path / "part");
  o2.resume = &again.found->file;
  Trainer done(d, o2);
  CHECK_THROWS_WITH(done.run(), doctest::Contains("there is nothing to resume"));
}

TEST_CASE("resume.two_ranks_stopped_and_resumed_end_as_the_uninterrupted_run") {
  TempDir tmp("ranks");
  const PipelineSpec spec = small({"devices=[0,1]", "training.env=CartPole-v1"});
  const TwoRanks full = run_two_ranks(spec, tmp.path / "full", nullptr, 0);
  REQUIRE_FALSE(full.res.interrupted);
  const TwoRanks part = run_two_ranks(spec, tmp.path / "part", nullptr, 400);
  REQUIRE(part.res.interrupted);
  REQUIRE_FALSE(part.res.checkpoint.empty());
  const checkpoint::Search found = checkpoint::newest((tmp.path / "part").string(), to_yaml(spec));
  REQUIRE(found.found);
  CHECK(found.found->path == part.res.checkpoint);
  // one file, every rank's state: rank 1's replay and environments beside rank 0's
  const st::File& ck = found.found->file;
  CHECK(ck.metadata.at("ranks") == "2");
  CHECK(ck.metadata.count("rank.1/trainer") == 1);
  CHECK(ck.has("trainer/obs"));
  CHECK(ck.has("rank.1/trainer/obs"));
  CHECK(ck.get("trainer/obs").bytes != ck.get("rank.1/trainer/obs").bytes);

  // on one device: refused before anything in the run directory changes
  {
    const auto before = bytes_of(tmp.path / "part" / "metrics.jsonl");
    Engine one(spec, loader(), training_engine_options(spec));
    TrainerOptions o = quiet(tmp.path / "part");
    o.resume = &ck;
    Trainer t(one, o);
    CHECK_THROWS_WITH(t.run(), doctest::Contains("holds the state of 2 ranks (devices) but this run has 1"));
    CHECK(bytes_of(tmp.path / "part" / "metrics.jsonl") == before);
  }

  // a checkpoint whose rank parts do not match is refused, the directory untouched
  {
    const auto before = bytes_of(tmp.path / "part" / "metrics.jsonl");
    st::File three = ck;
    three.metadata["ranks"] = "3";
    CHECK_THROWS_WITH(run_two_ranks(spec, tmp.path / "part", &three, 0),
                      doctest::Contains("holds the state of 3 ranks (devices) but this run has 2"));
    st::File missing = ck;
    for (auto it = missing.tensors.begin(); it != missing.tensors.end();)
      it = it->first.rfind("rank.1/", 0) == 0 ? missing.tensors.erase(it) : std::next(it);
    CHECK_THROWS_WITH(run_two_ranks(spec, tmp.path / "part", &missing, 0), doctest::Contains("no state of rank 1"));
    CHECK(bytes_of(tmp.path / "part" / "metrics.jsonl") == before);
  }

  const TwoRanks resumed = run_two_ranks(spec, tmp.path / "part", &ck, 0);
  CHECK_FALSE(resumed.res.interrupted);
  CHECK(resumed.res.env_steps == full.res.env_steps);
  CHECK(resumed.res.env_steps_all_ranks == full.res.env_steps_all_ranks);
  CHECK(resumed.params[0] == full.params[0]);
  CHECK(resumed.params[1] == full.params[0]);
  CHECK(rows(tmp.path / "part" / "metrics.jsonl") == rows(tmp.path / "full" / "metrics.jsonl"));
  CHECK(bytes_of(tmp.path / "part" / "weights.safetensors") == bytes_of(tmp.path / "full" / "weights.safetensors"));
}

TEST_CASE("resume.checkpoint_files") {
  TempDir tmp("files");
  const PipelineSpec spec = small({"training.total_steps=400", "training.checkpoint_keep=3"});
  Engine e(spec, loader(), training_engine_options(spec));
  init_weights(e, spec.seed);
  Trainer t(e, quiet(tmp.path / "run"));
  t.run();
  const fs::path dir = tmp.path / "run" / checkpoint::kFolder;
  const std::string text = to_yaml(spec);
  // 100, 200, 300 written (400 is the end: the run's own files hold it); all three kept.
  for (int c : {100, 200, 300}) CHECK(fs::exists(checkpoint::path_for((tmp.path / "run").string(), c)));

  SUBCASE("the newest whole one is found") {
    const checkpoint::Search s = checkpoint::newest((tmp.path / "run").string(), text);
    REQUIRE(s.found);
    CHECK(s.found->clock == 300);
    CHECK(s.skipped.empty());
  }
  SUBCASE("torn, damaged and half-written files are passed over with the reason") {
    const std::string p300 = checkpoint::path_for((tmp.path / "run").string(), 300);
    const std::string p200 = checkpoint::path_for((tmp.path / "run").string(), 200);
    fs::resize_file(p300, fs::file_size(p300) / 2);  // torn
    {
      std::fstream f(p200, std::ios::in | std::ios::out | std::ios::binary);  // one bit flipped in the data
      f.seekp(std::streamoff(fs::file_size(p200) - 100));
      char c = 0;
      f.read(&c, 1);
      f.seekp(std::streamoff(fs::file_size(p200) - 100));
      c = char(c ^ 0x10);
      f.write(&c, 1);
    }
    std::ofstream(p300 + ".tmp.4242") << "half";
    const checkpoint::Search s = checkpoint::newest((tmp.path / "run").string(), text);
    REQUIRE(s.found);
    CHECK(s.found->clock == 100);
    REQUIRE(s.skipped.size() == 3);
    CHECK(s.skipped[0].find("an interrupted write") != std::string::npos);
    CHECK_FALSE(fs::exists(p300 + ".tmp.4242"));
    CHECK(s.skipped[1].find("step-000000000300") != std::string::npos);
    CHECK(s.skipped[1].find("truncated") != std::string::npos);
    CHECK(s.skipped[2].find("step-000000000200") != std::string::npos);
    CHECK(s.skipped[2].find("damaged") != std::string::npos);
  }
  SUBCASE("another pipeline.yaml's checkpoints are not taken") {
    const checkpoint::Search s = checkpoint::newest((tmp.path / "run").string(), text + "# edited\n");
    CHECK_FALSE(s.found);
    REQUIRE(s.skipped.size() == 3);
    CHECK(s.skipped[0].find("another pipeline.yaml") != std::string::npos);
  }
  SUBCASE("an engine of another shape refuses the checkpoint, naming the tensor") {
    const checkpoint::Search s = checkpoint::newest((tmp.path / "run").string(), text);
    REQUIRE(s.found);
    const PipelineSpec wider = small({"network.trunk=[32,32]"});
    Engine other(wider, loader(), training_engine_options(wider));
    CHECK_THROWS_WITH(other.restore_checkpoint(s.found->file),
                      doctest::Contains("it was written by another pipeline"));
    CHECK_THROWS_WITH(other.restore_checkpoint(s.found->file), doctest::Contains("tensor 'engine/"));
  }
}
