// The public API (dqn/agent.hpp, dqn/environment.hpp) on the CPU: an Agent from pipeline text,
// acting and its Q-values, observe → train, save and load, evaluation (against the training
// loop's own), an Environment stepped by hand, and the errors that cross the boundary.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "dqn/agent.hpp"
#include "dqn/environment.hpp"
#include "../test_util.hpp"

using namespace dqn;

namespace {

const char* kPipeline = R"(name: api
seed: 3
backend: cpu
network: {state: 4, trunk: [32, 32], head_hidden: 16, branches: 1, actions: 2, atoms: 11, v_min: -10, v_max: 10}
heads:
  - {plugin: c51, role: primary}
batch: 32
gamma: 0.9
n_step: 2
training:
  env: CartPole-v1
  num_envs: 4
  replay: {capacity: 5000}
  eval: {episodes: 6}
)";

AgentOptions cpu() {
  AgentOptions o;
  o.backend = "cpu";
  return o;
}

std::vector<float> random_obs(int rows, int S, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0.0f, 0.5f);
  std::vector<float> x(std::size_t(rows) * std::size_t(S));
  for (float& v : x) v = n(g);
  return x;
}

/// Steps a CartPole Environment with random actions and shows the agent every step.
void observe_random(Agent& a, Environment& env, int steps, std::uint64_t seed) {
  const int N = env.copies(), S = env.observation_size();
  const auto n = static_cast<std::size_t>(N), ns = static_cast<std::size_t>(N * S);
  std::vector<float> obs(ns), next(ns), fin(ns), rew(n);
  std::vector<std::uint8_t> term(n), trunc(n);
  std::vector<std::int32_t> act(n);
  std::mt19937_64 g(seed);
  env.reset(seed, obs.data());
  for (int t = 0; t < steps; ++t) {
    for (auto& x : act) x = std::int32_t(g() % 2);
    env.step(act.data(), next.data(), rew.data(), term.data(), trunc.data(), fin.data());
    a.observe(obs.data(), act.data(), rew.data(), fin.data(), term.data(), trunc.data(), N);
    obs.swap(next);
  }
}

}  // namespace

TEST_CASE("agent.shapes_act_and_q_values") {
  Agent a = Agent::from_text(kPipeline, cpu());
  CHECK(a.observation_size() == 4);
  CHECK(a.branches() == 1);
  CHECK(a.actions_per_branch() == std::vector<int>{2});
  CHECK(a.max_rows() == 6);  // the larger of num_envs and eval.episodes
  CHECK(a.backend() == "cpu");
  CHECK(a.seed() == 3);
  CHECK(a.pipeline_yaml().find("atoms: 11") != std::string::npos);
  const std::vector<float> obs = random_obs(6, 4, 1);
  std::vector<std::int32_t> act(6, -1);
  std::vector<float> q(6 * 2);
  a.act(obs.data(), 6, act.data());
  a.q_values(obs.data(), 6, q.data());
  for (int r = 0; r < 6; ++r) {
    CHECK(std::isfinite(q[std::size_t(2 * r)]));
    // act is the argmax of q_values (ties: the lower index)
    CHECK(act[std::size_t(r)] == (q[std::size_t(2 * r + 1)] > q[std::size_t(2 * r)] ? 1 : 0));
  }
  // the same seed, the same initial network
  Agent b = Agent::from_text(kPipeline, cpu());
  std::vector<float> qb(q.size());
  b.q_values(obs.data(), 6, qb.data());
  CHECK(qb == q);
}

TEST_CASE("agent.errors_cross_the_boundary") {
  // A pipeline error keeps its place.
  try {
    Agent::from_text(std::string(kPipeline) + "gama: 0.5\n", cpu(), "mine.yaml");
    FAIL("accepted an unknown key");
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("mine.yaml:15:1") != std::string::npos);
    CHECK(m.find("gamma") != std::string::npos);  // did you mean
  }
  AgentOptions bad = cpu();
  bad.overrides = {"network.atoms=1"};
  CHECK_THROWS_AS(Agent::from_text(kPipeline, bad), std::invalid_argument);
  bad.backend = "gpu";
  CHECK_THROWS_WITH_AS(Agent::from_text(kPipeline, bad), doctest::Contains("expected cpu or cuda"),
                       std::invalid_argument);
  Agent a = Agent::from_text(kPipeline, cpu());
  std::vector<float> obs = random_obs(7, 4, 2);
  std::vector<std::int32_t> act(7);
  CHECK_THROWS_WITH_AS(a.act(obs.data(), 7, act.data()), doctest::Contains("takes 1 to 6"), std::invalid_argument);
  CHECK_THROWS_AS(a.act(obs.data(), 0, act.data()), std::invalid_argument);
  obs[2 * 4 + 3] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH_AS(a.act(obs.data(), 3, act.data()), doctest::Contains("row 2, feature 3"), std::invalid_argument);
  // training before there is a batch to draw
  CHECK_THROWS_WITH_AS(a.train(1), doctest::Contains("fewer than one batch"), std::logic_error);
  CHECK_THROWS_WITH_AS(Agent::from_run("/nonexistent/run", cpu()), doctest::Contains("no such run directory"),
                       std::invalid_argument);
}

