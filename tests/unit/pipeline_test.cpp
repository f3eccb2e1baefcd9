// The pipeline DSL: valid and invalid pipelines side by side, budgets, overrides, round trips.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "dqn_config.h"
#include "training/env/vec_env.hpp"
#include "pipeline/parse.hpp"
#include "pipeline/schema.hpp"
#include "pipeline/tree.hpp"
#include "../test_util.hpp"

using namespace dqn;
using dqn::test::source_dir;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Hand-made descriptors, shaped like the real plugins' (their schemas live elsewhere).
const ParamSchema kIqnSchema[] = {
    {"quantiles", ParamType::integer, "32", "online quantile samples N", 1, 1024},
    {"target_quantiles", ParamType::integer, "32", "target quantile samples N'", 1, 1024},
    {"embed", ParamType::integer, "64", "cosine embedding size E", 1, 4096},
    {"kappa", ParamType::number, "1.0", "Huber threshold", 1e-6, kInf},
};
const ParamSchema kEnsembleSchema[] = {
    {"members", ParamType::integer, "4", "ensemble heads K", 1, 64},
};
const ParamSchema kCqlSchema[] = {
    {"alpha", ParamType::number, "1.0", "penalty weight", 0, kInf},
};
// A test-only plugin with the types the real ones lack: string, boolean, a required param.
const ParamSchema kProbeSchema[] = {
    {"mode", ParamType::string, "\"mean\"", "what to probe", -kInf, kInf},
    {"verbose", ParamType::boolean, "false", "log more", -kInf, kInf},
    {"level", ParamType::integer, nullptr, "required: probe level", 0, 9},
};
const ParamSchema kBrokenSchema[] = {
    {"width", ParamType::integer, "wide", "a default that is not an integer", 1, 10},
};

PluginDescriptor make(const char* name, double budget, int primary, const ParamSchema* schema,
                      std::uint32_t n) {
  return PluginDescriptor{kAbiMajor, kAbiMinor, sizeof(PluginDescriptor), PluginKind::head, name, "0.1",
                          "fake", budget, primary, n, schema, nullptr, nullptr, 0, nullptr, nullptr};
}

const PluginDescriptor kC51 = make("c51", 0.0, 1, nullptr, 0);
const PluginDescriptor kIqn = make("iqn", 0.2, 0, kIqnSchema, 4);
const PluginDescriptor kEnsemble = make("ensemble", 0.1, 0, kEnsembleSchema, 1);
const PluginDescriptor kCql = make("cql", 0.1, 0, kCqlSchema, 1);
const PluginDescriptor kProbe = make("probe", 0.05, 0, kProbeSchema, 3);
const PluginDescriptor kBroken = make("broken", 0.05, 0, kBrokenSchema, 1);

// Environment plugins, shaped like the real ones (the parser reads their tasks and schemas only).
const ParamSchema kCartSchema[] = {
    {"max_episode_steps", ParamType::integer, "500", "truncation", 1, 1e9},
};
const EnvDescriptor kCartTasks[] = {{"CartPole-v1", "balance", 1, kCartSchema, nullptr, nullptr}};
const EnvDescriptor kClassicTasks[] = {{"Acrobot-v1", "swing", 0, nullptr, nullptr, nullptr},
                                       {"true", "a task named like a boolean", 0, nullptr, nullptr, nullptr}};
PluginDescriptor make_env_plugin(const char* name, const EnvDescriptor* tasks, std::uint32_t n) {
  return PluginDescriptor{kAbiMajor, kAbiMinor, sizeof(PluginDescriptor), PluginKind::environment, name, "0.1", "fake",
                          0.0, 0, 0, nullptr, nullptr, nullptr, n, tasks, nullptr};
}
const PluginDescriptor kCartPlugin = make_env_plugin("cartpole", kCartTasks, 1);
const PluginDescriptor kClassicPlugin = make_env_plugin("classic", kClassicTasks, 2);
// The shipped pipelines' other environments, with the options they write.
const ParamSchema kArmSchema[] = {
    {"links", ParamType::integer, "4", "joints", 1, 16},
    {"bins", ParamType::integer, "5", "controls per joint", 2, 1001},
    {"model", ParamType::string, "\"\"", "MJCF file", -kInf, kInf},
};
const EnvDescriptor kReacherTasks[] = {{"reacher", "arm", 2, kArmSchema, nullptr, nullptr}};
const EnvDescriptor kMujocoTasks[] = {{"humanoid_stand", "stand", 3, kArmSchema, nullptr, nullptr},
                                      {"reacher", "arm", 3, kArmSchema, nullptr, nullptr}};
const PluginDescriptor kReacherPlugin = make_env_plugin("reacher", kReacherTasks, 1);
const PluginDescriptor kMujocoPlugin = make_env_plugin("mujoco", kMujocoTasks, 2);

class FakeCatalog : public PluginCatalog {
 public:
  const PluginDescriptor* find(const std::string& name) const override {
    for (const PluginDescriptor* d : all_)
      if (name == d->name) return d;
    return nullptr;
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> n;
    for (const PluginDescriptor* d : all_) n.push_back(d->name);
    return n;
  }
  std::string search_path() const override { return "/fake/plugins:/opt/dqn"; }

 private:
  std::vector<const PluginDescriptor*> all_{&kC51, &kIqn, &kEnsemble, &kCql, &kProbe, &kBroken, &kCartPlugin, &kClassicPlugin,
                                            &kReacherPlugin, &kMujocoPlugin};
};

const FakeCatalog kCatalog;

ParseOptions with_catalog(std::vector<std::string> overrides = {}) {
  ParseOptions o;
  o.plugins = &kCatalog;
  o.overrides = std::move(overrides);
  return o;
}

PipelineSpec parse(const std::string& text, const ParseOptions& o = with_catalog()) {
  return parse_pipeline(text, "t.yaml", o);
}

/// The errors of a pipeline that must fail (empty when it parses, which fails the caller's check).
std::vector<PipelineError> errors_of(const std::string& text, const ParseOptions& o = with_catalog()) {
  try {
    parse(text, o);
  } catch (const PipelineErrors& e) {
    return e.errors();
  }
  return {};
}

/// The one error of a pipeline that must fail with exactly one.
PipelineError only_error(const std::string& text, const ParseOptions& o = with_catalog()) {
  auto errs = errors_of(text, o);
  INFO("errors: " << errs.size());
  REQUIRE(errs.size() == 1);
  return errs[0];
}

const std::string kPrimary = "heads: [{plugin: c51, role: primary}]\n";

/// Every setting of two specs (not where they came from).
void check_same(const PipelineSpec& a, const PipelineSpec& b) {
  CHECK(a.name == b.name);
  CHECK(a.seed == b.seed);
  CHECK(a.backend == b.backend);
  CHECK(a.backend_auto == b.backend_auto);
  CHECK(a.precision == b.precision);
  CHECK(a.network.state == b.network.state);
  CHECK(a.network.trunk == b.network.trunk);
  CHECK(a.network.head_hidden == b.network.head_hidden);
  CHECK(a.network.branches == b.network.branches);
  CHECK(a.network.actions == b.network.actions);
  CHECK(a.network.atoms == b.network.atoms);
  CHECK(a.network.v_min == b.network.v_min);
  CHECK(a.network.v_max == b.network.v_max);
  REQUIRE(a.heads.size() == b.heads.size());
  for (std::size_t i = 0; i < a.heads.size(); ++i) {
    CAPTURE(i);
    CHECK(a.heads[i].plugin == b.heads[i].plugin);
    CHECK(a.heads[i].name == b.heads[i].name);
    CHECK(a.heads[i].role == b.heads[i].role);
    CHECK(a.heads[i].budget == b.heads[i].budget);
    CHECK(a.heads[i].enabled == b.heads[i].enabled);
    CHECK(a.heads[i].params == b.heads[i].params);
  }
  CHECK(a.max_grad_norm == b.max_grad_norm);
  CHECK(a.adam.lr == b.adam.lr);
  CHECK(a.adam.beta1 == b.adam.beta1);
  CHECK(a.adam.beta2 == b.adam.beta2);
  CHECK(a.adam.eps == b.adam.eps);
  CHECK(a.spectral_norm.enabled == b.spectral_norm.enabled);
  CHECK(a.spectral_norm.sigma_max == b.spectral_norm.sigma_max);
  CHECK(a.target.polyak == b.target.polyak);
  CHECK(a.target.period == b.target.period);
  CHECK(a.batch == b.batch);
  CHECK(a.gamma == b.gamma);
  CHECK(a.n_step == b.n_step);
  CHECK(a.report_every == b.report_every);
  CHECK(a.cuda == b.cuda);
  const TrainingSpec &s = a.training, &t = b.training;
  CHECK(s.env == t.env);
  CHECK(s.num_envs == t.num_envs);
  CHECK(s.total_steps == t.total_steps);
  CHECK(s.learning_starts == t.learning_starts);
  CHECK(s.train_every == t.train_every);
  CHECK(s.gradient_steps == t.gradient_steps);
  CHECK(s.epsilon.start == t.epsilon.start);
  CHECK(s.epsilon.end == t.epsilon.end);
  CHECK(s.epsilon.decay_steps == t.epsilon.decay_steps);
  CHECK(s.replay.capacity == t.replay.capacity);
  CHECK(s.replay.prioritized == t.replay.prioritized);
  CHECK(s.replay.alpha == t.replay.alpha);
  CHECK(s.replay.beta_start == t.replay.beta_start);
  CHECK(s.replay.beta_end == t.replay.beta_end);
  CHECK(s.replay.priority_eps == t.replay.priority_eps);
  CHECK(s.eval.every == t.eval.every);
  CHECK(s.eval.episodes == t.eval.episodes);
  CHECK(s.stop_at_return == t.stop_at_return);
  CHECK(s.out_dir == t.out_dir);
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string all;
  for (const auto& k : keys) all += (all.empty() ? "" : ", ") + k;
  return all;
}

