// The training loop: ε and β schedules as the loop uses them, the host actor against the engine's
// own Q and an independent reference, the run directory, metrics.jsonl, stopping, prioritized replay;
// its run log (metrics lines, the progress line, messages).
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "dqn_config.h"
#include "core/engine_access.hpp"
#include "pipeline/parse.hpp"
#include "core/plugin_loader.hpp"
#include "core/safetensors.hpp"
#include "training/schedule.hpp"
#include "training/trainer.hpp"
#include "../test_util.hpp"

using namespace dqn;
using test::loader;
using test::source_dir;
namespace fs = std::filesystem;

namespace {

/// The default pipeline, made small and short for a unit test.
PipelineSpec small_default(std::vector<std::string> extra = {}) {
  ParseOptions o;
  o.plugins = &loader();
  o.overrides = {"backend=cpu", "training.num_envs=4", "training.total_steps=600", "training.learning_starts=200",
                 "training.eval.every=300", "training.eval.episodes=3", "training.stop_at_return=0",
                 "training.epsilon.decay_steps=400"};
  for (auto& e : extra) o.overrides.push_back(e);
  return load_pipeline(source_dir() + "/pipelines/default.yaml", o);
}

/// A fresh directory under the system temp dir, removed when the test ends.
struct TempDir : test::TempDir {
  explicit TempDir(const std::string& tag) : test::TempDir("dqn-trainer-test", tag) {}
};

std::vector<nlohmann::json> read_metrics(const fs::path& file) {
  std::ifstream in(file);
  REQUIRE(in);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) {
    REQUIRE_FALSE(line.empty());
    out.push_back(nlohmann::json::parse(line));  // throws (fails the test) on a bad line
  }
  return out;
}

TrainerOptions quiet_options(const fs::path& dir) {
  TrainerOptions o;
  o.run_dir = dir.string();
  o.progress = TrainerOptions::Progress::none;
  o.log_every = 100;
  return o;
}

/// The online parameters stored in a weights file, flat in the engine's layout.
std::vector<float> online_from_file(const st::File& f, const Registry& reg) {
  std::vector<float> flat(std::size_t(reg.param_count()));
  for (const auto& p : reg.params()) {
    const std::vector<float> v = f.get_f32(p.name, p.shape());
    std::copy(v.begin(), v.end(), flat.begin() + p.offset);
  }
  return flat;
}

}  // namespace

TEST_CASE("trainer.schedules") {
  EpsilonSpec e;
  e.start = 1.0;
  e.end = 0.1;
  e.decay_steps = 1000;
  CHECK(epsilon_at(e, 0) == 1.0);
  CHECK(epsilon_at(e, 500) == doctest::Approx(0.55));
  CHECK(epsilon_at(e, 250) == doctest::Approx(0.775));
  CHECK(epsilon_at(e, 1000) == 0.1);
  CHECK(epsilon_at(e, 5000) == 0.1);
  TrainingSpec t;
  t.total_steps = 200;
  t.replay.beta_start = 0.4;
  t.replay.beta_end = 1.0;
  CHECK(beta_at(t, 0) == 0.4);
  CHECK(beta_at(t, 100) == doctest::Approx(0.7));
  CHECK(beta_at(t, 200) == 1.0);
}

TEST_CASE("trainer.epsilon_governs_exploration") {
  // No training (train_every beyond the run), so the network stays at its initial weights and
  // every stored action can be checked against the greedy one for its state.
  auto greedy_share = [](double eps_start, double eps_end, std::int64_t decay, std::int64_t from, std::int64_t to) {
    TempDir tmp("eps");
    const PipelineSpec spec = small_default(
        {"training.epsilon.start=" + std::to_string(eps_start), "training.epsilon.end=" + std::to_string(eps_end),
         "training.epsilon.decay_steps=" + std::to_string(decay), "training.train_every=1000000"});
    Engine engine(spec, loader(), training_engine_options(spec));
    init_weights(engine, 3);
    Trainer trainer(engine, quiet_options(tmp.path / "run"));
    const TrainResult r = trainer.run();
    CHECK(r.train_steps == 0);
    // The engine's replay as stored (its slots fill in time order).
    const std::int64_t size = engine.replay().state().size;
    const std::vector<double> states = host_buffer(engine, "replay/states"), actions = host_buffer(engine, "replay/actions");
    const std::size_t S = std::size_t(spec.network.state);
    int same = 0, n = 0;
    for (std::int64_t i = from; i < std::min(to, size); ++i, ++n) {
      std::vector<float> s(S);
      for (std::size_t k = 0; k < S; ++k) s[k] = float(states[std::size_t(i) * S + k]);
      std::int32_t a = -1;
      engine.actor().act(s.data(), 1, &a);
      same += a == std::int32_t(actions[std::size_t(i)]) ? 1 : 0;
    }
    REQUIRE(n > 100);
    return double(same) / n;
  };
  // Slots fill in time order; 4 copies and 3-step windows put env step t near slot t - 8.
  // learning_starts = 200: random actions before it whatever ε says, greedy after it when ε = 0.
  CHECK(greedy_share(0, 0, 1, 220, 600) == 1.0);
  const double before = greedy_share(0, 0, 1, 0, 180);
  CHECK(before > 0.3);
  CHECK(before < 0.7);
  // ε = 1: uniform over two actions, about half agree with the greedy one.
  const double uniform = greedy_share(1, 1, 1, 220, 600);
  CHECK(uniform > 0.35);
  CHECK(uniform < 0.65);
  // ε from 1 at step 200 down to 0 at 600 (decay over 600 from step 0): ε ≈ 0.58 over 200..400 and
  // ≈ 0.08 over 550..600, so the greedy share rises from ~0.7 to ~0.96.
  const double early = greedy_share(1, 0, 600, 200, 390);
  const double late = greedy_share(1, 0, 600, 450, 600);
  CHECK(early < 0.85);
  CHECK(late > 0.85);
}

