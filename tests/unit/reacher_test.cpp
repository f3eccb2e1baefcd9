// Unit tests of the reacher environment plugin (plugins/reacher), loaded from the build tree and
// driven through the SDK's Env interface alone: spec, observation layout, reward, determinism over
// seeds and copy splits, auto-reset, save/load, refused options, and that the task is solvable with
// its discrete bins (a scripted controller) but not by chance (a random policy).
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dqn/env.hpp"

namespace {

using dqn::Env;
using dqn::StateType;

// The task's defaults (docs/environments.md, "reacher").
constexpr int kLinks = 4, kBins = 5, kMaxSteps = 75;
constexpr double kTolerance = 0.1, kDistanceWeight = 4, kControlCost = 0.01, kSuccessBonus = 2;

/// The plugin's descriptor, from $DQN_PLUGIN_PATH/libdqn_reacher.so (kept loaded for the whole run).
const dqn::PluginDescriptor& descriptor() {
  static const dqn::PluginDescriptor* d = [] {
    const char* dir = std::getenv("DQN_PLUGIN_PATH");
    if (!dir) FAIL("DQN_PLUGIN_PATH is not set (meson test sets it to the build tree's plugins/)");
    const std::string path = std::string(dir) + "/libdqn_reacher.so";
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) FAIL("cannot load " << path << ": " << std::string(dlerror()));
    using Fn = const dqn::PluginDescriptor*();
    auto* fn = reinterpret_cast<Fn*>(dlsym(lib, dqn::kDescriptorSymbol));
    if (!fn) FAIL(path << " has no symbol " << std::string(dqn::kDescriptorSymbol));
    return fn();
  }();
  return *d;
}

const dqn::EnvDescriptor& task() {
  REQUIRE(descriptor().env_count == 1);
  return descriptor().envs[0];
}

using Options = std::map<std::string, std::string>;

struct EnvDeleter {
  void operator()(Env* e) const { task().destroy(e); }
};
using EnvPtr = std::unique_ptr<Env, EnvDeleter>;

/// Creates N copies with the schema's defaults overridden by `opt` (values as text); null with the
/// plugin's message in *error on refusal.
EnvPtr make(const Options& opt, int n, std::uint64_t seed, std::string* error = nullptr) {
  const dqn::EnvDescriptor& t = task();
  std::vector<dqn::ParamValue> values;
  for (std::uint32_t k = 0; k < t.schema_len; ++k) {
    const dqn::ParamSchema& s = t.schema[k];
    const auto it = opt.find(s.key);
    const std::string text = it != opt.end() ? it->second : s.default_value;
    dqn::ParamValue v{s.key, s.type, 0, 0.0, nullptr};
    if (s.type == dqn::ParamType::integer) v.i = std::stoll(text);
    if (s.type == dqn::ParamType::number) v.d = std::stod(text);
    if (s.type == dqn::ParamType::boolean) v.i = text == "true" ? 1 : 0;
    values.push_back(v);
  }
  const dqn::EnvCreateInfo info{t.task, n, seed, values.data(), static_cast<std::uint32_t>(values.size())};
  char err[512] = "";
  Env* e = t.create(&info, err, sizeof err);
  if (error) *error = err;
  return EnvPtr(e);
}

/// One step's caller-owned arrays for every copy.
struct Io {
  Io(const Env& env) : n(env.num_envs()), dim(env.spec().obs_dim), branches(env.spec().n_branches) {
    actions.assign(static_cast<std::size_t>(n * branches), 0);
    obs.assign(static_cast<std::size_t>(n * dim), 0.f);
    final_obs = obs;
    rewards.assign(static_cast<std::size_t>(n), 0.f);
    terminated.assign(static_cast<std::size_t>(n), 0);
    truncated = success = unstable = terminated;
  }
  dqn::EnvStep view() {
    return dqn::EnvStep{actions.data(), obs.data(),        rewards.data(), terminated.data(), truncated.data(),
                        final_obs.data(), success.data(), unstable.data()};
  }
  const float* row(int i) const { return &obs[static_cast<std::size_t>(i * dim)]; }
  const float* final_row(int i) const { return &final_obs[static_cast<std::size_t>(i * dim)]; }
  int n, dim, branches;
  std::vector<std::int32_t> actions;
  std::vector<float> obs, final_obs, rewards;
  std::vector<std::uint8_t> terminated, truncated, success, unstable;
};