TEST_CASE("agent.observe_train_save_load") {
  test::TempDir tmp("dqn-agent", "save");
  Agent a = Agent::from_text(kPipeline, cpu());
  Environment env = Environment::make("CartPole-v1", 4, 11);
  CHECK(env.label() == "cartpole:CartPole-v1");
  CHECK(env.observation_size() == 4);
  CHECK(env.actions_per_branch() == std::vector<int>{2});
  CHECK(env.max_episode_steps() == 500);
  CHECK_FALSE(env.control_ranges()[0].has_value());
  observe_random(a, env, 40, 5);
  // 40 steps of 4 copies: every step but the last n−1 of each window became a transition
  CHECK(a.replay_size() >= 4 * 38);
  CHECK(a.replay_size() <= 160);
  const std::vector<float> obs = random_obs(5, 4, 3);
  std::vector<float> q0(10), q1(10), q2(10);
  a.q_values(obs.data(), 5, q0.data());
  const AgentReport r = a.train(20);
  CHECK(a.train_steps() == 20);
  CHECK(r.heads == std::vector<std::string>{"c51"});
  CHECK(std::isfinite(r.total_loss));
  CHECK(r.total_loss > 0);
  CHECK(r.skipped_steps == 0);
  a.q_values(obs.data(), 5, q1.data());
  CHECK(q1 != q0);  // it learned something
  // the copies are fixed by the first call; actions are checked
  std::vector<float> o1(8, 0.0f), rw(2, 0.0f);
  std::vector<std::int32_t> ac(2, 0);
  std::vector<std::uint8_t> fl(2, 0);
  CHECK_THROWS_WITH_AS(a.observe(o1.data(), ac.data(), rw.data(), o1.data(), fl.data(), fl.data(), 2),
                       doctest::Contains("first call had 4"), std::invalid_argument);
  // save → a fresh agent loads the same network
  const std::string file = (tmp.path / "agent.safetensors").string();
  a.save(file);
  Agent b = Agent::from_text(kPipeline, cpu());
  b.load(file);
  b.q_values(obs.data(), 5, q2.data());
  CHECK(q2 == q1);
  AgentOptions other = cpu();
  other.overrides = {"network.atoms=21"};
  Agent c = Agent::from_text(kPipeline, other);
  CHECK_THROWS_WITH_AS(c.load(file), doctest::Contains("c51.value.1.weight"), std::invalid_argument);
}

TEST_CASE("agent.evaluate") {
  Agent a = Agent::from_text(kPipeline, cpu());
  const AgentEval e = a.evaluate();  // training.eval.episodes
  CHECK(e.episodes == 6);
  CHECK(e.env == "cartpole:CartPole-v1");
  CHECK(e.returns.size() == 6);
  CHECK(e.lengths.size() == 6);
  CHECK(e.min <= e.mean);
  CHECK(e.mean <= e.max);
  CHECK_FALSE(e.success.has_value());
  const AgentEval again = a.evaluate();
  CHECK(again.returns == e.returns);  // the default seed is fixed
  const AgentEval other = a.evaluate(6, e.seed + 1);
  CHECK(other.seed == e.seed + 1);
  // 9 episodes over the act step's 6 rows: 3 copies of 3
  CHECK(a.evaluate(9).episodes == 9);
  const nlohmann::json j = nlohmann::json::parse(e.json());
  CHECK(j["episodes"] == 6);
  CHECK(j["mean"].get<double>() == e.mean);
  CHECK(e.text().find("6 episodes") != std::string::npos);
  // another task: the network must fit it
  CHECK_THROWS_WITH_AS(a.evaluate(2, std::nullopt, 0.0, "reacher:reacher"), doctest::Contains("network.state"),
                       std::invalid_argument);
  CHECK_THROWS_AS(a.evaluate(2, std::nullopt, 1.5), std::invalid_argument);
}