std::string contains_msg(const std::vector<PipelineError>& errs) {
  std::string all;
  for (const auto& e : errs) all += std::string(e.what()) + "\n";
  return all;
}

}  // namespace

TEST_CASE("pipeline.error_format") {
  SourceLoc at{"pipelines/x.yaml", 12, 5};
  CHECK(at.str() == "pipelines/x.yaml:12:5");
  CHECK(SourceLoc{"<override 'batch=3'>", 0, 0}.str() == "<override 'batch=3'>");
  CHECK(SourceLoc{"f.yaml", 3, 0}.str() == "f.yaml:3");

  PipelineError e(at, "heads[1].budget", "0.9",
                  "auxiliary budgets sum to 1.1, leaving the primary 'c51' -0.1 (must be > 0)",
                  "lower them");
  CHECK(std::string(e.what()) ==
        "pipelines/x.yaml:12:5: key 'heads[1].budget' = '0.9': auxiliary budgets sum to 1.1, "
        "leaving the primary 'c51' -0.1 (must be > 0)\n  hint: lower them");
  CHECK(e.key() == "heads[1].budget");
  CHECK(e.value() == "0.9");
  CHECK(e.hint() == "lower them");
  CHECK(e.where().line == 12);

  PipelineError no_hint(SourceLoc{"a.yaml", 1, 1}, "", "", "YAML syntax error: x");
  CHECK(std::string(no_hint.what()) == "a.yaml:1:1: YAML syntax error: x");

  PipelineErrors all({e, no_hint});
  CHECK(all.errors().size() == 2);
  CHECK(std::string(all.what()) == std::string(e.what()) + "\n" + no_hint.what());
}

TEST_CASE("pipeline.spec_helpers") {
  PipelineSpec s;
  s.gamma = 0.99;
  s.n_step = 3;
  CHECK(s.gamma_n() == doctest::Approx(0.99 * 0.99 * 0.99).epsilon(1e-15));
  CHECK_THROWS_AS(s.primary(), std::logic_error);
  HeadSpec aux, prim;
  aux.plugin = aux.name = "iqn";
  prim.plugin = prim.name = "c51";
  prim.role = Role::primary;
  s.heads = {aux, prim};
  CHECK(s.primary().name == "c51");
  CHECK(std::string(to_string(BackendKind::cuda)) == "cuda");
  CHECK(std::string(to_string(Precision::bf16)) == "bf16");
  CHECK(std::string(to_string(Role::auxiliary)) == "auxiliary");
}

TEST_CASE("pipeline.did_you_mean") {
  CHECK(edit_distance("batch", "batch") == 0);
  CHECK(edit_distance("bacth", "batch") == 1);  // a transposition counts once
  CHECK(edit_distance("netwrk", "network") == 1);
  CHECK(edit_distance("", "abc") == 3);
  CHECK(closest_match("netwrk", {"name", "network", "heads"}) == "network");
  CHECK(closest_match("Batch", {"batch", "gamma"}) == "batch");
  CHECK(closest_match("target_quant", {"quantiles", "target_quantiles"}) == "target_quantiles");
  CHECK(closest_match("zzzzzz", {"batch", "gamma"}).empty());
  CHECK(closest_match("xy", {"seed"}).empty());

  // End to end: the suggestion and the list of valid keys both reach the message.
  auto errs = errors_of("network: {stat: 4}\n" + kPrimary);
  REQUIRE(errs.size() == 1);
  CHECK(errs[0].why().find("did you mean 'state'?") != std::string::npos);
  CHECK(errs[0].hint().find("state, trunk, head_hidden, branches, actions, atoms, v_min, v_max") !=
        std::string::npos);
  CHECK(errs[0].key() == "network.stat");
}