TEST_CASE("trainer.act_step_matches_engine_q") {
  // A tiny network with two branches of three actions, so ties and branch order both matter.
  ParseOptions o;
  o.plugins = &loader();
  const std::string text =
      "backend: cpu\nprecision: fp32\nbatch: 6\n"
      "network: {state: 4, trunk: [8, 6], head_hidden: 5, branches: 2, actions: 3, atoms: 7, v_min: -1, v_max: 2}\n"
      "heads: [{plugin: c51, role: primary}]\n";
  const PipelineSpec spec = parse_pipeline(text, "tiny.yaml", o);
  Engine engine(spec, loader());  // no replay: the batch is set by hand
  init_weights(engine, 11);
  const int B = spec.batch, S = 4, D = 2, A = 3, Z = 7;

  HostBatch batch = HostBatch::random(spec, 5);
  set_batch(engine, batch);
  engine.forward_backward();
  const std::vector<double> engine_q = host_buffer(engine, "c51/q");  // [2B, D, A]: states first
  REQUIRE(engine_q.size() == std::size_t(2 * B * D * A));

  REQUIRE(engine.actor().rows() >= B);
  const std::vector<float> qv = engine.actor().act_values(batch.states.data(), B);  // the act step's: the primary's act stage
  REQUIRE(qv.size() == std::size_t(B * D * A));
  const float* q = qv.data();

  // An independent reference, straight from docs/step-math.md's formulas in double precision.
  const std::vector<float> P = online_params(engine);
  const Registry& reg = engine.registry();
  auto W = [&](const std::string& n) { return P.data() + reg.find_param(n)->offset; };
  auto dense = [&](const std::vector<double>& x, const std::string& layer, int out, bool relu) {
    const float* w = W(layer + ".weight");
    const float* b = W(layer + ".bias");
    std::vector<double> y(static_cast<std::size_t>(out));
    for (int i = 0; i < out; ++i) {
      double acc = b[i];
      for (std::size_t j = 0; j < x.size(); ++j) acc += double(w[std::size_t(i) * x.size() + j]) * x[j];
      y[std::size_t(i)] = relu ? std::max(0.0, acc) : acc;
    }
    return y;
  };
  const double dz = 3.0 / (Z - 1);
  for (int r = 0; r < B; ++r) {
    std::vector<double> s(batch.states.begin() + r * S, batch.states.begin() + (r + 1) * S);
    const auto h2 = dense(dense(s, "trunk.0", 8, true), "trunk.1", 6, true);
    const auto v = dense(dense(h2, "c51.value.0", 5, true), "c51.value.1", Z, false);
    for (int d = 0; d < D; ++d) {
      const std::string br = "c51.branch." + std::to_string(d);
      const auto adv = dense(dense(h2, br + ".0", 5, true), br + ".1", A * Z, false);
      std::vector<double> ref_q(static_cast<std::size_t>(A));
      for (int a = 0; a < A; ++a) {
        std::vector<double> logit(static_cast<std::size_t>(Z));
        for (int i = 0; i < Z; ++i) {
          double mean = 0;
          for (int k = 0; k < A; ++k) mean += adv[std::size_t(k * Z + i)];
          logit[std::size_t(i)] = v[std::size_t(i)] + adv[std::size_t(a * Z + i)] - mean / A;
        }
        const double mx = *std::max_element(logit.begin(), logit.end());
        double sum = 0, ez = 0;
        for (int i = 0; i < Z; ++i) sum += std::exp(logit[std::size_t(i)] - mx);
        for (int i = 0; i < Z; ++i) ez += (-1.0 + i * dz) * std::exp(logit[std::size_t(i)] - mx) / sum;
        ref_q[std::size_t(a)] = ez;
      }
      for (int a = 0; a < A; ++a) {
        const std::size_t k = std::size_t((r * D + d) * A + a);
        CAPTURE(r);
        CAPTURE(d);
        CAPTURE(a);
        CHECK(q[k] == doctest::Approx(engine_q[k]).epsilon(1e-6));
        CHECK(q[k] == doctest::Approx(ref_q[std::size_t(a)]).epsilon(1e-5));
      }
    }
  }

  // Greedy actions: the branch-wise argmax of the engine's Q, ties to the lowest index.
  std::vector<std::int32_t> act(std::size_t(B * D), -1);
  engine.actor().act(batch.states.data(), B, act.data());
  for (int r = 0; r < B; ++r)
    for (int d = 0; d < D; ++d) {
      const double* row = engine_q.data() + (r * D + d) * A;
      const int best = int(std::max_element(row, row + A) - row);  // first maximum
      CHECK(act[std::size_t(r * D + d)] == best);
    }

  CHECK_THROWS_AS(engine.actor().act_values(batch.states.data(), engine.actor().rows() + 1), std::invalid_argument);
  CHECK_THROWS_AS(engine.actor().act(batch.states.data(), 0, act.data()), std::invalid_argument);
}