void reset(Env& env, Io& io, std::uint64_t seed) {
  char err[256] = "";
  REQUIRE_MESSAGE(env.reset(seed, 0, env.num_envs(), io.obs.data(), err, sizeof err) == 0, err);
}
void step(Env& env, Io& io, int begin, int end) {
  char err[256] = "";
  auto v = io.view();
  REQUIRE_MESSAGE(env.step(begin, end, v, err, sizeof err) == 0, err);
}
void step(Env& env, Io& io) { step(env, io, 0, env.num_envs()); }

/// Everything a step wrote, to compare runs bit for bit.
std::vector<std::uint8_t> snapshot(const Io& io) {
  std::vector<std::uint8_t> s;
  auto add = [&s](const void* p, std::size_t bytes) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    s.insert(s.end(), b, b + bytes);
  };
  add(io.obs.data(), io.obs.size() * sizeof(float));
  add(io.final_obs.data(), io.final_obs.size() * sizeof(float));
  add(io.rewards.data(), io.rewards.size() * sizeof(float));
  for (const auto* f : {&io.terminated, &io.truncated, &io.success, &io.unstable}) add(f->data(), f->size());
  return s;
}

void random_actions(Io& io, std::mt19937& g, int bins) {
  std::uniform_int_distribution<int> pick(0, bins - 1);
  for (auto& a : io.actions) a = pick(g);
}

/// Steps every copy `steps` times with uniform-random actions, calling check(t, i, obs before the step) for each copy.
template <class Check>
void random_run(Env& env, Io& io, unsigned seed, int steps, Check check) {
  std::mt19937 g(seed);
  for (int t = 0; t < steps; ++t) {
    const std::vector<float> before = io.obs;
    random_actions(io, g, env.spec().branches[0].bins);
    step(env, io);
    for (int i = 0; i < io.n; ++i) {
      CAPTURE(t);
      CAPTURE(i);
      check(t, i, before);
    }
  }
}

/// The observation's parts (layout in plugins/reacher/reacher.cpp and docs/environments.md, "reacher").
struct View {
  const float* o;
  int links;
  double angle(int j) const { return std::atan2(o[2 * j + 1], o[2 * j]); }
  double speed(int j) const { return o[2 * links + j]; }
  double lever(int j, int c) const { return o[3 * links + 2 * j + c]; }  ///< joint j's position − the tip's
  double tip(int c) const { return o[5 * links + c]; }
  double target(int c) const { return o[5 * links + 2 + c]; }
  double diff(int c) const { return o[5 * links + 4 + c]; }
  double distance() const { return std::hypot(diff(0), diff(1)); }
};

/// An in-memory saved state: named tensors with their type and shape.
class MemoryState final : public dqn::StateWriter, public dqn::StateReader {
 public:
  struct Tensor {
    StateType type;
    std::vector<std::int64_t> shape;
    std::vector<std::uint8_t> bytes;
  };
  static std::size_t size_of(StateType t) {
    switch (t) {
      case StateType::f64: case StateType::i64: case StateType::u64: return 8;
      case StateType::f32: case StateType::i32: return 4;
      case StateType::u8: return 1;
    }
    return 0;
  }
  int put(const char* name, StateType type, const std::int64_t* shape, std::int32_t rank,
          const void* data) noexcept override {
    Tensor t{type, std::vector<std::int64_t>(shape, shape + rank), {}};
    std::int64_t n = 1;
    for (auto d : t.shape) n *= d;
    const auto* b = static_cast<const std::uint8_t*>(data);
    t.bytes.assign(b, b + n * static_cast<std::int64_t>(size_of(type)));
    tensors[name] = std::move(t);
    return 0;
  }
  int fail(const char* message) noexcept override {
    error = message;
    return 1;
  }
  int get(const char* name, StateType type, const std::int64_t* shape, std::int32_t rank,
          void* data) const noexcept override {
    const auto it = tensors.find(name);
    if (it == tensors.end()) return fail(("no tensor '" + std::string(name) + "'").c_str());
    if (it->second.type != type || it->second.shape != std::vector<std::int64_t>(shape, shape + rank))
      return fail(("tensor '" + std::string(name) + "': another type or shape").c_str());
    std::memcpy(data, it->second.bytes.data(), it->second.bytes.size());
    return 0;
  }
  int fail(const char* message) const noexcept override {
    error = message;
    return 1;
  }
  const char* source() const noexcept override { return "memory"; }