TEST_CASE("agent.run_resume_collect") {
  test::TempDir tmp("dqn-agent", "run");
  auto dir = [&](const char* n) { return (tmp.path / n).string(); };
  auto bytes = [](const std::string& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  AgentOptions o = cpu();
  o.overrides = {"training.total_steps=800", "training.learning_starts=100", "training.eval.every=400",
                 "training.checkpoint_every=400"};
  AgentRunOptions quiet;
  quiet.progress = false;
  // The pipeline's own loop, whole: the run directory as dqn train writes it, and the agent left
  // with the run's final parameters.
  Agent a = Agent::from_text(kPipeline, o);
  quiet.run_dir = dir("full");
  const AgentRun full = a.run(quiet);
  CHECK(full.run_dir == dir("full"));
  CHECK(full.env_steps == 800);
  CHECK(full.train_steps > 0);
  CHECK(a.train_steps() == full.train_steps);
  CHECK(full.final_eval.has_value());
  CHECK_FALSE(full.interrupted);
  CHECK_FALSE(full.offline);
  for (const char* f : {"pipeline.yaml", "metrics.jsonl", "weights.safetensors", "best.safetensors"})
    CHECK_MESSAGE(std::filesystem::exists(tmp.path / "full" / f), f);
  const std::vector<float> obs = random_obs(5, 4, 9);
  std::vector<float> qa(10), qb(10);
  a.q_values(obs.data(), 5, qa.data());
  Agent::from_run(dir("full"), cpu()).q_values(obs.data(), 5, qb.data());
  CHECK(qa == qb);
  // A run never writes over another.
  CHECK_THROWS_WITH_AS(a.run(quiet), doctest::Contains("not empty"), std::invalid_argument);
  // Stopped before its first step, it writes a checkpoint there; resumed, it ends as the whole run did.
  Agent b = Agent::from_text(kPipeline, o);
  quiet.run_dir = dir("stopped");
  b.request_stop();
  const AgentRun stopped = b.run(quiet);
  CHECK(stopped.interrupted);
  CHECK(stopped.env_steps < 800);
  REQUIRE_FALSE(stopped.checkpoint.empty());
  AgentOptions extra = cpu();
  extra.overrides = {"seed=4"};
  CHECK_THROWS_WITH_AS(Agent::resume(dir("stopped"), extra), doctest::Contains("no overrides"), std::invalid_argument);
  Agent c = Agent::resume(dir("stopped"), cpu());
  REQUIRE(c.resume_point().has_value());
  CHECK(c.resume_point()->path == stopped.checkpoint);
  quiet.run_dir = "";
  const AgentRun resumed = c.run(quiet);
  CHECK(resumed.env_steps == 800);
  CHECK_FALSE(resumed.interrupted);
  CHECK_FALSE(c.resume_point().has_value());
  CHECK(bytes(dir("stopped") + "/weights.safetensors") == bytes(dir("full") + "/weights.safetensors"));
  CHECK_THROWS_WITH_AS(Agent::resume(dir("stopped"), cpu()).run(quiet), doctest::Contains("nothing to resume"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(Agent::resume(dir("nowhere"), cpu()), doctest::Contains("no such directory"),
                       std::invalid_argument);
  // A dataset from the trained policy: written whole, never over a file unless asked, nothing
  // written when stopped.
  const std::string data = dir("data.safetensors");
  const AgentDataset d = a.collect(data, 200, 0.1, 5);
  CHECK(d.steps == 200);
  CHECK_FALSE(d.stopped);
  CHECK(d.env == "cartpole:CartPole-v1");
  CHECK(d.episodes >= d.complete_episodes);
  CHECK(std::filesystem::exists(data));
  const std::string kept = bytes(data);
  CHECK_THROWS_WITH_AS(a.collect(data, 40, 0.1, 5), doctest::Contains("exists; nothing was written"),
                       std::invalid_argument);
  a.request_stop();
  const AgentDataset none = a.collect(data, 400, 0.1, 6, true);
  CHECK(none.stopped);
  CHECK(none.steps == 0);
  CHECK(bytes(data) == kept);
  CHECK(a.collect(data, 40, 0.1, 6, true).steps == 40);  // the request ended that collection only
  // Offline from it: the dataset's transitions, no environment steps (CartPole evaluates).
  AgentOptions off = cpu();
  off.overrides = {"training.dataset=" + data, "training.total_steps=30", "training.learning_starts=0",
                   "training.eval.every=30", "training.eval.episodes=2"};
  Agent e = Agent::from_text(kPipeline, off);
  quiet.run_dir = dir("offline");
  const AgentRun r = e.run(quiet);
  CHECK(r.offline);
  CHECK(r.env_steps == 0);
  CHECK(r.train_steps == 30);
  CHECK(r.final_eval.has_value());
}

TEST_CASE("environment.options_and_errors") {
  Environment r = Environment::make("reacher:reacher", 2, 1, {"links=3", "bins=7"});
  CHECK(r.branches() == 3);
  CHECK(r.actions_per_branch() == std::vector<int>{7, 7, 7});
  CHECK(r.observation_size() == 5 * 3 + 6);
  REQUIRE(r.control_ranges()[0].has_value());
  CHECK(r.control_ranges()[0]->first == -1.0);
  CHECK(r.reports_success());
  CHECK_THROWS_WITH_AS(Environment::make("reacher:reacher", 1, 1, {"lnks=3"}), doctest::Contains("links"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(Environment::make("CartPol-v1"), doctest::Contains("CartPole-v1"), std::invalid_argument);
  CHECK_THROWS_AS(Environment::make("reacher:reacher", 1, 1, {"links"}), std::invalid_argument);
  Environment c = Environment::make("CartPole-v1", 2, 4);
  std::vector<float> obs(8), next(8), fin(8), rew(2);
  std::vector<std::uint8_t> term(2), trunc(2);
  std::vector<std::int32_t> act = {0, 2};
  c.reset(4, obs.data());
  CHECK_THROWS_AS(c.step(act.data(), next.data(), rew.data(), term.data(), trunc.data(), fin.data()),
                  std::invalid_argument);
}