TEST_CASE("trainer.short_run_writes_the_run_dir") {
  TempDir tmp("short");
  const PipelineSpec spec = small_default();
  Engine engine(spec, loader(), training_engine_options(spec));
  init_weights(engine, spec.seed);
  const fs::path dir = tmp.path / "run";
  TrainerOptions opt = quiet_options(dir);
  opt.pipeline_yaml = to_yaml(spec, loader());
  Trainer trainer(engine, opt);
  const TrainResult r = trainer.run();

  CHECK(r.run_dir == dir.string());
  CHECK(r.env_steps == 600);
  CHECK_FALSE(r.interrupted);
  CHECK_FALSE(r.solved);
  // 600 env steps, training from step 200 every 2 env steps: steps 200, 202, ..., 600.
  CHECK(r.train_steps == 201);
  CHECK(r.episodes > 0);
  for (const char* f : {"pipeline.yaml", "metrics.jsonl", "weights.safetensors", "best.safetensors"})
    CHECK_MESSAGE(fs::is_regular_file(dir / f), f);

  // pipeline.yaml is the resolved pipeline: it loads back to the same run.
  ParseOptions po;
  po.plugins = &loader();
  const PipelineSpec again = load_pipeline((dir / "pipeline.yaml").string(), po);
  CHECK(again.training.total_steps == 600);
  CHECK(again.network.head_hidden == spec.network.head_hidden);
  CHECK(to_yaml(again, loader()) == opt.pipeline_yaml);

  // metrics.jsonl: every line an object with the keys, steps in order, ε as the schedule says.
  const auto lines = read_metrics(dir / "metrics.jsonl");
  REQUIRE(lines.size() >= 6);
  std::int64_t prev = 0;
  int evals = 0;
  for (const auto& m : lines) {
    CAPTURE(m.dump());
    for (const char* k : {"step", "episodes", "episode_return", "epsilon", "loss.c51", "grad_norm.c51", "clip.c51",
                          "total_loss", "steps_per_s", "wall_s", "skipped_steps", "train_steps"})
      CHECK_MESSAGE(m.contains(k), k);
    const std::int64_t step = m["step"];
    CHECK(step >= prev);
    prev = step;
    CHECK(double(m["epsilon"]) == doctest::Approx(epsilon_at(spec.training.epsilon, step)));
    if (m.contains("eval_return")) {
      ++evals;
      CHECK(double(m["eval_return"]) >= 8.0);  // CartPole episodes last at least 8 steps
      CHECK(double(m["eval_return"]) <= 500.0);
      CHECK(m["eval_episodes"] == 3);
    }
    // Deferred reports: a line carries the newest report copied (every report_every training
    // steps) that has landed; the final line the last step's own.
    if (int(m["train_steps"]) >= spec.report_every || (m.value("final", false) && int(m["train_steps"]) > 0))
      CHECK(m["loss.c51"].is_number());
    else if (int(m["train_steps"]) == 0)
      CHECK(m["loss.c51"].is_null());
  }
  CHECK(evals == 2);  // at 300 and the final one at 600
  CHECK(lines.back().value("final", false));
  CHECK(lines.back().contains("eval_return"));
  CHECK(lines.front()["step"] == 100);
  CHECK(lines.front()["loss.c51"].is_null());  // before learning_starts
  CHECK(double(lines.back()["epsilon"]) == doctest::Approx(spec.training.epsilon.end));
  CHECK(trainer.epsilon() == doctest::Approx(spec.training.epsilon.end));

  // The final weights are the engine's state and load back.
  const st::File w = st::read_file((dir / "weights.safetensors").string());
  CHECK(online_from_file(w, engine.registry()) == online_params(engine));
  CHECK(w.get_scalar_i64("adam.step") == r.train_steps);
  Engine other(spec, loader());
  load_weights(other, w);
  CHECK(online_params(other) == online_params(engine));
}

TEST_CASE("trainer.a_file_that_cannot_be_written_does_not_stop_the_run") {
  TempDir tmp("unwritable");
  const PipelineSpec spec = small_default();
  Engine engine(spec, loader(), training_engine_options(spec));
  init_weights(engine, spec.seed);
  TrainerOptions opt = quiet_options(tmp.path / "run");
  opt.progress_out = nullptr;
  // Before the first evaluation, best.safetensors becomes a folder: no file can be renamed over it.
  opt.after_metrics_line = [&](Trainer& t) { fs::create_directories(fs::path(t.run_dir()) / "best.safetensors"); };
  Trainer trainer(engine, opt);
  const TrainResult r = trainer.run();
  CHECK_FALSE(r.interrupted);
  CHECK(r.env_steps == spec.training.total_steps);
  REQUIRE_FALSE(r.write_errors.empty());
  CHECK(r.write_errors[0].find("best.safetensors") != std::string::npos);
  // The run went on to its end: the final weights and the final metrics line are there.
  const st::File w = st::read_file((tmp.path / "run" / "weights.safetensors").string());
  CHECK(online_from_file(w, engine.registry()) == online_params(engine));
  CHECK(read_metrics(tmp.path / "run" / "metrics.jsonl").back().value("final", false));
}