  template <class T>
  T* at(const std::string& name) {
    return reinterpret_cast<T*>(tensors.at(name).bytes.data());
  }

  std::map<std::string, Tensor> tensors;
  mutable std::string error;
};

}  // namespace

TEST_CASE("reacher.descriptor_and_spec") {
  const dqn::PluginDescriptor& d = descriptor();
  CHECK(d.abi_major == dqn::kAbiMajor);
  CHECK(d.kind == dqn::PluginKind::environment);
  CHECK(d.struct_size >= dqn::kDescriptorSizeMinor1);
  CHECK(std::string(d.name) == "reacher");
  CHECK(std::string(task().task) == "reacher");
  const std::map<std::string, double> defaults = {
      {"links", kLinks},         {"bins", kBins},           {"max_steps", kMaxSteps},        {"tolerance", kTolerance},
      {"distance_weight", kDistanceWeight}, {"control_cost", kControlCost}, {"success_bonus", kSuccessBonus}};
  REQUIRE(task().schema_len == defaults.size() + 1);
  for (std::uint32_t k = 0; k < task().schema_len; ++k) {
    const dqn::ParamSchema& s = task().schema[k];
    CAPTURE(std::string(s.key));
    if (std::string(s.key) == "joint_actions") {
      CHECK(s.type == dqn::ParamType::boolean);
      CHECK(std::string(s.default_value) == "false");
      continue;
    }
    REQUIRE(defaults.count(s.key) == 1);
    CHECK(std::stod(s.default_value) == defaults.at(s.key));
    CHECK(std::strlen(s.doc) > 10);
    CHECK(s.min <= s.max);
  }
  for (const auto& [links, bins] : {std::pair{4, 5}, std::pair{6, 7}, std::pair{1, 3}}) {
    CAPTURE(links);
    auto env = make({{"links", std::to_string(links)}, {"bins", std::to_string(bins)}}, 3, 1);
    REQUIRE(env);
    const dqn::EnvSpec& s = env->spec();
    CHECK(std::string(s.name) == "reacher");
    CHECK(env->num_envs() == 3);
    CHECK(s.obs_dim == 5 * links + 6);
    CHECK(s.n_branches == links);
    CHECK(s.max_episode_steps == kMaxSteps);
    CHECK(s.reports_success == 1);
    for (int j = 0; j < links; ++j) {
      const dqn::EnvBranch& b = s.branches[j];
      CHECK(b.bins == bins);
      CHECK(b.continuous == 1);
      CHECK(b.lo == -1.0);
      CHECK(b.hi == 1.0);
      CHECK(std::string(b.name) == "joint" + std::to_string(j));
    }
  }
}

TEST_CASE("reacher.observation_and_reward") {
  const int links = 3;
  auto env = make({{"links", "3"}}, 16, 9);
  REQUIRE(env);
  Io io(*env);
  reset(*env, io, 9);
  random_run(*env, io, 3, 60, [&](int, int i, const std::vector<float>& before) {
    for (const float* row : {io.row(i), io.final_row(i)}) {
      const View v{row, links};
      double x = 0, y = 0, theta = 0;
      std::vector<double> jx, jy;
      for (int j = 0; j < links; ++j) {
        CHECK(std::fabs(row[2 * j] * row[2 * j] + row[2 * j + 1] * row[2 * j + 1] - 1) < 1e-5);
        CHECK(std::fabs(v.speed(j)) <= 1.0);
        jx.push_back(x);
        jy.push_back(y);
        theta += v.angle(j);
        x += std::cos(theta) / links;
        y += std::sin(theta) / links;
      }
      CHECK(std::fabs(v.tip(0) - x) < 1e-5);
      CHECK(std::fabs(v.tip(1) - y) < 1e-5);
      for (int j = 0; j < links; ++j) {
        CHECK(std::fabs(v.lever(j, 0) - (jx[j] - x)) < 1e-5);
        CHECK(std::fabs(v.lever(j, 1) - (jy[j] - y)) < 1e-5);
      }
      CHECK(std::fabs(v.diff(0) - (v.tip(0) - v.target(0))) < 1e-6);
      CHECK(std::fabs(v.diff(1) - (v.tip(1) - v.target(1))) < 1e-6);
      CHECK(std::hypot(v.target(0), v.target(1)) <= 1.0 + 1e-6);
    }
    // reward = distance_weight · (distance before − after) − control_cost · Σ u² + success_bonus on reaching
    double effort = 0;
    for (int j = 0; j < links; ++j) {
      const double u = -1.0 + 2.0 * io.actions[static_cast<std::size_t>(i * links + j)] / (kBins - 1);
      effort += u * u;
    }
    const View was{&before[static_cast<std::size_t>(i * io.dim)], links}, now{io.final_row(i), links};
    const double want = kDistanceWeight * (was.distance() - now.distance()) - kControlCost * effort +
                        (io.success[i] ? kSuccessBonus : 0);
    CHECK(std::fabs(io.rewards[i] - want) < 1e-4);
    CHECK(io.success[i] == (now.distance() <= kTolerance + 1e-6));
    CHECK(io.unstable[i] == 0);
  });
}