TEST_CASE("pipeline.invalid_table") {
  struct Bad {
    const char* reason;
    std::string text;
    const char* fragment;  // in what()
    int line, column;
  };
  const std::string P = kPrimary;
  // clang-format off
  const std::vector<Bad> rows = {
    {"unknown top-level key, near a valid one", "bacth: 64\n" + P, "key 'bacth' = '64': unknown key, did you mean 'batch'?", 1, 1},
    {"unknown key inside network", "network: {stat: 4}\n" + P, "key 'network.stat'", 1, 11},
    {"duplicate top-level key", "batch: 64\nbatch: 32\n" + P, "duplicate key 'batch' (first given at t.yaml:1:1)", 2, 1},
    {"duplicate key inside a head", "heads: [{plugin: c51, role: primary, role: primary}]\n", "key 'heads[0].role' = 'primary': duplicate key 'role'", 1, 38},
    {"duplicate key in a nested block map", "training:\n  replay:\n    capacity: 1000\n    capacity: 2000\n" + P, "key 'training.replay.capacity' = '2000': duplicate key", 4, 5},
    {"integer field given a fraction", "batch: 1.5\n" + P, "key 'batch' = '1.5': expected an integer (a whole number)", 1, 8},
    {"integer field given a word", "batch: abc\n" + P, "key 'batch' = 'abc': expected an integer", 1, 8},
    {"integer field given a quoted number", "batch: \"64\"\n" + P, "expected an integer, got a quoted string", 1, 8},
    {"integer field with no value", "batch:\n" + P, "key 'batch': expected an integer, got nothing", 1, 1},
    {"batch below 1", "batch: 0\n" + P, "key 'batch' = '0': must be >= 1", 1, 8},
    {"int field beyond int range", "batch: 99999999999\n" + P, "must be <= 2147483647", 1, 8},
    {"negative seed", "seed: -1\n" + P, "key 'seed' = '-1': must be >= 0", 1, 7},
    {"trunk element not an integer", "network: {trunk: [64, x]}\n" + P, "key 'network.trunk[1]' = 'x': expected an integer", 1, 23},
    {"trunk too deep", "network: {trunk: [8, 8, 8, 8, 8, 8, 8, 8, 8]}\n" + P, "needs 1 to 8 layers, got 9", 1, 18},
    {"trunk empty", "network: {trunk: []}\n" + P, "needs 1 to 8 layers, got 0", 1, 18},
    {"trunk width zero", "network:\n  trunk: [64, 0]\n" + P, "key 'network.trunk[1]' = '0': must be >= 1", 2, 15},
    {"one atom", "network: {atoms: 1}\n" + P, "key 'network.atoms' = '1': must be >= 2", 1, 18},
    {"empty support", "network: {v_min: 5, v_max: 5}\n" + P, "key 'network.v_max' = '5': v_min (5) must be below v_max (5)", 1, 28},
    {"network not a map", "network: 5\n" + P, "key 'network' = '5': expected a map", 1, 10},
    {"unknown backend", "backend: gpu\n" + P, "expected one of cpu, cuda, auto", 1, 10},
    {"unknown precision, near one", "precision: tf23\n" + P, "expected one of fp32, tf32, bf16, did you mean 'tf32'?", 1, 12},
    {"yes is not a boolean here", "spectral_norm: {enabled: yes}\n" + P, "'yes' is ambiguous", 1, 26},
    {"booleans are lower-case true/false only", "training: {replay: {prioritized: True}}\n" + P, "key 'training.replay.prioritized' = 'True': expected true or false\n  hint: 'True' is ambiguous", 1, 34},
    {"a quoted boolean is a string", "spectral_norm: {enabled: \"true\"}\n" + P, "expected true or false, got a quoted string\n  hint: remove the quotes", 1, 26},
    {"gamma zero", "gamma: 0\n" + P, "key 'gamma' = '0': must be in (0, 1]", 1, 8},
    {"gamma above one", "gamma: 1.5\n" + P, "must be in (0, 1]", 1, 8},
    {"max_grad_norm zero", "max_grad_norm: 0\n" + P, "key 'max_grad_norm' = '0': must be > 0", 1, 16},
    {"number field given a word", "max_grad_norm: big\n" + P, "key 'max_grad_norm' = 'big': expected a number", 1, 16},
    {"infinite number", "max_grad_norm: .inf\n" + P, "expected a finite number", 1, 16},
    {"both target kinds", "target: {polyak: 0.01, period: 100}\n" + P, "key 'target.period' = '100': give either 'polyak'", 1, 24},
    {"no target kind", "target: {}\n" + P, "needs 'polyak' (e.g. 0.005) or 'period'", 1, 9},
    {"hard-copy period zero", "target: {period: 0}\n" + P, "key 'target.period' = '0': must be >= 1", 1, 18},
    {"polyak zero", "target: {polyak: 0}\n" + P, "must be in (0, 1]", 1, 18},
    {"zero learning rate", "optimizer: {adam: {lr: 0}}\n" + P, "key 'optimizer.adam.lr' = '0': must be > 0", 1, 24},
    {"one beta", "optimizer: {adam: {betas: [0.9]}}\n" + P, "expected two numbers [beta1, beta2]", 1, 27},
    {"beta2 of one", "optimizer: {adam: {betas: [0.9, 1.0]}}\n" + P, "key 'optimizer.adam.betas[1]' = '1.0': must be in [0, 1)", 1, 33},
    {"an optimizer we do not have", "optimizer: {sgd: {lr: 0.1}}\n" + P, "valid keys in 'optimizer': adam", 1, 13},
    {"no heads at all", "batch: 64\n", "key 'heads': missing: a pipeline needs at least one head", 1, 1},
    {"empty head list", "heads: []\n", "key 'heads' = '[]': needs at least one head", 1, 8},
    {"heads as a map", "heads: {plugin: c51}\n", "expected a list of heads, got a map", 1, 8},
    {"a head without a plugin", "heads:\n  - {role: primary}\n", "key 'heads[0].plugin': missing: every head names its plugin", 2, 5},
    {"plugin not found", "heads:\n  - plugin: c52\n    role: primary\n", "plugin 'c52' not found, did you mean 'c51'?\n  hint: plugins found: c51, iqn, ensemble, cql, probe, broken, cartpole, classic, reacher, mujoco (search path: /fake/plugins:/opt/dqn)", 2, 13},
    {"no primary", "heads: [{plugin: c51}, {plugin: iqn}]\n", "no primary head", 1, 8},
    {"two primaries", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: ensemble, role: primary}\n", "key 'heads[1].role' = 'primary': a second primary head (the first is heads[0] 'c51')", 3, 30},
    {"a plugin that cannot be primary", "heads: [{plugin: iqn, role: primary}]\n", "plugin 'iqn' cannot be the primary head", 1, 29},
    {"budgets leave the primary nothing", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: iqn, budget: 0.9}\n  - {plugin: ensemble, budget: 0.2}\n", "key 'heads[1].budget' = '0.9': auxiliary budgets sum to 1.1, leaving the primary 'c51' -0.1 (must be > 0)", 3, 27},
    {"budgets that sum to exactly one", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: iqn, budget: 0.5}\n  - {plugin: cql, budget: 0.5}\n", "auxiliary budgets sum to 1, leaving the primary 'c51' 0 (must be > 0)", 3, 27},
    {"budget of one", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: iqn, budget: 1}\n", "key 'heads[1].budget' = '1': must be in (0, 1)", 3, 27},
    {"a primary with a budget", "heads: [{plugin: c51, role: primary, budget: 0.5}]\n", "it has no budget of its own", 1, 46},
    {"a disabled primary", "heads: [{plugin: c51, role: primary, enabled: false}]\n", "the primary head cannot be disabled", 1, 47},
    {"two heads with one name", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: iqn}\n  - {plugin: iqn, quantiles: 8}\n", "key 'heads[2].plugin' = 'iqn': head name 'iqn' is already used by heads[1]", 4, 14},
    {"a head name that is not an identifier", "heads: [{plugin: c51, role: primary, name: \"my head\"}]\n", "key 'heads[0].name' = 'my head': a head name is a letter", 1, 44},
    {"head param misspelt", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: iqn, quantile: 8}\n", "key 'heads[1].quantile' = '8': unknown key for plugin 'iqn', did you mean 'quantiles'?", 3, 19},
    {"head param out of bounds", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: iqn, quantiles: 0}\n", "key 'heads[1].quantiles' = '0': must be in [1, 1024]", 3, 30},
    {"head number param given a word", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: iqn, kappa: abc}\n", "key 'heads[1].kappa' = 'abc': expected a number", 3, 26},
    {"head integer param given a fraction", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: ensemble, members: 0.5}\n", "key 'heads[1].members' = '0.5': expected an integer", 3, 33},
    {"a required head param missing", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: probe}\n", "key 'heads[1].level': missing: plugin 'probe' needs 'level'", 3, 5},
    {"a plugin whose default does not parse", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: broken}\n", "gives 'width' the default 'wide', which is not an integer", 3, 14},
    {"c51 as an auxiliary has no default budget", "heads:\n  - {plugin: c51, role: auxiliary}\n  - {plugin: c51, name: main, role: primary}\n", "plugin 'c51' has no default budget", 2, 25},
    {"replay smaller than a batch", "batch: 64\ntraining:\n  replay: {capacity: 32}\n" + P, "key 'training.replay.capacity' = '32': the replay holds 32 transitions, fewer than one batch (64)", 3, 22},
    {"unknown environment, near a known one", "training: {env: CartPole-v0}\n" + P, "key 'training.env' = 'CartPole-v0': unknown environment 'CartPole-v0', did you mean 'CartPole-v1'? (environments: cartpole (CartPole-v1), classic (Acrobot-v1, true), reacher (reacher), mujoco (humanoid_stand, reacher))", 1, 17},
    {"unknown environment, nothing close", "training:\n  env: MountainCar\n" + P, "key 'training.env' = 'MountainCar': unknown environment 'MountainCar' (environments: cartpole (CartPole-v1), classic (Acrobot-v1, true), reacher (reacher), mujoco (humanoid_stand, reacher))", 2, 8},
    {"a loss head named as the environment", "training: {env: iqn}\n" + P, "key 'training.env' = 'iqn': plugin 'iqn' is a loss head, not an environment", 1, 17},
    {"an environment plugin's unknown task", "training:\n  env: {plugin: classic, task: Acrobot}\n" + P, "key 'training.env.task' = 'Acrobot': plugin 'classic' has no task 'Acrobot', did you mean 'Acrobot-v1'? (its tasks: Acrobot-v1, true)", 2, 32},
    {"an unknown environment plugin", "training:\n  env: {plugin: gym}\n" + P, "key 'training.env.plugin' = 'gym': unknown environment plugin 'gym'", 2, 17},
    {"an environment map naming nothing", "training:\n  env: {max_episode_steps: 3}\n" + P, "key 'training.env' = '{max_episode_steps: 3}': names no environment", 2, 8},
    {"an environment option misspelt", "training:\n  env: {plugin: cartpole, max_steps: 3}\n" + P, "key 'training.env.max_steps' = '3': unknown key for task 'CartPole-v1'", 2, 38},
    {"an environment option out of range", "training:\n  env: {plugin: cartpole, max_episode_steps: 0}\n" + P, "key 'training.env.max_episode_steps' = '0': must be in [1, 1e+09]", 2, 46},
    {"an environment option of the wrong type", "training:\n  env: {plugin: cartpole, max_episode_steps: many}\n" + P, "key 'training.env.max_episode_steps' = 'many': expected an integer", 2, 46},
    {"an environment given as a list", "training:\n  env: [cartpole]\n" + P, "key 'training.env' = '[cartpole]': expected an environment's name or a map", 2, 8},
    {"replay smaller than a batch, capacity not written there", "batch: 100000000\n" + P, "key 'training.replay.capacity' = '100000': the replay holds 100000 transitions, fewer than one batch (100000000)", 1, 8},
    {"negative learning_starts", "training:\n  learning_starts: -1\n" + P, "key 'training.learning_starts' = '-1': must be >= 0", 2, 20},
    {"epsilon start above one", "training: {epsilon: {start: 1.5}}\n" + P, "key 'training.epsilon.start' = '1.5': must be in [0, 1]", 1, 29},
    {"num_envs zero", "training: {num_envs: 0}\n" + P, "key 'training.num_envs' = '0': must be >= 1", 1, 22},
    {"priority_eps zero", "training: {replay: {priority_eps: 0}}\n" + P, "must be > 0", 1, 35},
    {"unknown key in training, no suggestion", "training: {flavour: mint}\n" + P, "key 'training.flavour' = 'mint': unknown key\n", 1, 12},
    {"root is a list", "- a\n- b\n", "a pipeline is a map of keys", 1, 1},
    {"tabs for indentation", "batch: 1\n\tgamma: 0.9\n" + P, "YAML syntax error: illegal tab when looking for indentation\n  hint: indent with spaces", 2, 1},
    {"unclosed flow map", "network: {state: 4\n" + P, "YAML syntax error: end of map flow not found", 2, 6},
    {"two documents", P + "---\n" + P, "holds one YAML document", 2, 1},
    {"a stray comma first, on which yaml-cpp repeats an empty document forever", "# a comment\n,# note\n" + P, "YAML syntax error: the parser cannot read past this point", 2, 1},
    {"a recursive alias", "name: &a [*a]\n" + P, "nested deeper than 32 levels", 1, 7},
    {"name with a slash", "name: a/b\n" + P, "key 'name' = 'a/b': a pipeline name is non-empty and has no '/'", 1, 7},
    {"a cuda choice misspelt", "cuda:\n  gemm: tiles\n" + P, "key 'cuda.gemm' = 'tiles': expected one of auto, cublaslt, tile, tile16x32, tile32x32, tile64x64, did you mean 'tile'?", 2, 9},
    {"an unknown key under cuda", "cuda: {gem: cublaslt}\n" + P, "key 'cuda.gem' = 'cublaslt': unknown key, did you mean 'gemm'?\n  hint: valid keys in 'cuda': autotune, gemm, tile_loads, update_cluster, pdl", 1, 8},
    {"a cuda cluster size it does not have", "cuda: {update_cluster: 32}\n" + P, "key 'cuda.update_cluster' = '32': expected one of auto, 8, 16, off", 1, 24},
    {"cuda not a map", "cuda: cublaslt\n" + P, "key 'cuda' = 'cublaslt': expected a map\n  hint: keys here: autotune, gemm, tile_loads, update_cluster, pdl", 1, 7},
  };
  // clang-format on
  CHECK(rows.size() >= 30);
  for (const Bad& r : rows) {
    CAPTURE(r.reason);
    CAPTURE(r.text);
    auto errs = errors_of(r.text);
    INFO("errors: " << contains_msg(errs));
    REQUIRE(errs.size() == 1);
    std::string what = errs[0].what();
    CHECK(what.find(r.fragment) != std::string::npos);
    CHECK(errs[0].where().file == "t.yaml");
    CHECK(errs[0].where().line == r.line);
    CHECK(errs[0].where().column == r.column);
    // The position leads the message: file:line:column: ...
    CHECK(what.rfind("t.yaml:" + std::to_string(r.line) + ":" + std::to_string(r.column) + ": ", 0) == 0);
  }
}