TEST_CASE("trainer.stop_request_keeps_valid_weights") {
  TempDir tmp("stop");
  const PipelineSpec spec = small_default();

  SUBCASE("stopped from inside the loop finishes that iteration") {
    Engine engine(spec, loader(), training_engine_options(spec));
    init_weights(engine, spec.seed);
    TrainerOptions opt = quiet_options(tmp.path / "mid");
    std::int64_t stop_at = -1;
    opt.after_metrics_line = [&](Trainer& t) {
      if (t.env_steps() >= 300 && stop_at < 0) {  // past learning_starts: weights have moved
        stop_at = t.env_steps();
        t.request_stop();  // what the SIGINT handler calls
      }
    };
    Trainer trainer(engine, opt);
    const TrainResult r = trainer.run();
    CHECK(r.interrupted);
    CHECK(r.env_steps == stop_at);
    CHECK(r.train_steps > 0);
    const auto lines = read_metrics(tmp.path / "mid" / "metrics.jsonl");
    REQUIRE_FALSE(lines.empty());
    CHECK(lines.back().value("interrupted", false));
    CHECK(lines.back().value("final", false));
    CHECK(lines.back()["step"] == stop_at);
    const st::File w = st::read_file((tmp.path / "mid" / "weights.safetensors").string());
    Engine other(spec, loader());
    load_weights(other, w);
    CHECK(online_params(other) == online_params(engine));
    CHECK(w.get_scalar_i64("adam.step") == r.train_steps);
  }
  SUBCASE("stopped before it starts still writes the run dir") {
    Engine engine(spec, loader(), training_engine_options(spec));
    init_weights(engine, spec.seed);
    Trainer trainer(engine, quiet_options(tmp.path / "early"));
    trainer.request_stop();
    CHECK(trainer.stop_requested());
    const TrainResult r = trainer.run();
    CHECK(r.interrupted);
    CHECK(r.env_steps == 0);
    CHECK(fs::is_regular_file(tmp.path / "early" / "pipeline.yaml"));
    const auto lines = read_metrics(tmp.path / "early" / "metrics.jsonl");
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].value("interrupted", false));
    Engine other(spec, loader());
    load_weights(other, st::read_file((tmp.path / "early" / "weights.safetensors").string()));
    CHECK(online_params(other) == online_params(engine));
  }
}

TEST_CASE("trainer.prioritized_replay_takes_td_errors") {
  TempDir tmp("per");
  const PipelineSpec spec = small_default({"training.replay.prioritized=true", "training.total_steps=400"});
  Engine engine(spec, loader(), training_engine_options(spec));
  init_weights(engine, spec.seed);
  Trainer trainer(engine, quiet_options(tmp.path / "run"));
  const TrainResult r = trainer.run();
  CHECK(r.train_steps == 101);
  // New transitions enter at the largest priority seen; td errors (C51 cross-entropy, > 1 here)
  // raise it above its initial 1, on the device, inside the step.
  const ReplayState st = engine.replay().state();
  CHECK(st.max_priority > 1.0);
  CHECK(st.draws == 102);  // a batch before the first step, then the next one at the end of each
  CHECK(st.size == trainer.replay_size());
  const auto lines = read_metrics(tmp.path / "run" / "metrics.jsonl");
  for (const auto& m : lines) {
    REQUIRE(m.contains("beta"));
    CHECK(double(m["beta"]) == doctest::Approx(beta_at(spec.training, m["step"])));
  }
}

TEST_CASE("trainer.seeded_runs_repeat") {
  TempDir tmp("repeat");
  const PipelineSpec spec = small_default({"training.total_steps=400"});
  std::vector<float> params[2];
  std::vector<nlohmann::json> evals[2];
  for (int k = 0; k < 2; ++k) {
    Engine engine(spec, loader(), training_engine_options(spec));
    init_weights(engine, spec.seed);
    Trainer trainer(engine, quiet_options(tmp.path / std::to_string(k)));
    trainer.run();
    params[k] = online_params(engine);
    for (auto& m : read_metrics(tmp.path / std::to_string(k) / "metrics.jsonl"))
      if (m.contains("eval_return")) evals[k].push_back(m["eval_return"]);
  }
  CHECK(params[0] == params[1]);
  CHECK(evals[0] == evals[1]);
  CHECK_FALSE(evals[0].empty());
}

TEST_CASE("trainer.network_must_fit_the_environment") {
  ParseOptions o;
  o.plugins = &loader();
  o.overrides = {"backend=cpu"};
  // c51.yaml is the 64-feature, 3x5-action benchmark workload: not CartPole's shapes.
  const PipelineSpec spec = load_pipeline(source_dir() + "/pipelines/c51.yaml", o);
  Engine engine(spec, loader(), training_engine_options(spec));
  init_weights(engine, 1);
  try {
    Trainer t(engine, {});
    FAIL("a 64-feature network was accepted for CartPole");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("observations have 4 features but network.state is 64") != std::string::npos);
  }
}