TEST_CASE("reacher.new_episode") {
  auto env = make({{"links", "4"}}, 64, 5);
  REQUIRE(env);
  Io io(*env);
  reset(*env, io, 5);
  for (int i = 0; i < 64; ++i) {
    const View v{io.row(i), 4};
    CAPTURE(i);
    for (int j = 0; j < 4; ++j) {
      CHECK(std::fabs(v.angle(j)) <= 0.1 + 1e-6);  // small angles at rest
      CHECK(v.speed(j) == 0.0);
    }
    CHECK(v.distance() > 2 * kTolerance);  // not within 2·tolerance of the start
  }
}

TEST_CASE("reacher.deterministic_over_seeds_and_splits") {
  const int n = 10, k = 3, steps = 250;
  auto a = make({}, n, 7), b = make({}, n, 7), c = make({}, n, 7), other = make({}, n, 8);
  REQUIRE((a && b && c && other));
  Io ia(*a), ib(*b), ic(*c), io(*other);
  reset(*a, ia, 7);
  // resets split too
  char err[128];
  REQUIRE(b->reset(7, 0, k, ib.obs.data(), err, sizeof err) == 0);
  REQUIRE(b->reset(7, k, n, ib.obs.data(), err, sizeof err) == 0);
  reset(*c, ic, 7);
  reset(*other, io, 8);
  CHECK(snapshot(ia) == snapshot(ib));
  CHECK(ia.obs != io.obs);
  // create(seed) starts as reset(seed) does: c was reset, a fresh one was not
  auto unreset = make({}, n, 7);
  REQUIRE(unreset);
  Io iu(*unreset);
  std::mt19937 first(4);
  random_actions(iu, first, kBins);
  ic.actions = iu.actions;
  step(*unreset, iu);
  step(*c, ic);
  CHECK(snapshot(iu) == snapshot(ic));
  reset(*c, ic, 7);
  std::mt19937 g(1);
  int ended = 0;
  for (int t = 0; t < steps; ++t) {
    random_actions(ia, g, kBins);
    ib.actions = ic.actions = io.actions = ia.actions;
    step(*a, ia);
    step(*b, ib, 0, k);
    step(*b, ib, k, n);
    std::thread left([&] { step(*c, ic, 0, k); });
    std::thread right([&] { step(*c, ic, k, n); });
    left.join();
    right.join();
    step(*other, io);
    REQUIRE(snapshot(ia) == snapshot(ib));
    REQUIRE(snapshot(ia) == snapshot(ic));
    for (int i = 0; i < n; ++i) ended += ia.terminated[i] + ia.truncated[i];
  }
  CHECK(ended > n);  // the runs went through auto-resets
  CHECK(ia.obs != io.obs);

  // A copy's numbers depend on its index and its own actions only, not on how many copies there are.
  auto small = make({}, 4, 7);
  REQUIRE(small);
  Io is(*small);
  reset(*small, is, 7);
  reset(*a, ia, 7);
  for (int t = 0; t < steps; ++t) {
    random_actions(ia, g, kBins);
    std::copy_n(ia.actions.begin(), is.actions.size(), is.actions.begin());
    step(*a, ia);
    step(*small, is);
    REQUIRE(std::equal(is.obs.begin(), is.obs.end(), ia.obs.begin()));
    REQUIRE(std::equal(is.rewards.begin(), is.rewards.end(), ia.rewards.begin()));
  }
}