TEST_CASE("pipeline.valid_table") {
  struct Good {
    const char* reason;
    std::string text;
    bool (*check)(const PipelineSpec&);
  };
  // clang-format off
  const std::vector<Good> rows = {
    {"a primary alone: every other key defaults", kPrimary, [](const PipelineSpec& s) {
       return s.name == "pipeline" && s.batch == 256 && s.network.trunk == std::vector<int>{256, 256} &&
              s.heads.size() == 1 && s.heads[0].name == "c51" && !s.backend_auto; }},
    {"ints where numbers are expected", "gamma: 1\nnetwork: {v_min: -10, v_max: 10}\n" + kPrimary, [](const PipelineSpec& s) {
       return s.gamma == 1.0 && s.network.v_min == -10.0 && s.network.v_max == 10.0; }},
    {"hard-copy target", "target: {period: 1000}\n" + kPrimary, [](const PipelineSpec& s) {
       return s.target.period == 1000; }},
    {"backend auto", "backend: auto\nprecision: bf16\n" + kPrimary, [](const PipelineSpec& s) {
       return s.backend_auto && s.precision == Precision::bf16; }},
    {"backend cuda", "backend: cuda\n" + kPrimary, [](const PipelineSpec& s) {
       return !s.backend_auto && s.backend == BackendKind::cuda; }},
    {"head params typed by the schema", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: iqn, quantiles: 64, kappa: 2}\n",
     [](const PipelineSpec& s) {
       return std::get<std::int64_t>(s.heads[1].params.at("quantiles")) == 64 &&
              std::get<double>(s.heads[1].params.at("kappa")) == 2.0 && s.heads[1].budget == 0.2; }},
    {"a disabled head may break the budget", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: iqn, budget: 0.9, enabled: false}\n  - {plugin: cql, budget: 0.5}\n",
     [](const PipelineSpec& s) { return !s.heads[1].enabled && resolved_budget(s, 0) == 0.5; }},
    {"booleans", "spectral_norm: {enabled: true}\ntraining: {replay: {prioritized: false}}\n" + kPrimary,
     [](const PipelineSpec& s) { return s.spectral_norm.enabled && !s.training.replay.prioritized; }},
    {"two instances of one plugin, named", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: cql, name: cql_small, alpha: 0.1, budget: 0.05}\n  - {plugin: cql}\n",
     [](const PipelineSpec& s) { return s.heads[1].name == "cql_small" && s.heads[2].name == "cql"; }},
    {"block style with comments and anchors", "# c\nnetwork: &net\n  state: 8   # S\n  trunk: [32]\nheads:\n  - plugin: c51\n    role: primary\n",
     [](const PipelineSpec& s) { return s.network.state == 8 && s.network.trunk == std::vector<int>{32}; }},
    {"strings: quoted, numeric-looking, empty", "name: \"123\"\ntraining: {env: 'CartPole-v1', out_dir: \"\"}\n" + kPrimary,
     [](const PipelineSpec& s) { return s.name == "123" && s.training.out_dir.empty(); }},
    {"a required param given, string and bool params", "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: probe, level: 3, mode: max, verbose: true}\n",
     [](const PipelineSpec& s) {
       return std::get<std::string>(s.heads[1].params.at("mode")) == "max" &&
              std::get<bool>(s.heads[1].params.at("verbose")) && s.heads[1].budget == 0.05; }},
    {"the primary need not come first", "heads:\n  - {plugin: iqn}\n  - {plugin: c51, role: primary}\n",
     [](const PipelineSpec& s) { return s.primary().plugin == "c51" && resolved_budget(s, 1) == doctest::Approx(0.8); }},
    {"empty document sections are absent: defaults", "training: {}\n" + kPrimary,
     [](const PipelineSpec& s) { return s.training.env.plugin == "cartpole" && s.training.env.task == "CartPole-v1"; }},
    {"an environment by its plugin's name, options beside it", "training: {env: {plugin: cartpole, max_episode_steps: 9}}\n" + kPrimary,
     [](const PipelineSpec& s) { return s.training.env.task == "CartPole-v1" && std::get<std::int64_t>(s.training.env.options.at("max_episode_steps")) == 9; }},
    {"a task found in its plugin", "training: {env: Acrobot-v1}\n" + kPrimary,
     [](const PipelineSpec& s) { return s.training.env.plugin == "classic" && s.training.env.task == "Acrobot-v1"; }},
    {"offline with no environment named: none", "training: {dataset: d.safetensors}\n" + kPrimary,
     [](const PipelineSpec& s) { return s.training.env.none(); }},
    {"offline evaluating on an environment", "training: {dataset: d.safetensors, env: CartPole-v1}\n" + kPrimary,
     [](const PipelineSpec& s) { return s.training.env.task == "CartPole-v1"; }},
    {"an empty name: no environment", "training: {env: \"\"}\n" + kPrimary,
     [](const PipelineSpec& s) { return s.training.env.none(); }},
  };
  // clang-format on
  for (const Good& r : rows) {
    CAPTURE(r.reason);
    PipelineSpec s;
    try {
      s = parse(r.text);
    } catch (const PipelineErrors& e) {
      FAIL_CHECK(e.what());
      continue;
    }
    CHECK(r.check(s));
    CHECK(s.source.empty());
  }
}

TEST_CASE("pipeline.files") {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(source_dir()) / "pipelines";
  REQUIRE(fs::is_directory(dir));
  int n = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    CAPTURE(entry.path().string());
    ++n;
    try {
      PipelineSpec s = load_pipeline(entry.path().string(), with_catalog());
      CHECK(s.source == entry.path().string());
      check_same(s, parse_pipeline(to_yaml(s), "again.yaml", with_catalog()));
    } catch (const PipelineErrors& e) {
      FAIL_CHECK(e.what());
    }
  }
  CHECK(n >= 3);

  PipelineSpec d = load_pipeline((dir / "default.yaml").string(), with_catalog());
  CHECK(d.network.state == 4);
  CHECK(d.network.trunk == std::vector<int>{64, 64});
  CHECK(d.network.head_hidden == 32);
  CHECK(d.network.branches == 1);
  CHECK(d.network.actions == 2);
  CHECK(d.network.atoms == 51);
  CHECK(d.network.v_min == 0.0);
  CHECK(d.network.v_max == 100.0);
  CHECK(d.backend_auto);
  CHECK(d.precision == Precision::fp32);
  CHECK(d.batch == 64);
  CHECK(d.gamma == 0.99);
  CHECK(d.n_step == 3);
  CHECK(d.adam.lr == 2e-3);
  CHECK(d.target.polyak == 0.01);
  CHECK(d.target.period == 0);
  CHECK(!d.spectral_norm.enabled);
  CHECK(d.report_every == 50);
  CHECK(d.training.env.task == "CartPole-v1");
  CHECK(d.training.env.plugin == "cartpole");
  CHECK(d.training.num_envs == 8);
  CHECK(d.training.total_steps == 50000);
  CHECK(d.training.learning_starts == 1000);
  CHECK(d.training.train_every == 2);
  CHECK(d.training.epsilon.start == 1.0);
  CHECK(d.training.epsilon.end == 0.02);
  CHECK(d.training.epsilon.decay_steps == 10000);
  CHECK(d.training.replay.capacity == 50000);
  CHECK(!d.training.replay.prioritized);
  CHECK(d.training.eval.every == 2000);
  CHECK(d.training.eval.episodes == 20);
  CHECK(d.training.stop_at_return == 475.0);
  REQUIRE(d.heads.size() == 1);
  CHECK(d.primary().plugin == "c51");

  for (const char* f : {"c51.yaml", "ref.yaml"}) {
    CAPTURE(f);
    PipelineSpec s = load_pipeline((dir / f).string(), with_catalog());
    CHECK(s.network.state == 64);
    CHECK(s.network.trunk == std::vector<int>{256, 256});
    CHECK(s.network.head_hidden == 128);
    CHECK(s.network.branches == 3);
    CHECK(s.network.actions == 5);
    CHECK(s.network.atoms == 51);
    CHECK(s.network.v_min == -10.0);
    CHECK(s.network.v_max == 10.0);
    CHECK(s.batch == 256);
    CHECK(s.backend_auto);
    CHECK(s.precision == Precision::tf32);
    REQUIRE(!s.heads.empty());  // ref.yaml also lists every auxiliary, disabled
    for (std::size_t h = 1; h < s.heads.size(); ++h) CHECK_FALSE(s.heads[h].enabled);
    CHECK(s.heads[0].plugin == "c51");
    CHECK(s.heads[0].role == Role::primary);
    CHECK(resolved_budget(s, 0) == 1.0);
  }
  CHECK(load_pipeline((dir / "ref.yaml").string()).name == "ref");

  // A file that is not there: the path leads the message.
  try {
    load_pipeline((dir / "no-such.yaml").string());
    FAIL("loaded a missing file");
  } catch (const PipelineErrors& e) {
    CHECK(std::string(e.what()).find("no-such.yaml: cannot read the pipeline file") != std::string::npos);
  }
}