TEST_CASE("trainer.default_run_dir") {
  TempDir tmp("dirs");
  const std::string a = Trainer::default_run_dir(tmp.path.string(), "cartpole");
  const std::string base = fs::path(a).filename().string();
  CHECK(fs::path(a).parent_path() == tmp.path);
  REQUIRE(base.size() == std::string("cartpole-YYYYmmdd-HHMMSS").size());
  CHECK(base.rfind("cartpole-", 0) == 0);
  CHECK(base[17] == '-');
  for (std::size_t i = 9; i < base.size(); ++i)
    if (i != 17) CHECK(std::isdigit(static_cast<unsigned char>(base[i])));
  fs::create_directories(a);
  CHECK(Trainer::default_run_dir(tmp.path.string(), "cartpole") != a);  // never reuses a directory

  // With neither --out nor training.out_dir, run() writes under runs_root.
  const PipelineSpec spec = small_default({"training.total_steps=8"});
  Engine engine(spec, loader(), training_engine_options(spec));
  init_weights(engine, 1);
  TrainerOptions opt = quiet_options("");
  opt.runs_root = (tmp.path / "runs").string();
  Trainer trainer(engine, opt);
  const TrainResult r = trainer.run();
  CHECK(fs::path(r.run_dir).parent_path() == tmp.path / "runs");
  CHECK(fs::path(r.run_dir).filename().string().rfind("default-", 0) == 0);
  CHECK(fs::is_regular_file(fs::path(r.run_dir) / "weights.safetensors"));
}

TEST_CASE("trainer.acting_snapshot_follows_the_learner_when_refreshed") {
  // The act step reads a snapshot of the parameters: steps leave it behind until a refresh is
  // queued and the actor takes it up; act() (evaluation) always acts on the current parameters.
  const PipelineSpec spec = small_default();
  Engine engine(spec, loader(), training_engine_options(spec));
  init_weights(engine, 5);
  CHECK(host_buffer(engine, "act/params") == host_buffer(engine, "params"));
  const HostBatch b = HostBatch::random(spec, 3);
  const auto S = std::size_t(spec.network.state);
  std::vector<float> st, nx, rw, dn;
  std::vector<std::int32_t> ac;
  for (int k = 0; k < 2 * spec.batch; ++k) {
    const auto i = std::size_t(k % b.B);
    st.insert(st.end(), b.states.begin() + long(i * S), b.states.begin() + long((i + 1) * S));
    nx.insert(nx.end(), b.next_states.begin() + long(i * S), b.next_states.begin() + long((i + 1) * S));
    ac.push_back(b.actions[i]);
    rw.push_back(b.rewards[i]);
    dn.push_back(b.dones[i]);
  }
  for (std::int64_t first = 0; first < 2 * spec.batch; first += engine.replay().staging_rows()) {
    const std::int64_t n = std::min<std::int64_t>(engine.replay().staging_rows(), 2 * spec.batch - first);
    engine.replay().add(Transitions{n, st.data() + first * long(S), nx.data() + first * long(S), ac.data() + first,
                                       rw.data() + first, dn.data() + first},
                           first + n);
  }
  for (int i = 0; i < 5; ++i) engine.step();
  const std::vector<double> after = host_buffer(engine, "params");
  CHECK(host_buffer(engine, "act/params") != after);  // behind the learner
  std::vector<std::int32_t> a(std::size_t(spec.training.num_envs));
  engine.actor().act_snapshot(b.states.data(), spec.training.num_envs, a.data());
  CHECK(engine.actor().snapshot_refreshes() == 0);
  CHECK(host_buffer(engine, "act/params") != after);
  engine.actor().refresh_snapshot();
  engine.step();  // a refresh holds the parameters as the steps queued before it leave them
  engine.actor().act_snapshot(b.states.data(), spec.training.num_envs, a.data());
  CHECK(engine.actor().snapshot_refreshes() == 1);
  CHECK(host_buffer(engine, "act/params") == after);
  // act(): the current parameters, whatever the snapshot held.
  engine.actor().act(b.states.data(), spec.training.num_envs, a.data());
  CHECK(host_buffer(engine, "act/params") == host_buffer(engine, "params"));
}