TEST_CASE("reacher.auto_reset_and_end_flags") {
  const int n = 32, max_steps = 40;
  auto env = make({{"max_steps", std::to_string(max_steps)}, {"tolerance", "0.25"}}, n, 11);
  REQUIRE(env);
  Io io(*env);
  reset(*env, io, 11);
  std::vector<int> age(n, 0);
  int successes = 0, truncations = 0;
  random_run(*env, io, 5, 300, [&](int, int i, const std::vector<float>&) {
    ++age[i];
    const bool ended = io.terminated[i] || io.truncated[i];
    CHECK(!(io.terminated[i] && io.truncated[i]));
    CHECK(io.success[i] == io.terminated[i]);  // the only terminal state is the target reached
    CHECK(io.truncated[i] == (!io.terminated[i] && age[i] == max_steps));
    const View fin{io.final_row(i), 4}, next{io.row(i), 4};
    if (io.terminated[i]) CHECK(fin.distance() <= 0.25 + 1e-6);
    else CHECK(fin.distance() > 0.25 - 1e-6);
    if (ended) {
      // a new episode's first observation: at rest, small angles; the final one is kept apart
      for (int j = 0; j < 4; ++j) {
        CHECK(next.speed(j) == 0.0);
        CHECK(std::fabs(next.angle(j)) <= 0.1 + 1e-6);
      }
      CHECK(!std::equal(io.row(i), io.row(i) + io.dim, io.final_row(i)));
      successes += io.success[i];
      truncations += io.truncated[i];
      age[i] = 0;
    } else {
      CHECK(std::equal(io.row(i), io.row(i) + io.dim, io.final_row(i)));
    }
  });
  CHECK(successes > 0);
  CHECK(truncations > 0);
}

TEST_CASE("reacher.truncated_at_rest") {
  auto env = make({{"max_steps", "5"}}, 2, 1);
  REQUIRE(env);
  Io io(*env);
  reset(*env, io, 1);
  const std::vector<float> start = io.obs;
  std::fill(io.actions.begin(), io.actions.end(), kBins / 2);  // the middle bin: zero torque
  for (int t = 1; t <= 5; ++t) {
    step(*env, io);
    for (int i = 0; i < 2; ++i) {
      CHECK(io.terminated[i] == 0);
      CHECK(io.success[i] == 0);
      CHECK(io.truncated[i] == (t == 5));
      CHECK(io.rewards[i] == 0.0f);  // at rest: no progress, no effort
    }
    if (t < 5) CHECK(io.obs == start);
  }
  CHECK(io.final_obs == start);
  CHECK(io.obs != start);  // a new episode
}

TEST_CASE("reacher.bad_action_changes_nothing") {
  auto env = make({}, 3, 2), twin = make({}, 3, 2);
  REQUIRE((env && twin));
  Io io(*env), it(*twin);
  reset(*env, io, 2);
  reset(*twin, it, 2);
  io.actions[5] = 5;  // copy 1, joint1: bins are 0..4
  char err[256] = "";
  auto v = io.view();
  REQUIRE(env->step(0, 3, v, err, sizeof err) != 0);
  CHECK(std::string(err).find("copy 1, joint1: action 5") != std::string::npos);
  REQUIRE(env->step(0, 4, v, err, sizeof err) != 0);
  CHECK(std::string(err).find("copies [0, 4)") != std::string::npos);
  io.actions[5] = 1;
  it.actions = io.actions;
  step(*env, io);
  step(*twin, it);
  CHECK(snapshot(io) == snapshot(it));
}