TEST_CASE("pipeline.budgets") {
  SUBCASE("a primary alone gets everything") {
    PipelineSpec s = parse(kPrimary);
    CHECK(resolved_budget(s, 0) == 1.0);
  }
  SUBCASE("iqn 0.2 and cql 0.1 by default leave the primary 0.7") {
    PipelineSpec s = parse("heads: [{plugin: c51, role: primary}, {plugin: iqn}, {plugin: cql}]\n");
    CHECK(resolved_budget(s, 0) == doctest::Approx(0.7));
    CHECK(resolved_budget(s, 1) == 0.2);
    CHECK(resolved_budget(s, 2) == 0.1);
  }
  SUBCASE("a written budget beats the plugin's default") {
    PipelineSpec s = parse("heads: [{plugin: c51, role: primary}, {plugin: iqn, budget: 0.35}]\n");
    CHECK(resolved_budget(s, 1) == 0.35);
    CHECK(resolved_budget(s, 0) == doctest::Approx(0.65));
  }
  SUBCASE("disabled heads take nothing") {
    PipelineSpec s = parse(
        "heads: [{plugin: c51, role: primary}, {plugin: iqn, enabled: false}, {plugin: cql}]\n");
    CHECK(resolved_budget(s, 1) == 0.0);
    CHECK(resolved_budget(s, 0) == doctest::Approx(0.9));
    s = parse("heads: [{plugin: c51, role: primary}, {plugin: iqn, enabled: false}]\n");
    CHECK(resolved_budget(s, 0) == 1.0);
  }
  SUBCASE("without a catalog, a default budget is unknown") {
    PipelineSpec s = parse("heads: [{plugin: c51, role: primary}, {plugin: iqn}]\n", ParseOptions{});
    CHECK(s.heads[1].budget < 0);
    CHECK_THROWS_AS(resolved_budget(s, 0), std::invalid_argument);
    CHECK_THROWS_AS(resolved_budget(s, 1), std::invalid_argument);
    // Written budgets are still checked without a catalog.
    auto errs = errors_of("heads: [{plugin: c51, role: primary}, {plugin: iqn, budget: 0.6}, {plugin: x, budget: 0.6}]\n",
                          ParseOptions{});
    REQUIRE(errs.size() == 1);
    CHECK(errs[0].why().find("sum to 1.2") != std::string::npos);
  }
  SUBCASE("bad index") {
    PipelineSpec s = parse(kPrimary);
    CHECK_THROWS_AS(resolved_budget(s, 1), std::out_of_range);
  }
}

TEST_CASE("pipeline.overrides") {
  const std::string base =
      "batch: 64\n"
      "network: {state: 4, trunk: [256, 256]}\n"
      "heads:\n"
      "  - {plugin: c51, role: primary}\n"
      "  - {plugin: iqn, budget: 0.2}\n";

  SUBCASE("valid: scalars, flow lists, by index, by head name, new sections") {
    PipelineSpec s = parse(base, with_catalog({"batch=32", "network.trunk=[64, 64, 32]",
                                               "heads.1.budget=0.3", "heads.iqn.quantiles=16",
                                               "training.replay.capacity=1000",
                                               "heads.c51.enabled=true"}));
    CHECK(s.batch == 32);
    CHECK(s.network.trunk == std::vector<int>{64, 64, 32});
    CHECK(s.heads[1].budget == 0.3);
    CHECK(std::get<std::int64_t>(s.heads[1].params.at("quantiles")) == 16);
    CHECK(s.training.replay.capacity == 1000);
    CHECK(s.heads[1].budget_loc.str() == "<override 'heads.1.budget=0.3'>");
    // The file's own value was replaced, not duplicated.
    CHECK(parse(base, with_catalog({"heads.iqn.budget=0.45"})).heads[1].budget == 0.45);
  }
  SUBCASE("later overrides win; one past the end appends a head") {
    PipelineSpec s = parse(base, with_catalog({"batch=16", "batch=8", "heads.2.plugin=cql",
                                               "heads.2.budget=0.05"}));
    CHECK(s.batch == 8);
    REQUIRE(s.heads.size() == 3);
    CHECK(s.heads[2].plugin == "cql");
    CHECK(resolved_budget(s, 0) == doctest::Approx(0.75));
  }
  SUBCASE("an unknown key: the override is the location, with did-you-mean") {
    auto errs = errors_of(base, with_catalog({"netwrk.state=8"}));
    REQUIRE(errs.size() == 1);
    CHECK(std::string(errs[0].what()).rfind("<override 'netwrk.state=8'>: key 'netwrk'", 0) == 0);
    CHECK(errs[0].why().find("did you mean 'network'?") != std::string::npos);
    CHECK(errs[0].hint().find("valid keys at the top level: name, seed") != std::string::npos);
  }
  SUBCASE("an unknown head param, addressed by name") {
    auto errs = errors_of(base, with_catalog({"heads.iqn.quantile=8"}));
    REQUIRE(errs.size() == 1);
    CHECK(errs[0].where().str() == "<override 'heads.iqn.quantile=8'>");
    CHECK(errs[0].key() == "heads[1].quantile");
    CHECK(errs[0].why().find("did you mean 'quantiles'?") != std::string::npos);
  }
  SUBCASE("an invalid value is validated like the file's") {
    auto errs = errors_of(base, with_catalog({"batch=abc"}));
    REQUIRE(errs.size() == 1);
    CHECK(std::string(errs[0].what()) ==
          "<override 'batch=abc'>: key 'batch' = 'abc': expected an integer");
    // 0.9 alone leaves the primary 0.1: fine; the bad quantiles is the one error.
    errs = errors_of(base, with_catalog({"heads.1.budget=0.9", "heads.iqn.quantiles=0"}));
    REQUIRE(errs.size() == 1);
    CHECK(std::string(errs[0].what()) ==
          "<override 'heads.iqn.quantiles=0'>: key 'heads[1].quantiles' = '0': must be in [1, 1024]");
  }
  SUBCASE("budget sum through an override") {
    auto errs = errors_of(base, with_catalog({"heads.iqn.budget=0.95", "heads.2.plugin=cql"}));
    REQUIRE(errs.size() == 1);
    CHECK(errs[0].where().file == "<override 'heads.iqn.budget=0.95'>");
    CHECK(errs[0].why() == "auxiliary budgets sum to 1.05, leaving the primary 'c51' -0.05 (must be > 0)");
  }
  SUBCASE("paths that lead nowhere") {
    struct Row {
      const char* text;
      const char* fragment;
    };
    const std::vector<Row> rows = {
        {"heads.dqn.budget=0.1", "no element of 'heads' is named 'dqn'"},
        {"heads.iq.budget=0.1", "did you mean 'iqn'?"},
        {"heads.5.budget=0.1", "index 5 is past the end of 'heads' (2 elements)"},
        {"batch.size=3", "'batch' is a single value (64), so it has no key 'size'"},
        {"network.trunk=[64,", "not a YAML value"},
        {"batch", "an override is key.path=value"},
        {"=3", "an override is key.path=value"},
        {"network..state=3", "empty part in the key path"},
    };
    for (const Row& r : rows) {
      CAPTURE(r.text);
      auto errs = errors_of(base, with_catalog({r.text}));
      REQUIRE(errs.size() == 1);
      CHECK(errs[0].where().file == std::string("<override '") + r.text + "'>");
      CHECK(std::string(errs[0].what()).find(r.fragment) != std::string::npos);
    }
  }
  SUBCASE("file errors and override errors in one pass, file first") {
    auto errs = errors_of("gamma: 2\n" + base, with_catalog({"batch=0"}));
    REQUIRE(errs.size() == 2);
    CHECK(errs[0].key() == "gamma");
    CHECK(errs[0].where().line == 1);
    CHECK(errs[1].key() == "batch");
    CHECK(errs[1].where().file == "<override 'batch=0'>");
  }
}