TEST_CASE("trainer.ranks: two ranks train as one run: one directory, merged metrics, one stop, the same parameters") {
  TempDir tmp("ranks");
  const PipelineSpec spec = small_default({"devices=[0,1]", "training.total_steps=2000"});
  auto group = make_host_group({0, 1});
  std::vector<TrainResult> res(2);
  std::vector<std::vector<double>> params(2);
  run_ranks(*group, [&](int rank) {
    EngineOptions eo = training_engine_options(spec);
    eo.group = group;
    eo.rank = rank;
    Engine e(spec, loader(), eo);
    init_weights(e, spec.seed);
    TrainerOptions o = quiet_options(tmp.path / "run");
    o.ranks = group.get();
    o.rank = rank;
    // Only rank 1 is asked to stop: every rank stops at the same iteration all the same.
    if (rank == 1)
      o.after_metrics_line = [](Trainer& t) {
        if (t.env_steps() >= 1200) t.request_stop();
      };
    Trainer t(e, o);
    res[std::size_t(rank)] = t.run();
    params[std::size_t(rank)] = host_buffer(e, "params");
  });
  CHECK(res[0].interrupted);
  CHECK(res[1].interrupted);
  CHECK(res[0].env_steps == res[1].env_steps);
  CHECK(res[0].env_steps < 2000);
  CHECK(res[0].train_steps == res[1].train_steps);
  CHECK(res[0].train_steps > 0);
  CHECK(res[0].env_steps_all_ranks == 2 * res[0].env_steps);
  CHECK(res[0].ranks == 2);
  CHECK(params[0] == params[1]);  // bit-identical after the run
  // rank 0 wrote the one run directory; its lines count both ranks' environment steps
  const auto lines = read_metrics(tmp.path / "run" / "metrics.jsonl");
  REQUIRE(lines.size() >= 3);
  for (const auto& j : lines) {
    CHECK(j["ranks"] == 2);
    CHECK(j["env_steps_all_ranks"].get<std::int64_t>() == 2 * j["step"].get<std::int64_t>());
  }
  CHECK(lines.back()["final"] == true);
  CHECK(lines.back()["interrupted"] == true);
  CHECK(lines.back()["episodes"].get<std::int64_t>() == res[0].episodes);
  CHECK(fs::exists(tmp.path / "run" / "weights.safetensors"));
  // the ranks explored on environments of their own: their episodes differ from one rank's run
  TempDir one_dir("ranks-one");
  const PipelineSpec one = small_default({"training.total_steps=2000"});
  Engine e(one, loader(), training_engine_options(one));
  init_weights(e, one.seed);
  Trainer t(e, quiet_options(one_dir.path / "run"));
  const TrainResult alone = t.run();
  CHECK(res[0].episodes != 2 * alone.episodes);
}

TEST_CASE("trainer.ranks_offline: every rank holds the whole dataset and draws batches of its own") {
  TempDir tmp("ranks-offline");
  ParseOptions po;
  po.plugins = &loader();
  po.overrides = {"backend=cpu", "devices=[0,1]", "training.dataset=unit.safetensors", "training.total_steps=40",
                  "training.eval.every=20", "training.eval.episodes=2", "batch=16"};
  const PipelineSpec spec = load_pipeline(source_dir() + "/pipelines/offline.yaml", po);
  TransitionBatch data;
  data.S = 4;
  data.D = 1;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-0.2f, 0.2f);
  for (int i = 0; i < 300; ++i) {
    float s[4], n[4];
    for (int k = 0; k < 4; ++k) s[k] = u(rng), n[k] = u(rng);
    const std::int32_t a = std::int32_t(i % 2);
    data.push(s, &a, 1.0f, n, i % 20 == 19);
  }
  auto group = make_host_group({0, 1});
  std::vector<TrainResult> res(2);
  std::vector<std::vector<double>> params(2), first_batch(2);
  std::vector<std::int64_t> replay(2);
  run_ranks(*group, [&](int rank) {
    EngineOptions eo = training_engine_options(spec, &data);
    eo.group = group;
    eo.rank = rank;
    Engine e(spec, loader(), eo);
    init_weights(e, spec.seed);
    TrainerOptions o = quiet_options(tmp.path / "run");
    o.offline = &data;
    o.ranks = group.get();
    o.rank = rank;
    Trainer t(e, o);
    res[std::size_t(rank)] = t.run();
    replay[std::size_t(rank)] = t.replay_size();
    params[std::size_t(rank)] = host_buffer(e, "params");
    first_batch[std::size_t(rank)] = host_buffer(e, buf::states2);
  });
  CHECK(res[0].train_steps == 40);
  CHECK(res[1].train_steps == 40);
  CHECK(res[0].ranks == 2);
  CHECK(replay[0] == 300);  // the whole dataset on each rank
  CHECK(replay[1] == 300);
  CHECK(params[0] == params[1]);  // bit-identical
  CHECK(first_batch[0] != first_batch[1]);  // batches of their own
  const auto lines = read_metrics(tmp.path / "run" / "metrics.jsonl");
  REQUIRE(lines.size() >= 2);
  CHECK(lines.back()["ranks"] == 2);
  CHECK(lines.back()["train_steps"] == 40);
  CHECK(lines.back()["final"] == true);
}

TEST_CASE("trainer.offline_any_shape: a dataset of 6 features and 3 branches trains with no environment") {
  // Its observation size and branches come from the data; no environment is named, so none is
  // made (CartPole's 4 features would not fit) and nothing is evaluated.
  TempDir tmp("offline-shape");
  ParseOptions po;
  po.plugins = &loader();
  po.environments = environment_shapes(&loader());
  po.overrides = {"backend=cpu", "training.env=\"\"", "network.state=6", "network.branches=3", "network.actions=4",
                  "training.dataset=shape.safetensors", "training.total_steps=30", "batch=16"};
  const PipelineSpec spec = load_pipeline(source_dir() + "/pipelines/offline.yaml", po);
  CHECK(spec.training.env.none());
  // Left out altogether, with a dataset: none either.
  const PipelineSpec absent = parse_pipeline("heads: [{plugin: c51, role: primary}]\nnetwork: {state: 6}\n"
                                             "training: {dataset: shape.safetensors}\n", "absent.yaml", po);
  CHECK(absent.training.env.none());
  TransitionBatch data;
  data.S = 6;
  data.D = 3;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int i = 0; i < 200; ++i) {
    float s[6], n[6];
    for (int k = 0; k < 6; ++k) s[k] = u(rng), n[k] = u(rng);
    const std::int32_t a[3] = {std::int32_t(i % 4), std::int32_t((i / 4) % 4), std::int32_t((i / 16) % 4)};
    data.push(s, a, u(rng), n, i % 25 == 24);
  }
  Engine e(spec, loader(), training_engine_options(spec, &data));
  init_weights(e, spec.seed);
  TrainerOptions o = quiet_options(tmp.path / "run");
  o.offline = &data;
  Trainer t(e, o);
  const TrainResult r = t.run();
  CHECK(r.train_steps == 30);
  CHECK(!r.final_eval);
  const auto lines = read_metrics(tmp.path / "run" / "metrics.jsonl");
  REQUIRE(!lines.empty());
  for (const auto& l : lines) CHECK(!l.contains("eval_return"));
  CHECK(lines.back()["train_steps"] == 30);
}