TEST_CASE("reacher.save_load_continues_exactly") {
  const int n = 6;
  auto env = make({{"links", "5"}}, n, 21);
  REQUIRE(env);
  Io io(*env);
  reset(*env, io, 21);
  std::mt19937 g(8);
  for (int t = 0; t < 137; ++t) {
    random_actions(io, g, kBins);
    step(*env, io);
  }
  MemoryState saved;
  REQUIRE(env->save_state(saved) == 0);
  for (const char* name : {"angles", "speeds", "targets", "steps", "rng"}) CHECK(saved.tensors.count(name) == 1);

  const std::mt19937 g_at_save = g;
  std::vector<std::vector<std::uint8_t>> want;
  for (int t = 0; t < 150; ++t) {
    random_actions(io, g, kBins);
    step(*env, io);
    want.push_back(snapshot(io));
  }
  auto check_continuation = [&](Env& e) {
    Io ie(e);
    std::mt19937 h = g_at_save;
    for (int t = 0; t < 150; ++t) {
      random_actions(ie, h, kBins);
      step(e, ie);
      REQUIRE(snapshot(ie) == want[static_cast<std::size_t>(t)]);
    }
  };
  auto fresh = make({{"links", "5"}}, n, 999);
  REQUIRE(fresh);
  REQUIRE(fresh->load_state(saved) == 0);
  check_continuation(*fresh);
  REQUIRE(env->load_state(saved) == 0);  // back in time, in place
  check_continuation(*env);

  // Bad state: refused with the tensor and element named; the copies are left as they were.
  struct Bad {
    std::string what;
    void (*spoil)(MemoryState&);
    std::string message;
  };
  const Bad bad[] = {
      {"a NaN angle", [](MemoryState& s) { s.at<double>("angles")[7] = std::nan(""); }, "'angles' element [1, 2] is nan"},
      {"an unwrapped angle", [](MemoryState& s) { s.at<double>("angles")[0] = 4.0; }, "'angles' element [0, 0] is 4"},
      {"a speed over the top", [](MemoryState& s) { s.at<double>("speeds")[9] = -2.5; }, "'speeds' element [1, 4] is -2.5"},
      {"a target out of reach", [](MemoryState& s) { s.at<double>("targets")[6] = 0.9, s.at<double>("targets")[7] = 0.9; },
       "'targets' element [3, :] is beyond"},
      {"a negative step count", [](MemoryState& s) { s.at<std::int32_t>("steps")[2] = -1; }, "'steps' element [2] is -1"},
      {"a step count at the limit", [](MemoryState& s) { s.at<std::int32_t>("steps")[5] = kMaxSteps; }, "'steps' element [5] is 75"},
      {"a missing tensor", [](MemoryState& s) { s.tensors.erase("rng"); }, "no tensor 'rng'"},
      {"another shape", [](MemoryState& s) { s.tensors.at("speeds").shape = {n, 4}; }, "tensor 'speeds'"},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.what);
    MemoryState spoilt = saved;
    b.spoil(spoilt);
    auto target = make({{"links", "5"}}, n, 21), twin = make({{"links", "5"}}, n, 21);
    REQUIRE((target && twin));
    CHECK(target->load_state(spoilt) != 0);
    INFO(spoilt.error);
    CHECK(spoilt.error.find(b.message) != std::string::npos);
    if (b.message.find("element") != std::string::npos) CHECK(spoilt.error.find("reacher state in 'memory': ") == 0);
    Io it(*target), iw(*twin);
    it.actions.assign(it.actions.size(), 4);
    iw.actions = it.actions;
    step(*target, it);
    step(*twin, iw);
    CHECK(snapshot(it) == snapshot(iw));
  }
  // another arm (links) does not take this state
  auto three = make({{"links", "3"}}, n, 1);
  REQUIRE(three);
  MemoryState copy = saved;
  CHECK(three->load_state(copy) != 0);
  CHECK(copy.error.find("tensor 'angles'") != std::string::npos);
}

TEST_CASE("reacher.bad_options_refused") {
  struct Case {
    Options opt;
    int n;
    std::string message;
  };
  const Case cases[] = {
      {{{"bins", "4"}}, 2, "'bins' must be odd"},
      {{{"bins", "1"}}, 2, "'bins' = 1 is not in [3, 51]"},
      {{{"links", "0"}}, 2, "'links' = 0 is not in [1, 16]"},
      {{{"links", "17"}}, 2, "'links' = 17 is not in [1, 16]"},
      {{{"tolerance", "0"}}, 2, "'tolerance' = 0 is not in [0.001, 0.5]"},
      {{{"tolerance", "nan"}}, 2, "'tolerance' = nan is not in"},
      {{{"max_steps", "0"}}, 2, "'max_steps' = 0 is not in [1, 100000]"},
      {{{"control_cost", "-1"}}, 2, "'control_cost' = -1 is not in [0, 1000]"},
      {{{"distance_weight", "inf"}}, 2, "'distance_weight' = inf is not in"},
      {{{"success_bonus", "-0.5"}}, 2, "'success_bonus' = -0.5 is not in"},
      {{}, 0, "num_envs must be at least 1"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.message);
    std::string error;
    CHECK_FALSE(make(c.opt, c.n, 1, &error));
    INFO(error);
    CHECK(error.find(c.message) != std::string::npos);
    CHECK(error.find("reacher: ") == 0);
  }
}