TEST_CASE("pipeline.duplicate_keys") {
  // yaml-cpp keeps both and a lookup sees one: every map is walked, even ones nobody reads.
  auto errs = errors_of("name: a\nseed: 1\nname: b\n" + kPrimary);
  REQUIRE(errs.size() == 1);
  CHECK(std::string(errs[0].what()) ==
        "t.yaml:3:1: key 'name' = 'b': duplicate key 'name' (first given at t.yaml:1:1)\n"
        "  hint: a YAML map keeps one value per key; remove one of them");
  errs = errors_of("heads:\n  - plugin: c51\n    role: primary\n  - plugin: iqn\n    quantiles: 8\n    quantiles: 16\n");
  REQUIRE(errs.size() == 1);
  CHECK(errs[0].key() == "heads[1].quantiles");
  CHECK(errs[0].where().line == 6);
  CHECK(errs[0].where().column == 5);
  errs = errors_of("bogus: {x: 1, x: 2}\n" + kPrimary);  // inside an unknown key: both reported
  CHECK(errs.size() == 2);
}

TEST_CASE("pipeline.many_errors_one_pass") {
  auto errs = errors_of(
      "batch: 0\n"
      "gamma: 3\n"
      "network: {trunk: [64, -1], atoms: 1}\n"
      "heads: [{plugin: c51}, {plugin: nope}]\n");
  // batch, gamma, trunk[1], atoms, plugin not found, no primary
  REQUIRE(errs.size() == 6);
  for (std::size_t i = 1; i < errs.size(); ++i) {
    CAPTURE(i);
    CHECK(std::make_pair(errs[i - 1].where().line, errs[i - 1].where().column) <=
          std::make_pair(errs[i].where().line, errs[i].where().column));
  }
  std::string all = contains_msg(errs);
  CHECK(all.find("t.yaml:1:8: key 'batch'") != std::string::npos);
  CHECK(all.find("t.yaml:2:8: key 'gamma'") != std::string::npos);
  CHECK(all.find("t.yaml:3:23: key 'network.trunk[1]' = '-1'") != std::string::npos);
  CHECK(all.find("t.yaml:3:35: key 'network.atoms'") != std::string::npos);
  CHECK(all.find("plugin 'nope' not found") != std::string::npos);
  CHECK(all.find("no primary head") != std::string::npos);
}

TEST_CASE("pipeline.to_yaml_round_trip") {
  const std::string text =
      "name: rt\nseed: 7\nbackend: cuda\nprecision: bf16\n"
      "network: {state: 8, trunk: [32, 16, 8], head_hidden: 24, branches: 2, actions: 3, atoms: 11,"
      " v_min: -2.5, v_max: 7}\n"
      "heads:\n"
      "  - {plugin: c51, role: primary, name: main}\n"
      "  - {plugin: iqn, budget: 0.15, quantiles: 8, kappa: 1}\n"
      "  - {plugin: cql, enabled: false, alpha: 0.3}\n"
      "  - {plugin: probe, level: 2, mode: \"a \\\"b\\\": c\\n\", verbose: true}\n"
      "max_grad_norm: 0.5\n"
      "optimizer: {adam: {lr: 3.0e-4, betas: [0.8, 0.95], eps: 1.0e-6}}\n"
      "spectral_norm: {enabled: true, sigma_max: 1.5}\n"
      "target: {period: 250}\n"
      "batch: 33\ngamma: 0.9\nn_step: 5\nreport_every: 7\n"
      "training: {env: Acrobot-v1, num_envs: 3, total_steps: 123, learning_starts: 40,"
      " train_every: 2, gradient_steps: 3, epsilon: {start: 0.9, end: 0.1, decay_steps: 77},"
      " replay: {capacity: 500, prioritized: true, alpha: 0.7, beta_start: 0.3, beta_end: 0.9,"
      " priority_eps: 1.0e-5}, eval: {every: 99, episodes: 4}, stop_at_return: -120.5,"
      " out_dir: runs/x}\n";

  SUBCASE("with the catalog") {
    PipelineSpec a = parse(text);
    std::string y = to_yaml(a);
    CAPTURE(y);
    PipelineSpec b = parse_pipeline(y, "to_yaml", with_catalog());
    check_same(a, b);
    CHECK(to_yaml(b) == y);
    CHECK(std::get<std::string>(b.heads[3].params.at("mode")) == "a \"b\": c\n");
    CHECK(y.find("# budget: what the enabled auxiliaries leave (0.8)") != std::string::npos);
    CHECK(y.find("period: 250") != std::string::npos);
    CHECK(y.find("polyak") == std::string::npos);  // exactly one target kind
  }
  SUBCASE("without a catalog: params keep their written types") {
    PipelineSpec a = parse(text, ParseOptions{});
    CHECK(std::holds_alternative<std::int64_t>(a.heads[1].params.at("kappa")));  // as written
    PipelineSpec b = parse_pipeline(to_yaml(a), "to_yaml", ParseOptions{});
    check_same(a, b);
  }
  SUBCASE("with the catalog, every schema key and default is written") {
    PipelineSpec a = parse(text);
    std::string y = to_yaml(a, kCatalog);
    CAPTURE(y);
    CHECK(y.find("target_quantiles: 32  # target quantile samples N'") != std::string::npos);
    CHECK(y.find("kappa: 1.0") != std::string::npos);
    PipelineSpec b = parse_pipeline(y, "to_yaml", with_catalog());
    CHECK(std::get<std::int64_t>(b.heads[1].params.at("embed")) == 64);
    CHECK(b.heads[1].params.size() == 4);
    CHECK(b.heads[1].budget == a.heads[1].budget);
    CHECK(to_yaml(b, kCatalog) == y);
  }
  SUBCASE("doubles that need every digit, and odd strings") {
    PipelineSpec a = parse(kPrimary);
    a.adam.lr = 0.1 + 0.2;  // 0.30000000000000004
    a.gamma = 1.0 / 3.0;
    a.network.v_min = -1e-300;
    a.name = "it's: #not a comment";
    a.training.env = EnvChoice{"classic", "true", {}, {}, {}};  // a task that must stay a string
    a.training.out_dir = "tab\there";
    PipelineSpec b = parse_pipeline(to_yaml(a), "to_yaml", with_catalog());
    check_same(a, b);
  }
}