namespace {

/// What a stream the run log wrote to holds.
std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
  return s;
}

/// A progress line's values: the clock, the last and best evaluations, ε.
ProgressValues pv(std::int64_t clock, std::optional<double> last, std::optional<double> best, double epsilon) {
  ProgressValues v;
  v.clock = clock;
  v.last_eval = last;
  v.best_eval = best;
  v.epsilon = epsilon;
  return v;
}

/// Terminal or metrics text with its timings (rates, ETA, wall time) as T.
std::string timings_masked(const std::string& text) {
  static const std::regex json_time(R"re("(steps_per_s|train_steps_per_s|wall_s)":[-0-9.e+]+)re");
  static const std::regex rate(R"re(\d+ steps/s)re"), eta(R"re((ETA|wall) [0-9:?]+)re");
  std::string s = std::regex_replace(text, json_time, "\"$1\":T");
  s = std::regex_replace(s, rate, "T steps/s");
  return std::regex_replace(s, eta, "$1 T");
}

std::vector<std::string> lines_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

TEST_CASE("trainer.run_log: metrics lines, the progress line and messages from the values the loop hands over") {
  TempDir tmp("run_log");
  SUBCASE("metrics lines: keys in order, nulls before a report, several ranks, the final line") {
    RunLog log(RunLog::Progress::none, nullptr, 100, 1000);
    log.start();
    log.open(tmp.path.string(), false);
    MetricsValues v;
    v.step = 100;
    v.episodes = 3;
    v.epsilon = 0.5;
    v.heads = {"c51", "cql"};
    v.replay_size = 100;
    log.metrics_line(v);
    v.step = 200;
    v.train_steps = 50;
    v.ranks = 2;
    v.env_steps_all_ranks = 400;
    v.episode_return = 12.5;
    EvalResult ev;
    ev.mean = 20.0, ev.min = 10.0, ev.max = 30.0, ev.episodes = 3, ev.complete = true, ev.seed = 42;
    v.eval = ev;
    v.beta = 0.75;
    v.report = MetricsValues::Report{{{"c51", 1.5, 2.0, 1.0}, {"cql", 0.25, 0.5, 0.125}}, 1.75, 2};
    v.max_priority = 3.0;
    v.final_line = v.interrupted = true;
    log.metrics_line(v);
    log.close();
    const auto lines = lines_of(tmp.path / RunLog::kMetricsFile);
    REQUIRE(lines.size() == 2);
    CHECK(timings_masked(lines[0]) ==
          R"({"step":100,"train_steps":0,"episodes":3,"episode_return":null,"epsilon":0.5,)"
          R"("loss.c51":null,"grad_norm.c51":null,"clip.c51":null,"loss.cql":null,"grad_norm.cql":null,"clip.cql":null,)"
          R"("total_loss":null,"skipped_steps":0,"replay_size":100,"steps_per_s":T,"train_steps_per_s":T,"wall_s":T})");
    CHECK(timings_masked(lines[1]) ==
          R"({"step":200,"train_steps":50,"ranks":2,"env_steps_all_ranks":400,"episodes":3,"episode_return":12.5,)"
          R"("eval_return":20.0,"eval_min":10.0,"eval_max":30.0,"eval_episodes":3,"eval_seed":42,"epsilon":0.5,"beta":0.75,)"
          R"("loss.c51":1.5,"grad_norm.c51":2.0,"clip.c51":1.0,"loss.cql":0.25,"grad_norm.cql":0.5,"clip.cql":0.125,)"
          R"("total_loss":1.75,"skipped_steps":2,"replay_size":100,"max_priority":3.0,)"
          R"("steps_per_s":T,"train_steps_per_s":T,"wall_s":T,"final":true,"interrupted":true})");
    CHECK(log.marks().last_log_steps == 200);
    CHECK(log.marks().last_log_train_steps == 50);
  }
  SUBCASE("a resumed run appends; a log with no file (another rank's) keeps its marks and writes nothing") {
    MetricsValues v;
    v.step = 100;
    {
      RunLog first(RunLog::Progress::none, nullptr, 100, 1000);
      first.start();
      first.open(tmp.path.string(), false);
      first.metrics_line(v);
      CHECK(first.metrics_bytes() == std::int64_t(fs::file_size(tmp.path / RunLog::kMetricsFile)));
    }
    const auto before = lines_of(tmp.path / RunLog::kMetricsFile);
    RunLog resumed(RunLog::Progress::none, nullptr, 100, 1000);
    resumed.start();
    resumed.resume(5.0, {100, 0, 0});
    resumed.open(tmp.path.string(), true);
    v.step = 200;
    resumed.metrics_line(v);
    resumed.close();
    const auto after = lines_of(tmp.path / RunLog::kMetricsFile);
    REQUIRE(after.size() == 2);
    CHECK(after[0] == before[0]);
    RunLog other_rank(RunLog::Progress::none, nullptr, 100, 1000);
    other_rank.start();
    v.step = 300;
    v.train_steps = 7;
    other_rank.metrics_line(v);
    CHECK(other_rank.marks().last_log_steps == 300);
    CHECK(other_rank.marks().last_log_train_steps == 7);
    CHECK(lines_of(tmp.path / RunLog::kMetricsFile) == after);
  }
  SUBCASE("a metrics file that cannot be opened or written is named") {
    fs::create_directories(tmp.path / "dir" / RunLog::kMetricsFile);  // a folder where the file goes
    RunLog log(RunLog::Progress::none, nullptr, 100, 1000);
    log.start();
    const std::string in_dir = (tmp.path / "dir" / RunLog::kMetricsFile).string();
    CHECK_THROWS_WITH_AS(log.open((tmp.path / "dir").string(), false), ("cannot open '" + in_dir + "' for writing").c_str(),
                         std::runtime_error);
    if (fs::exists("/dev/full")) {  // every write to it fails (ENOSPC)
      fs::create_directories(tmp.path / "full");
      fs::create_symlink("/dev/full", tmp.path / "full" / RunLog::kMetricsFile);
      RunLog full(RunLog::Progress::none, nullptr, 100, 1000);
      full.start();
      full.open((tmp.path / "full").string(), false);
      const std::string file = (tmp.path / "full" / RunLog::kMetricsFile).string();
      CHECK_THROWS_WITH_AS(full.metrics_line(MetricsValues{}), ("cannot write '" + file + "'").c_str(), std::runtime_error);
    }
  }
  SUBCASE("plain lines where the output is no terminal: evaluations, every 10 x log_every, the end") {
    std::FILE* f = std::tmpfile();
    REQUIRE(f);
    RunLog log(RunLog::Progress::automatic, f, 100, 5000);
    log.start();
    log.progress(pv(100, {}, {}, 0.9), false, false);   // not yet 10 x log_every since the last line
    log.progress(pv(1000, {}, {}, 0.8), false, false);  // 10 x log_every
    ProgressValues mid = pv(1100, 20.0, 25.0, 0.7);
    mid.episode_return = 31.25;
    mid.loss = 0.123456;
    mid.stop_rule = "eval ≥ 475";
    log.progress(mid, true, false);
    log.note("dqn train: a message");
    ProgressValues offline = pv(1200, 20.0, 25.0, 0.0);
    offline.offline = true;
    log.progress(offline, true, false);
    log.progress(pv(5000, 20.0, 25.0, 0.1), false, true);
    CHECK(timings_masked(contents(f)) ==
          "step 1000/5000  return -  loss -  eval -  eps 0.800  T steps/s  ETA T\n"
          "step 1100/5000  return 31.2  loss 0.1235  eval 20.0 (best 25.0)  eps 0.700  T steps/s  ETA T (sooner at "
          "eval ≥ 475)\n"
          "dqn train: a message\n"
          "step 1200/5000  return -  loss -  eval 20.0 (best 25.0)  T steps/s  ETA T\n"
          "step 5000/5000  return -  loss -  eval 20.0 (best 25.0)  eps 0.100  T steps/s  wall T\n");
    CHECK(log.marks().last_plain == 5000);
    std::fclose(f);
  }
  SUBCASE("on a terminal one line redrawn in place, a message clearing it first; none: messages only") {
    std::FILE* f = std::tmpfile();
    REQUIRE(f);
    RunLog tty(RunLog::Progress::tty, f, 100, 5000);
    tty.start();
    tty.progress(pv(100, {}, {}, 0.9), false, false);
    tty.note("dqn train: a message");
    tty.progress(pv(5000, 20.0, 20.0, 0.1), false, true);
    CHECK(timings_masked(contents(f)) ==
          "\r\033[Kstep 100/5000  return -  loss -  eval -  eps 0.900  T steps/s  ETA T"
          "\r\033[Kdqn train: a message\n"
          "\r\033[Kstep 5000/5000  return -  loss -  eval 20.0 (best 20.0)  eps 0.100  T steps/s  wall T\n");
    std::fclose(f);
    f = std::tmpfile();
    REQUIRE(f);
    RunLog none(RunLog::Progress::none, f, 100, 5000);
    none.start();
    none.progress(pv(5000, {}, {}, 0.1), true, true);
    none.note("dqn train: a message");
    CHECK(contents(f) == "dqn train: a message\n");
    std::fclose(f);
  }
  SUBCASE("a resumed run's wall time goes on from its checkpoint's") {
    RunLog log(RunLog::Progress::none, nullptr, 100, 1000);
    log.start();
    log.resume(100.0, {5, 6, 7});
    CHECK(log.wall_s() >= 100.0);
    CHECK(log.wall_s() < 200.0);
    CHECK(log.marks().last_log_steps == 5);
    CHECK(log.marks().last_log_train_steps == 6);
    CHECK(log.marks().last_plain == 7);
  }
}