namespace {

/// A Jacobian-transpose controller on the observation: each joint turns the way that moves the
/// fingertip toward the target, the strongest at full torque (slower close in), snapped to a bin.
void scripted_actions(Io& io, int links, int bins) {
  for (int i = 0; i < io.n; ++i) {
    const View v{io.row(i), links};
    const double ex = -v.diff(0), ey = -v.diff(1);  // tip → target
    std::vector<double> grad(links);
    double top = 0;
    for (int j = 0; j < links; ++j) {
      // d tip / d q_j is the tip's offset from joint j (−lever) turned by 90°; its part along tip → target
      grad[j] = v.lever(j, 1) * ex - v.lever(j, 0) * ey;
      top = std::max(top, std::fabs(grad[j]));
    }
    const double speed = std::clamp(v.distance() / 0.4, 0.5, 1.0);
    for (int j = 0; j < links; ++j) {
      const double u = top > 0 ? speed * grad[j] / top : 0.0;
      io.actions[static_cast<std::size_t>(i * links + j)] =
          std::clamp(static_cast<int>(std::lround((u + 1) / 2 * (bins - 1))), 0, bins - 1);
    }
  }
}

struct Rate {
  double success;      ///< the fraction of first episodes (one per copy) that end in success
  double mean_steps;   ///< their mean length
};

template <class Policy>
Rate success_rate(int links, int episodes, Policy policy) {
  auto env = make({{"links", std::to_string(links)}}, episodes, 100 + links);
  REQUIRE(env);
  Io io(*env);
  reset(*env, io, 100 + links);
  std::vector<int> outcome(episodes, -1);
  double steps = 0;
  for (int t = 0; t < env->spec().max_episode_steps; ++t) {
    policy(io);
    step(*env, io);
    for (int i = 0; i < episodes; ++i)
      if (outcome[i] < 0 && (io.terminated[i] || io.truncated[i])) {
        outcome[i] = io.success[i];
        steps += t + 1;
      }
  }
  CHECK(std::count(outcome.begin(), outcome.end(), -1) == 0);  // every first episode ended within max_steps
  return Rate{static_cast<double>(std::count(outcome.begin(), outcome.end(), 1)) / episodes, steps / episodes};
}

}  // namespace

TEST_CASE("reacher.solvable_with_bins_but_not_by_chance") {
  for (int links : {2, 4, 6}) {
    CAPTURE(links);
    const Rate scripted = success_rate(links, 200, [&](Io& io) { scripted_actions(io, links, kBins); });
    std::mt19937 g(static_cast<unsigned>(links));
    const Rate random = success_rate(links, 200, [&](Io& io) { random_actions(io, g, kBins); });
    MESSAGE("links ", links, ": scripted success ", scripted.success, " in ", scripted.mean_steps,
            " steps on average; random ", random.success);
    CHECK(scripted.success >= 0.95);
    CHECK(random.success < 0.30);
  }
}

TEST_CASE("reacher.joint_actions: one branch over every combination moves the arm as the branches do") {
  constexpr int kN = 3;
  auto branched = make({{"links", "2"}, {"bins", "3"}}, kN, 11);
  auto joint = make({{"links", "2"}, {"bins", "3"}, {"joint_actions", "true"}}, kN, 11);
  REQUIRE(branched);
  REQUIRE(joint);
  REQUIRE(joint->spec().n_branches == 1);
  CHECK(joint->spec().branches[0].bins == 9);
  CHECK(joint->spec().branches[0].continuous == 0);
  Io a(*branched), b(*joint);
  std::mt19937 g(4);
  for (int t = 0; t < 120; ++t) {
    for (int i = 0; i < kN; ++i) {
      const int j0 = int(g() % 3), j1 = int(g() % 3);
      a.actions[std::size_t(2 * i)] = j0;
      a.actions[std::size_t(2 * i + 1)] = j1;
      b.actions[std::size_t(i)] = j0 + 3 * j1;  // joint 0 the lowest digit
    }
    step(*branched, a);
    step(*joint, b);
    CHECK(a.obs == b.obs);
    CHECK(a.rewards == b.rewards);
    CHECK(a.terminated == b.terminated);
  }
  std::string error;
  CHECK(!make({{"links", "8"}, {"bins", "5"}, {"joint_actions", "true"}}, 1, 0, &error));
  CHECK(error == "reacher: option 'joint_actions' with 5 bins and 8 links makes 390625 actions, more than 65536");
}