TEST_CASE("pipeline.cuda") {
  SUBCASE("left out: the CudaSpec defaults, written back in full") {
    PipelineSpec s = parse(kPrimary);
    CHECK(s.cuda == CudaSpec{});
    CHECK(to_yaml(s).find("cuda:\n  autotune: true\n  gemm: auto\n  tile_loads: auto\n  update_cluster: auto\n"
                          "  pdl: auto\n") != std::string::npos);
  }
  SUBCASE("overrides reach every key and round-trip through to_yaml") {
    PipelineSpec a = parse(kPrimary, with_catalog({"cuda.gemm=cublaslt", "cuda.autotune=false",
                                                   "cuda.tile_loads=ldmatrix", "cuda.update_cluster=off",
                                                   "cuda.pdl=small"}));
    CHECK(a.cuda.gemm == CudaSpec::Gemm::cublaslt);
    CHECK_FALSE(a.cuda.autotune);
    CHECK(a.cuda.tile_loads == CudaSpec::TileLoads::ldmatrix);
    CHECK(a.cuda.update_cluster == -1);
    CHECK(a.cuda.pdl == CudaSpec::Pdl::small);
    const std::string y = to_yaml(a);
    CAPTURE(y);
    CHECK(y.find("cuda:\n  autotune: false\n  gemm: cublaslt\n  tile_loads: ldmatrix\n  update_cluster: off\n"
                 "  pdl: small\n") != std::string::npos);
    PipelineSpec b = parse_pipeline(y, "to_yaml", with_catalog());
    check_same(a, b);
    CHECK(to_yaml(b) == y);
  }
  SUBCASE("every choice, from a file, reads as its value") {
    const std::vector<std::pair<std::string, CudaSpec::Gemm>> gemms = {
        {"auto", CudaSpec::Gemm::automatic}, {"cublaslt", CudaSpec::Gemm::cublaslt},
        {"tile", CudaSpec::Gemm::tile},       {"tile16x32", CudaSpec::Gemm::tile16x32},
        {"tile32x32", CudaSpec::Gemm::tile32x32}, {"tile64x64", CudaSpec::Gemm::tile64x64}};
    for (const auto& [text, gemm] : gemms) {
      CAPTURE(text);
      CHECK(parse("cuda: {gemm: " + text + "}\n" + kPrimary).cuda.gemm == gemm);
    }
    const std::vector<std::pair<std::string, int>> clusters = {{"auto", 0}, {"8", 8}, {"16", 16}, {"off", -1}};
    for (const auto& [text, blocks] : clusters) {
      CAPTURE(text);
      PipelineSpec s = parse("cuda:\n  update_cluster: " + text + "\n" + kPrimary);
      CHECK(s.cuda.update_cluster == blocks);
      CHECK(update_cluster_text(s.cuda.update_cluster) == text);
    }
    CHECK(parse("cuda: {tile_loads: plain, pdl: all}\n" + kPrimary).cuda.tile_loads == CudaSpec::TileLoads::plain);
    CHECK(parse("cuda: {pdl: \"off\"}\n" + kPrimary).cuda.pdl == CudaSpec::Pdl::off);
  }
  SUBCASE("a bad value in a file: where, which key, what value, the choices and the closest") {
    const PipelineError e = only_error("name: x\ncuda:\n  autotune: true\n  gemm: tiles\n" + kPrimary);
    CHECK(std::string(e.what()) ==
          "t.yaml:4:9: key 'cuda.gemm' = 'tiles': expected one of auto, cublaslt, tile, tile16x32, tile32x32, "
          "tile64x64, did you mean 'tile'?");
    CHECK(e.key() == "cuda.gemm");
    CHECK(e.value() == "tiles");
  }
  SUBCASE("a bad value through an override") {
    CHECK(std::string(only_error(kPrimary, with_catalog({"cuda.pdl=smal"})).what()) ==
          "<override 'cuda.pdl=smal'>: key 'cuda.pdl' = 'smal': expected one of auto, small, all, off, "
          "did you mean 'small'?");
    CHECK(only_error(kPrimary, with_catalog({"cuda.autotune=yes"})).hint().find("'yes' is ambiguous") !=
          std::string::npos);
  }
  SUBCASE("an unknown key under cuda lists the valid ones") {
    CHECK(std::string(only_error("cuda:\n  graphs: true\n" + kPrimary).what()) ==
          "t.yaml:2:3: key 'cuda.graphs' = 'true': unknown key\n"
          "  hint: valid keys in 'cuda': autotune, gemm, tile_loads, update_cluster, pdl");
    const PipelineError e = only_error(kPrimary, with_catalog({"cuda.tile_load=plain"}));
    CHECK(e.where().str() == "<override 'cuda.tile_load=plain'>");
    CHECK(e.why() == "unknown key, did you mean 'tile_loads'?");
  }
}

TEST_CASE("pipeline.schema") {
  // Every value key: reachable as an override with its default's text, which reads back as the
  // default (the table's get, set and text agree), and written by to_yaml.
  const PipelineSpec defaults = parse(kPrimary);
  const std::string written = to_yaml(defaults);
  int value_keys = 0;
  for (const PipelineKey& k : pipeline_keys()) {
    CAPTURE(k.path);
    if (k.type == PipelineKey::Type::section || k.type == PipelineKey::Type::heads) continue;
    if (k.type == PipelineKey::Type::env) {  // a map, written and read back as one
      CHECK(written.find("  env:\n    plugin: \"cartpole\"\n    task: \"CartPole-v1\"\n") != std::string::npos);
      check_same(parse(kPrimary, with_catalog({"training.env={plugin: cartpole, task: CartPole-v1}"})), defaults);
      continue;
    }
    ++value_keys;
    CHECK(!k.meaning.empty());
    if (k.written && !k.written(defaults)) {  // target.period: 0 is the Polyak update, not a period
      CHECK(written.find(" " + k.name() + ":") == std::string::npos);
      continue;
    }
    CHECK(written.find(k.name() + ": " + default_text(k) + "\n") != std::string::npos);
    PipelineSpec s = parse(kPrimary, with_catalog({k.path + "=" + default_text(k)}));
    check_same(s, defaults);
  }
  CHECK(value_keys >= 40);
  // The sections' keys, as the unknown-key hints list them, come from the table.
  CHECK(join_keys(child_names("network")) == "state, trunk, head_hidden, branches, actions, atoms, v_min, v_max");
  CHECK(head_key_names() == std::vector<std::string>{"plugin", "name", "role", "budget", "enabled"});
}

TEST_CASE("pipeline.reference") {
  // The reference renders the table (every value key a row), the head keys and each plugin's params.
  const std::string doc = pipeline_reference(kCatalog);
  CAPTURE(doc);
  for (const PipelineKey& k : pipeline_keys()) {
    CAPTURE(k.path);
    if (k.type == PipelineKey::Type::section || k.type == PipelineKey::Type::heads)
      CHECK(doc.find("## `" + k.path + "`\n\n" + k.meaning + "\n") != std::string::npos);
    else
      CHECK(doc.find("| `" + k.path + "` | " + type_name(k.type) + " | ") != std::string::npos);
  }
  for (const std::string& name : head_key_names()) CHECK(doc.find("| `" + name + "` | ") != std::string::npos);
  CHECK(doc.find("| `cuda.gemm` | choice | `auto` | `auto`, `cublaslt`, `tile`, `tile16x32`, `tile32x32`, "
                 "`tile64x64` | ") != std::string::npos);
  CHECK(doc.find("The CPU backend ignores this section.") != std::string::npos);
  CHECK(doc.find("| `network.trunk` | list of integers | `[256, 256]` | 1 to 8 layers, each >= 1 | ") !=
        std::string::npos);
  CHECK(doc.find("| `training.out_dir` | string | `\"\"` | ") != std::string::npos);
  // Plugins by name, each with its params (a required one said so), or none.
  CHECK(doc.find("### `broken`") < doc.find("### `c51`"));
  CHECK(doc.find("### `c51`\n\nfake\n\nRoles: primary or auxiliary.\n\nNo params.\n") != std::string::npos);
  CHECK(doc.find("Roles: auxiliary only; default budget 0.2.") != std::string::npos);
  CHECK(doc.find("| `quantiles` | integer | `32` | in [1, 1024] | online quantile samples N |") != std::string::npos);
  CHECK(doc.find("| `level` | integer | (required) | in [0, 9] | required: probe level |") != std::string::npos);
  CHECK(doc.back() == '\n');
  CHECK(doc.find("\n\n\n") == std::string::npos);
}

TEST_CASE("pipeline.resolve_head_params") {
  PipelineSpec s = parse(
      "heads:\n  - {plugin: c51, role: primary}\n  - {plugin: iqn, quantiles: 8, kappa: 2}\n"
      "  - {plugin: probe, level: 4}\n");
  std::vector<std::string> storage;
  std::vector<ParamValue> v = resolve_head_params(s.heads[1], kIqn, storage);
  REQUIRE(v.size() == 4);
  CHECK(std::string(v[0].key) == "quantiles");
  CHECK(v[0].type == ParamType::integer);
  CHECK(v[0].i == 8);
  CHECK(std::string(v[1].key) == "target_quantiles");
  CHECK(v[1].i == 32);  // default
  CHECK(v[2].i == 64);
  CHECK(v[3].type == ParamType::number);
  CHECK(v[3].d == 2.0);
  CHECK(std::string(v[3].s) == "2.0");

  std::vector<std::string> storage2;
  v = resolve_head_params(s.heads[2], kProbe, storage2);
  REQUIRE(v.size() == 3);
  CHECK(std::string(v[0].s) == "mean");  // the default, unquoted
  CHECK(v[1].type == ParamType::boolean);
  CHECK(v[1].i == 0);
  CHECK(v[2].i == 4);

  CHECK(resolve_head_params(s.heads[0], kC51, storage).empty());

  // Parsed without a catalog, then resolved: the same checks apply.
  PipelineSpec loose = parse(
      "heads: [{plugin: c51, role: primary}, {plugin: iqn, quantiles: 4096, quantile: 3, kappa: 1}]\n",
      ParseOptions{});
  try {
    resolve_head_params(loose.heads[1], kIqn, storage);
    FAIL("resolved an out-of-bounds and an unknown param");
  } catch (const PipelineErrors& e) {
    REQUIRE(e.errors().size() == 2);
    std::string all = e.what();
    CHECK(all.find("key 'heads.iqn.quantile' = '3': unknown key for plugin 'iqn', did you mean 'quantiles'?") != std::string::npos);
    CHECK(all.find("key 'heads.iqn.quantiles' = '4096': must be in [1, 1024]") != std::string::npos);
  }
  HeadSpec h = loose.heads[1];
  h.params.erase("quantile");
  h.params["quantiles"] = std::int64_t{16};
  v = resolve_head_params(h, kIqn, storage);
  CHECK(v[3].d == 1.0);  // an integer given for a number
  h.params["embed"] = std::string("big");
  CHECK_THROWS_AS(resolve_head_params(h, kIqn, storage), PipelineErrors);
  HeadSpec probe;
  probe.name = probe.plugin = "probe";
  CHECK_THROWS_WITH_AS(resolve_head_params(probe, kProbe, storage),
                       doctest::Contains("missing: the plugin needs this param"), PipelineErrors);
}

TEST_CASE("pipeline.no_catalog") {
  // Without a catalog plugin names and head params go unchecked, but types are inferred.
  PipelineSpec s = parse(
      "heads: [{plugin: anything, role: primary, x: 1, y: 1.5, z: true, w: hello, v: \"7\"}]\n",
      ParseOptions{});
  const auto& p = s.heads[0].params;
  CHECK(std::get<std::int64_t>(p.at("x")) == 1);
  CHECK(std::get<double>(p.at("y")) == 1.5);
  CHECK(std::get<bool>(p.at("z")));
  CHECK(std::get<std::string>(p.at("w")) == "hello");
  CHECK(std::get<std::string>(p.at("v")) == "7");
  CHECK(s.heads[0].param_locs.at("y").column == 52);
  auto errs = errors_of("heads: [{plugin: c51, role: primary, x: [1, 2]}]\n", ParseOptions{});
  REQUIRE(errs.size() == 1);
  CHECK(errs[0].why().find("a head param is one value") != std::string::npos);
}

TEST_CASE("pipeline.bounded_input") {
  // Aliases that repeat aliases: 9 lines that would expand to 10^9 values.
  std::string bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 10; ++i) {
    const std::string p = "*a" + std::to_string(i - 1);
    bomb += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [" + p;
    for (int k = 1; k < 10; ++k) bomb += ", " + p;
    bomb += "]\n";
  }
  auto errs = errors_of(bomb + kPrimary);
  REQUIRE(errs.size() == 1);
  CHECK(contains_msg(errs).find("the document expands to more than 100000 values (aliases that repeat aliases?)") !=
        std::string::npos);
  CHECK(errs[0].where().file == "t.yaml");
  CHECK(errs[0].where().line >= 1);  // (an aliased value is placed at its anchor)
  // A quoted value left open at the end of the file (with or without a last newline).
  for (const std::string& open : {std::string("seed: 1\nname: 'abc"), std::string("seed: 1\nname: \"abc\n")}) {
    CAPTURE(open);
    errs = errors_of(open + "\n" + kPrimary);
    CHECK(contains_msg(errors_of(open)).find("YAML syntax error") != std::string::npos);
  }
  // A text or an override value beyond any pipeline's size.
  errs = errors_of(std::string((std::size_t(1) << 20) + 1, '#'));
  REQUIRE(errs.size() == 1);
  CHECK(contains_msg(errs).find("the text is 1048577 bytes; a pipeline is at most 1048576") != std::string::npos);
  ParseOptions o = with_catalog();
  o.overrides = {"name=" + std::string(70000, 'x')};
  errs = errors_of(kPrimary, o);
  REQUIRE(errs.size() == 1);
  CHECK(contains_msg(errs).find("the value is 70000 bytes; an override value is at most 65536") != std::string::npos);
  // 80,000 keys under one map (an unknown key: each walked once) and a duplicate among them.
  std::string many = kPrimary + "bogus:\n";
  for (int i = 0; i < 80000; ++i) many += "  k" + std::to_string(i) + ": 1\n";
  many += "  k7: 2\n";
  errs = errors_of(many);
  const std::string msgs = contains_msg(errs);
  CHECK(msgs.find("duplicate key 'k7'") != std::string::npos);
  CHECK(msgs.find("unknown key") != std::string::npos);
}

TEST_CASE("pipeline.files_that_are_not_pipelines") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dqn-pipeline-files-" + std::to_string(getpid()));
  fs::create_directories(dir);
  auto error_of = [](const std::string& path) {
    try {
      load_pipeline(path, with_catalog());
    } catch (const PipelineErrors& e) {
      return std::string(e.errors().at(0).what());
    }
    return std::string("accepted");
  };
  // [path, what the error says, why]
  const std::string fifo = (dir / "fifo.yaml").string();
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);  // would block a reader forever
  const std::string big = (dir / "big.yaml").string();
  {
    std::ofstream(big) << "name: x\n";
    fs::resize_file(big, std::uintmax_t(100) << 20);  // 100 MB
  }
  struct Case { std::string path, says, why; };
  const Case cases[] = {
      {fifo, "not a regular file (a FIFO)", "a FIFO"},
      {"/dev/zero", "not a regular file (a device)", "an endless device"},
      {dir.string(), "not a regular file (a directory)", "a directory"},
      {big, "the file is 104857600 bytes; a pipeline is at most 1048576", "100 MB"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.why);
    const std::string what = error_of(c.path);
    CHECK_MESSAGE(what.find(c.says) != std::string::npos, what);
    CHECK(what.rfind(c.path + ":", 0) == 0);  // the error names the file
  }
  fs::remove_all(dir);
}

TEST_CASE("pipeline.network_fits_its_environment") {
  // With the environments given (as dqn train and dqn collect give them), the network must fit
  // training.env, each misfit at its network key; without them nothing is checked.
  ParseOptions o = with_catalog();
  o.environments = [](const EnvChoice& e) {
    EnvProbe p;
    p.found = e.task == "CartPole-v1" || e.task == "Acrobot-v1";
    if (e.task == "CartPole-v1") p.shape = EnvShape{4, {2}};
    if (e.task == "Acrobot-v1") p.error = "no physics here";
    return p;
  };
  const std::string net = "network: {state: 6, trunk: [8], head_hidden: 4, branches: 2, actions: 2, atoms: 5, v_min: 0, "
                          "v_max: 1}\n";
  auto errs = errors_of(net + kPrimary + "training: {total_steps: 100}\n", o);
  REQUIRE(errs.size() == 2);
  CHECK(std::string(errs[0].what()).rfind("t.yaml:1:18: key 'network.state' = '6': the environment cartpole:CartPole-v1 has 4 "
                                          "observation features", 0) == 0);
  CHECK(errs[0].hint() == "set network.state: 4");
  CHECK(errs[1].key() == "network.branches");
  CHECK(errors_of(net + kPrimary + "training: {total_steps: 100}\n").empty());  // not asked to check
  const std::string fits = "network: {state: 4, trunk: [8], head_hidden: 4, branches: 1, actions: 3, atoms: 5}\n";
  errs = errors_of(fits + kPrimary + "training: {env: CartPole-v1}\n", o);
  REQUIRE(errs.size() == 1);
  CHECK(std::string(errs[0].what()).find("CartPole-v1's branch 0 has 2 actions") != std::string::npos);
  // An environment that refuses its options; no environment online; none offline.
  errs = errors_of(fits + kPrimary + "training: {env: Acrobot-v1}\n", o);
  REQUIRE(errs.size() == 1);
  CHECK(std::string(errs[0].what()).find("key 'training.env': the environment classic:Acrobot-v1 refused its options: no "
                                         "physics here") != std::string::npos);
  // A refusal that names an option written in the pipeline points at it.
  ParseOptions named = o;
  named.environments = [](const EnvChoice&) {
    EnvProbe p;
    p.found = true;
    p.error = "cannot load the model '/nope.xml' (option 'model')";
    return p;
  };
  errs = errors_of(fits + kPrimary + "training:\n  env: {plugin: mujoco, task: reacher, model: /nope.xml}\n", named);
  REQUIRE(errs.size() == 1);
  CHECK(std::string(errs[0].what()).rfind("t.yaml:4:47: key 'training.env.model' = '/nope.xml': the environment "
                                          "mujoco:reacher refused its options: cannot load", 0) == 0);
  errs = errors_of(fits + kPrimary + "training: {env: \"\"}\n", o);
  REQUIRE(errs.size() == 1);
  CHECK(std::string(errs[0].what()).find("key 'training.env': an online run needs an environment") != std::string::npos);
  CHECK(errors_of(net + kPrimary + "training: {dataset: d.safetensors}\n", o).empty());
  // A support that float arithmetic cannot hold.
  errs = errors_of("network: {v_max: 1e39}\n" + kPrimary);
  REQUIRE(errs.size() == 1);
  CHECK(errs[0].key() == "network.v_max");
}

TEST_CASE("pipeline.quoted_values_left_open") {
  // [text, whether it is read] — quotes open a value only at its start; comments, escapes and
  // block scalars hold quotes of their own.
  const std::pair<std::string, bool> cases[] = {
      {"name: \"abc\n", false},
      {"seed: 1\nname: \"abc", false},
      {"a: [1, \"b\n", false},
      {"name: \"a\\\"b\"\n", true},
      {"name: 'it''s'\n", true},
      {"name: don't\n", true},
      {"name: x  # it's \"quoted\n", true},
      {"\"key\": 1\n", true},
      {"a: [\"x\", 'y', z]\n", true},
      {"text: |\n  it's \"open\n  still\nb: 1\n", true},
      {"name: a\"b\n", true},
  };
  for (const auto& [text, ok] : cases) {
    CAPTURE(text);
    bool read = true;
    std::string what;
    try {
      (void)dqn::dsl::read_document(text, "q.yaml");
    } catch (const PipelineErrors& e) {
      read = false;
      what = e.what();
    }
    CHECK(read == ok);
    if (!ok) CHECK(what.find("q.yaml:") != std::string::npos);
  }
}
