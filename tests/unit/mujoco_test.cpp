// Unit tests of the mujoco environment library (plugins/mujoco), loaded from the build tree and
// used through the SDK alone: the spaces, the rewards, determinism whatever the split of copies,
// exact resume, unstable simulations and MuJoCo errors, and the errors a user sees.
#include <doctest/doctest.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dqn/env.hpp"
#include "dqn/plugin.hpp"
#include "mujoco_tolerance.hpp"

namespace {

using dqn::StateType;

const dqn::PluginDescriptor& plugin() {
  static const dqn::PluginDescriptor* desc = nullptr;
  if (desc) return *desc;
  const char* path = std::getenv("DQN_PLUGIN_PATH");
  REQUIRE_MESSAGE(path, "DQN_PLUGIN_PATH is not set (meson test sets it to <build>/plugins)");
  std::string dirs = path, tried;
  std::size_t at = 0;
  while (at <= dirs.size()) {
    const std::size_t colon = std::min(dirs.find(':', at), dirs.size());
    const std::string file = dirs.substr(at, colon - at) + "/libdqn_mujoco.so";
    at = colon + 1;
    if (void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL)) {  // kept loaded for the whole run
      auto entry = reinterpret_cast<const dqn::PluginDescriptor* (*)()>(dlsym(lib, dqn::kDescriptorSymbol));
      const bool found = entry != nullptr;
      REQUIRE_MESSAGE(found, file << " has no " << dqn::kDescriptorSymbol);
      desc = entry();
      return *desc;
    }
    tried += std::string(" ") + dlerror();
  }
  FAIL("libdqn_mujoco.so not found on DQN_PLUGIN_PATH:" << tried);
  return *desc;
}

const dqn::EnvDescriptor& task(const std::string& name) {
  const dqn::PluginDescriptor& p = plugin();
  for (std::uint32_t i = 0; i < p.env_count; ++i)
    if (name == p.envs[i].task) return p.envs[i];
  FAIL("no task " << name);
  return p.envs[0];
}

std::string source_file(const std::string& rel) {
  const char* src = std::getenv("DQN_SOURCE_DIR");
  REQUIRE_MESSAGE(src, "DQN_SOURCE_DIR is not set");
  return std::string(src) + "/" + rel;
}

using Overrides = std::map<std::string, std::string>;

// Every key of a task's schema with its default (text in YAML syntax) unless overridden.
struct Options {
  Options(const dqn::EnvDescriptor& t, const Overrides& over) {
    for (std::uint32_t i = 0; i < t.schema_len; ++i) {
      const dqn::ParamSchema& s = t.schema[i];
      const auto it = over.find(s.key);
      const std::string& v = text.emplace_back(it != over.end() ? it->second : s.default_value);
      dqn::ParamValue p{s.key, s.type, 0, 0.0, nullptr};
      if (s.type == dqn::ParamType::integer) p.i = std::stoll(v);
      if (s.type == dqn::ParamType::boolean) p.i = v == "true";
      if (s.type == dqn::ParamType::number) p.d = std::stod(v);
      if (s.type == dqn::ParamType::string) p.s = v.c_str();
      values.push_back(p);
    }
  }
  std::deque<std::string> text;
  std::vector<dqn::ParamValue> values;
};

struct EnvDeleter {
  const dqn::EnvDescriptor* t;
  void operator()(dqn::Env* e) const { t->destroy(e); }
};
using EnvPtr = std::unique_ptr<dqn::Env, EnvDeleter>;

// create(); `err` gets the message where it returns null.
EnvPtr create(const std::string& name, int n, std::uint64_t seed, const Overrides& over, std::string* err) {
  const dqn::EnvDescriptor& t = task(name);
  Options o(t, over);
  const dqn::EnvCreateInfo info{t.task, n, seed, o.values.data(), static_cast<std::uint32_t>(o.values.size())};
  char buf[1024] = "";
  dqn::Env* e = t.create(&info, buf, sizeof buf);
  if (err) *err = buf;
  return EnvPtr(e, EnvDeleter{&t});
}

EnvPtr make(const std::string& name, int n, std::uint64_t seed, const Overrides& over = {}) {
  std::string err;
  EnvPtr e = create(name, n, seed, over, &err);
  REQUIRE_MESSAGE(e, name << ": " << err);
  return e;
}

std::string default_of(const std::string& name, const std::string& key) {
  const dqn::EnvDescriptor& t = task(name);
  for (std::uint32_t i = 0; i < t.schema_len; ++i)
    if (key == t.schema[i].key) return t.schema[i].default_value;
  FAIL(name << " has no option " << key);
  return "";
}

std::string create_error(const std::string& name, const Overrides& over, int n = 1) {
  std::string err;
  EnvPtr e = create(name, n, 1, over, &err);
  CHECK_MESSAGE(!e, name << " accepted options it should refuse");
  return err;
}

// One step's arrays for every copy.
struct Io {
  explicit Io(const dqn::Env& env)
      : n(env.num_envs()), s(env.spec().obs_dim), d(env.spec().n_branches), actions(n * d), next(n * s),
        final_obs(n * s), rewards(n), term(n), trunc(n), success(n), unstable(n) {}
  dqn::EnvStep view() {
    return dqn::EnvStep{actions.data(), next.data(), rewards.data(), term.data(), trunc.data(),
                        final_obs.data(), success.data(), unstable.data()};
  }
  // Everything a step wrote, as bytes: trajectories are compared bit for bit.
  void record(std::vector<unsigned char>& out) const {
    auto add = [&out](const auto& v) {
      const auto* p = reinterpret_cast<const unsigned char*>(v.data());
      out.insert(out.end(), p, p + v.size() * sizeof(v[0]));
    };
    add(next), add(final_obs), add(rewards), add(term), add(trunc), add(success), add(unstable);
  }
  std::size_t n, s, d;
  std::vector<std::int32_t> actions;
  std::vector<float> next, final_obs, rewards;
  std::vector<std::uint8_t> term, trunc, success, unstable;
};

void step(dqn::Env& env, Io& io, int begin, int end) {
  char err[512] = "";
  REQUIRE_MESSAGE(env.step(begin, end, io.view(), err, sizeof err) == 0, err);
}

void random_actions(const dqn::Env& env, Io& io, std::mt19937_64& g) {
  const dqn::EnvSpec& sp = env.spec();
  for (std::size_t i = 0; i < io.actions.size(); ++i)
    io.actions[i] = std::uniform_int_distribution<int>(0, sp.branches[i % io.d].bins - 1)(g);
}

// `steps` steps of random actions (from `action_seed`), split into [0, split) and [split, N)
// where split is given, on two threads where `threads`; every output recorded.
std::vector<unsigned char> run(dqn::Env& env, int steps, std::uint64_t action_seed, int split = -1,
                               bool threads = false) {
  Io io(env);
  std::mt19937_64 g(action_seed);
  std::vector<unsigned char> out;
  const int n = env.num_envs();
  for (int t = 0; t < steps; ++t) {
    random_actions(env, io, g);
    if (split < 0) {
      step(env, io, 0, n);
    } else if (!threads) {
      step(env, io, 0, split);
      step(env, io, split, n);
    } else {
      char e1[256] = "", e2[256] = "";
      int r1 = 0, r2 = 0;
      dqn::EnvStep v = io.view();
      std::thread a([&] { r1 = env.step(0, split, v, e1, sizeof e1); });
      std::thread b([&] { r2 = env.step(split, n, v, e2, sizeof e2); });
      a.join();
      b.join();
      REQUIRE_MESSAGE(r1 == 0, e1);
      REQUIRE_MESSAGE(r2 == 0, e2);
    }
    io.record(out);
  }
  return out;
}

std::vector<float> reset(dqn::Env& env, std::uint64_t seed) {
  std::vector<float> obs(static_cast<std::size_t>(env.num_envs() * env.spec().obs_dim));
  char err[256] = "";
  REQUIRE_MESSAGE(env.reset(seed, 0, env.num_envs(), obs.data(), err, sizeof err) == 0, err);
  return obs;
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// Saved state in memory: what the engine's checkpoint does with it, minus the file.
class MemoryState final : public dqn::StateWriter, public dqn::StateReader {
 public:
  struct Tensor {
    StateType type;
    std::vector<std::int64_t> shape;
    std::vector<unsigned char> bytes;
  };
  static std::size_t elem(StateType t) {
    return t == StateType::u8 ? 1 : (t == StateType::f32 || t == StateType::i32) ? 4 : 8;
  }
  int put(const char* name, StateType type, const std::int64_t* shape, std::int32_t rank,
          const void* data) noexcept override {
    Tensor t{type, std::vector<std::int64_t>(shape, shape + rank), {}};
    std::size_t n = elem(type);
    for (std::int64_t d : t.shape) n *= static_cast<std::size_t>(d);
    t.bytes.assign(static_cast<const unsigned char*>(data), static_cast<const unsigned char*>(data) + n);
    tensors[name] = std::move(t);
    return 0;
  }
  int fail(const char* message) noexcept override { return record(message); }
  int get(const char* name, StateType type, const std::int64_t* shape, std::int32_t rank,
          void* data) const noexcept override {
    const auto it = tensors.find(name);
    if (it == tensors.end()) return record(std::string("no tensor ") + name);
    if (it->second.type != type || it->second.shape != std::vector<std::int64_t>(shape, shape + rank))
      return record(std::string("tensor ") + name + " has another type or shape");
    std::memcpy(data, it->second.bytes.data(), it->second.bytes.size());
    return 0;
  }
  int fail(const char* message) const noexcept override { return record(message); }
  const char* source() const noexcept override { return "memory"; }

  std::map<std::string, Tensor> tensors;
  mutable std::string error;

 private:
  int record(const std::string& m) const {
    error = m;
    return 1;
  }
};

// Whether two environments' saved states are the same bytes.
bool same_state(const dqn::Env& a, const dqn::Env& b) {
  MemoryState sa, sb;
  REQUIRE_MESSAGE(a.save_state(sa) == 0, sa.error);
  REQUIRE_MESSAGE(b.save_state(sb) == 0, sb.error);
  if (sa.tensors.size() != sb.tensors.size()) return false;
  for (const auto& [key, t] : sa.tensors) {
    const auto it = sb.tensors.find(key);
    if (it == sb.tensors.end() || it->second.shape != t.shape || it->second.bytes != t.bytes) return false;
  }
  return true;
}

template <class T>
T* tensor_data(MemoryState& s, const std::string& name) {
  REQUIRE(s.tensors.count(name) == 1);
  return reinterpret_cast<T*>(s.tensors[name].bytes.data());
}

}  // namespace

TEST_CASE("mujoco.descriptor") {
  const dqn::PluginDescriptor& p = plugin();
  CHECK(p.abi_major == dqn::kAbiMajor);
  CHECK(p.kind == dqn::PluginKind::environment);
  CHECK(std::string(p.name) == "mujoco");
  REQUIRE(p.env_count == 4);
  const char* names[] = {"humanoid_stand", "humanoid_walk", "humanoid_run", "reacher"};
  for (std::uint32_t i = 0; i < 4; ++i) {
    CHECK(std::string(p.envs[i].task) == names[i]);
    std::vector<std::string> keys;
    for (std::uint32_t k = 0; k < p.envs[i].schema_len; ++k) keys.push_back(p.envs[i].schema[k].key);
    for (const char* want : {"model", "bins", "episode_steps", "control_timestep"})
      CHECK_MESSAGE(std::find(keys.begin(), keys.end(), want) != keys.end(), names[i] << " lacks " << want);
  }
}

TEST_CASE("mujoco.humanoid.spec") {
  for (const char* name : {"humanoid_stand", "humanoid_walk", "humanoid_run"}) {
    EnvPtr e = make(name, 2, 1);
    const dqn::EnvSpec& s = e->spec();
    CHECK(std::string(s.name) == name);
    CHECK(s.obs_dim == 21 + 1 + 12 + 3 + 3 + 27);  // dm_control's 67
    REQUIRE(s.n_branches == 21);
    CHECK(s.max_episode_steps == 1000);
    CHECK(s.reports_success == 0);
    for (int b = 0; b < 21; ++b) {
      CHECK(s.branches[b].bins == 5);
      CHECK(s.branches[b].continuous == 1);
      CHECK(s.branches[b].lo == -1.0);  // the motors' ctrlrange
      CHECK(s.branches[b].hi == 1.0);
    }
    CHECK(std::string(s.branches[0].name) == "abdomen_y");
    CHECK(std::string(s.branches[20].name) == "left_elbow");
  }
  EnvPtr e = make("humanoid_stand", 1, 1, {{"bins", "7"}, {"episode_steps", "30"}});
  CHECK(e->spec().branches[3].bins == 7);
  CHECK(e->spec().max_episode_steps == 30);
}

TEST_CASE("mujoco.reacher.spec") {
  EnvPtr e = make("reacher", 3, 1);
  const dqn::EnvSpec& s = e->spec();
  CHECK(s.obs_dim == 4 + 2 + 2 + 2);  // cos, sin of two hinges; qvel; target; fingertip − target
  REQUIRE(s.n_branches == 2);
  CHECK(std::string(s.branches[0].name) == "shoulder");
  CHECK(std::string(s.branches[1].name) == "elbow");
  CHECK(s.branches[1].bins == 5);
  CHECK(s.branches[1].lo == -1.0);
  CHECK(s.branches[1].hi == 1.0);
  CHECK(s.max_episode_steps == 50);
  CHECK(s.reports_success == 1);
}

TEST_CASE("mujoco.tolerance") {
  using dqn_mujoco::Sigmoid;
  using dqn_mujoco::tolerance;
  const double inf = INFINITY;
  // [x, lower, upper, margin, sigmoid, value_at_margin, dm_control's value]
  CHECK(tolerance(1.5, 1.4, inf, 0.35) == 1.0);
  CHECK(tolerance(1.4 - 0.35, 1.4, inf, 0.35) == doctest::Approx(0.1).epsilon(1e-12));  // the value at the margin
  CHECK(tolerance(-1.0, 0.0, 0.0, 2.0) == doctest::Approx(std::pow(0.1, 0.25)).epsilon(1e-12));  // half a margin
  CHECK(tolerance(0.9 - 0.95, 0.9, inf, 1.9, Sigmoid::linear, 0.0) == doctest::Approx(0.5).epsilon(1e-12));
  CHECK(tolerance(-1.5, 0.9, inf, 1.9, Sigmoid::linear, 0.0) == 0.0);
  CHECK(tolerance(0.5, 0.0, 0.0, 1.0, Sigmoid::quadratic, 0.0) == doctest::Approx(0.75).epsilon(1e-12));
  CHECK(tolerance(-1.0, 0.0, 0.0, 1.0, Sigmoid::quadratic, 0.0) == 0.0);
  CHECK(tolerance(0.5, 1.0, inf, 1.0, Sigmoid::linear, 0.0) == doctest::Approx(0.5).epsilon(1e-12));
  CHECK(tolerance(2.0, 0.0, 1.0, 0.0) == 0.0);  // no margin: outside is 0
}

// The reward recomputed from the observation (head height, torso zz, centre-of-mass velocity) and
// the controls the actions mean, as dm_control's suite/humanoid.py writes it.
TEST_CASE("mujoco.humanoid.reward") {
  using dqn_mujoco::Sigmoid;
  using dqn_mujoco::tolerance;
  const double inf = INFINITY;
  for (const auto& [name, speed] : {std::pair{"humanoid_stand", 0.0}, std::pair{"humanoid_walk", 1.0}}) {
    EnvPtr e = make(name, 3, 11);
    Io io(*e);
    std::mt19937_64 g(5);
    for (int t = 0; t < 12; ++t) {
      random_actions(*e, io, g);
      step(*e, io, 0, 3);
      for (std::size_t c = 0; c < 3; ++c) {
        const float* o = io.final_obs.data() + c * io.s;
        const double zx = o[34], zy = o[35], zz = o[36];
        CHECK(std::sqrt(zx * zx + zy * zy + zz * zz) == doctest::Approx(1.0).epsilon(1e-5));
        const double standing = tolerance(o[21], 1.4, inf, 0.35);
        const double upright = tolerance(zz, 0.9, inf, 1.9, Sigmoid::linear, 0.0);
        double control = 0.0;
        for (std::size_t j = 0; j < io.d; ++j)
          control += tolerance(-1.0 + 2.0 * io.actions[c * io.d + j] / 4.0, 0.0, 0.0, 1.0, Sigmoid::quadratic, 0.0);
        const double small_control = (4.0 + control / 21.0) / 5.0;
        const double vx = o[37], vy = o[38];
        const double last = speed == 0.0
                                ? (tolerance(vx, 0.0, 0.0, 2.0) + tolerance(vy, 0.0, 0.0, 2.0)) / 2.0
                                : (5.0 * tolerance(std::hypot(vx, vy), speed, inf, speed, Sigmoid::linear, 0.0) + 1.0) / 6.0;
        CAPTURE(name);
        CAPTURE(t);
        CHECK(io.rewards[c] == doctest::Approx(small_control * standing * upright * last).epsilon(1e-4));
        CHECK(io.rewards[c] >= 0.0f);
        CHECK(io.rewards[c] <= 1.0f);
        CHECK(io.unstable[c] == 0);
        CHECK(io.term[c] == 0);
      }
    }
  }
}

TEST_CASE("mujoco.reacher.episodes") {
  // Every start within reach of a 0.3 tolerance: the first step ends reached (zero controls).
  EnvPtr e = make("reacher", 2, 3, {{"tolerance", "0.3"}, {"target_min", "0"}, {"target_max", "0.05"}});
  Io io(*e);
  std::fill(io.actions.begin(), io.actions.end(), 2);  // the middle of five bins: no torque
  step(*e, io, 0, 2);
  for (std::size_t c = 0; c < 2; ++c) {
    CHECK(io.term[c] == 1);
    CHECK(io.success[c] == 1);
    CHECK(io.trunc[c] == 0);
    const float* f = io.final_obs.data() + c * io.s;
    CHECK(std::hypot(f[8], f[9]) <= 0.3f);
    CHECK(io.rewards[c] == doctest::Approx(-std::hypot(f[8], f[9])).epsilon(1e-5));
    CHECK(std::memcmp(f, io.next.data() + c * io.s, io.s * sizeof(float)) != 0);  // a new episode
  }
  // A tolerance nobody meets: truncated after episode_steps, never a success.
  EnvPtr t = make("reacher", 2, 3, {{"tolerance", "1e-9"}, {"episode_steps", "3"}});
  Io jo(*t);
  std::fill(jo.actions.begin(), jo.actions.end(), 4);
  for (int s = 1; s <= 7; ++s) {
    step(*t, jo, 0, 2);
    for (std::size_t c = 0; c < 2; ++c) {
      CHECK(jo.trunc[c] == (s % 3 == 0 ? 1 : 0));
      CHECK(jo.term[c] == 0);
      CHECK(jo.success[c] == 0);
      const float* f = jo.final_obs.data() + c * jo.s;
      CHECK(jo.rewards[c] == doctest::Approx(-std::hypot(f[8], f[9]) - 0.01 * 2.0).epsilon(1e-5));
    }
  }
}

TEST_CASE("mujoco.determinism") {
  // [task, copies, options]: the reacher's short episodes reset copies inside the run.
  const std::vector<std::tuple<std::string, int, Overrides>> cases = {
      {"humanoid_walk", 4, {}},
      {"reacher", 6, {{"episode_steps", "5"}}},
  };
  for (const auto& [name, n, over] : cases) {
    CAPTURE(name);
    EnvPtr a = make(name, n, 42, over), b = make(name, n, 42, over), c = make(name, n, 42, over),
           d = make(name, n, 42, over), other = make(name, n, 43, over);
    CHECK(reset(*a, 42) == reset(*b, 42));
    CHECK(reset(*a, 42) != reset(*other, 43));
    const int steps = 12;
    const auto whole = run(*a, steps, 7);
    CHECK(run(*b, steps, 7) == whole);
    CHECK(run(*c, steps, 7, n / 2 - 1) == whole);       // two ranges in turn
    CHECK(run(*d, steps, 7, n / 2 + 1, true) == whole);  // two ranges on two threads
    CHECK(run(*other, steps, 7) != whole);
    // reset(seed) starts the same episodes again, whatever came before
    reset(*a, 42);
    CHECK(run(*a, steps, 7) == whole);
  }
}

TEST_CASE("mujoco.resume") {
  const std::vector<std::tuple<std::string, int, Overrides>> cases = {
      {"humanoid_stand", 2, {}},
      {"reacher", 5, {{"episode_steps", "7"}}},  // episodes end (and draw from the streams) after the load
  };
  for (const auto& [name, n, over] : cases) {
    CAPTURE(name);
    EnvPtr a = make(name, n, 1, over);
    run(*a, 10, 100);
    MemoryState saved;
    REQUIRE_MESSAGE(a->save_state(saved) == 0, saved.error);
    for (const char* key : {"time", "qpos", "qvel", "ctrl", "qacc_warmstart", "steps", "rng"})
      CHECK_MESSAGE(saved.tensors.count(key) == 1, key);
    const auto after = run(*a, 12, 200);

    EnvPtr b = make(name, n, 999, over);
    REQUIRE_MESSAGE(b->load_state(saved) == 0, saved.error);
    CHECK(run(*b, 12, 200) == after);  // bit for bit
    CHECK(same_state(*a, *b));          // and in double precision (float32 outputs would hide 1e-16)

    // Refused states change nothing: c goes on exactly as its twin that loaded nothing.
    EnvPtr c = make(name, n, 5, over), twin = make(name, n, 5, over);
    run(*c, 3, 300);
    run(*twin, 3, 300);
    auto refused = [&](MemoryState bad, const std::string& want) {
      CHECK(c->load_state(bad) != 0);
      CHECK_MESSAGE(bad.error.find(want) != std::string::npos, bad.error);
    };
    MemoryState missing = saved;
    missing.tensors.erase("qvel");
    refused(missing, "no tensor qvel");
    MemoryState shape = saved;
    shape.tensors["qpos"].shape[1] += 1;
    refused(shape, "tensor qpos has another type or shape");
    MemoryState nan = saved;
    tensor_data<double>(nan, "qpos")[1] = NAN;
    refused(nan, "qpos[0, 1] in memory is nan, not a number MuJoCo takes");
    MemoryState huge = saved;
    tensor_data<double>(huge, "qvel")[n * (huge.tensors["qvel"].shape[1]) - 1] = 1e300;
    refused(huge, "qvel[" + std::to_string(n - 1) + ", " + std::to_string(huge.tensors["qvel"].shape[1] - 1) +
                      "] in memory is 1e+300, not a number MuJoCo takes (finite, within ±1e10)");
    MemoryState late = saved;
    tensor_data<std::int64_t>(late, "steps")[n - 1] = 1000000;
    refused(late, "steps[" + std::to_string(n - 1) + "] in memory is 1000000, not a step of an episode");
    CHECK(run(*c, 8, 400) == run(*twin, 8, 400));
    CHECK(same_state(*c, *twin));
  }
}

TEST_CASE("mujoco.unstable") {
  // Every first physics step blows up: each control step ends the episode, truncated and unstable.
  EnvPtr e = make("reacher", 3, 1, {{"model", source_file("tests/unit/mujoco_unstable.xml")}});
  CHECK(e->spec().obs_dim == 2 + 1 + 2 + 2);
  Io io(*e);
  std::mt19937_64 g(1);
  for (int t = 0; t < 5; ++t) {
    random_actions(*e, io, g);
    step(*e, io, 0, 3);
    for (std::size_t c = 0; c < 3; ++c) {
      CHECK(io.unstable[c] == 1);
      CHECK(io.trunc[c] == 1);
      CHECK(io.term[c] == 0);
      CHECK(io.success[c] == 0);
      CHECK(std::isfinite(io.rewards[c]));
      CHECK(io.rewards[c] < -0.1f);  // the least a step earns, not a reward for breaking the simulation
    }
    CHECK(all_finite(io.next));
    CHECK(all_finite(io.final_obs));
  }
}

TEST_CASE("mujoco.mujoco_error") {
  // MuJoCo raises an engine error (its stack is too small once the box lands): the step reports the
  // episode unstable and goes on, the process is not ended.
  EnvPtr e = make("reacher", 2, 1,
                  {{"model", source_file("tests/unit/mujoco_stack_overflow.xml")}, {"control_timestep", "0.01"},
                   {"episode_steps", "1000"}, {"target_min", "0.1"}});
  Io io(*e);
  std::fill(io.actions.begin(), io.actions.end(), 2);
  int unstable = 0, first = -1;
  for (int t = 0; t < 60; ++t) {
    step(*e, io, 0, 2);
    if (io.unstable[0] && first < 0) first = t;
    unstable += io.unstable[0] + io.unstable[1];
    CHECK(all_finite(io.next));
    CHECK(all_finite(io.final_obs));
  }
  CHECK(first > 0);       // the box fell for a while first
  CHECK(unstable >= 4);   // and again after each restart
}

TEST_CASE("mujoco.errors") {
  const std::string reacher_xml = source_file("plugins/mujoco/reacher.xml");
  const auto bad_xml = std::filesystem::temp_directory_path() / ("mujoco_test_bad_" + std::to_string(::getpid()) + ".xml");
  std::ofstream(bad_xml) << "<mujoco><worldbody><body name=\"a\"><geom size=\"0.1\"/></worldbody></mujoco>\n";
  // [task, options, what the message must hold]
  const std::vector<std::tuple<std::string, Overrides, std::vector<std::string>>> cases = {
      {"humanoid_stand", {{"model", "/nonexistent/humanoid.xml"}},
       {"humanoid_stand: cannot load the MuJoCo model '/nonexistent/humanoid.xml' (option 'model'): XML parse error"}},
      {"reacher", {{"model", bad_xml.string()}},
       {"reacher: cannot load the MuJoCo model '" + bad_xml.string() + "' (option 'model'): XML parse error", "Line number=1"}},
      {"humanoid_walk", {{"model", reacher_xml}, {"control_timestep", "0.05"}}, {"humanoid_walk: the MuJoCo model '" + reacher_xml + "' must have a free joint"}},
      {"reacher", {{"model", source_file("tests/unit/mujoco_unstable.xml")}, {"control_timestep", "0.025"}},
       {"reacher: option 'control_timestep' = 0.025", "whole number of the physics timestep 0.01"}},
      {"humanoid_stand", {{"bins", "1"}}, {"humanoid_stand: option 'bins' = 1: sub-actions per actuator must be from 2"}},
      {"humanoid_stand", {{"episode_steps", "0"}}, {"humanoid_stand: option 'episode_steps' = 0"}},
      {"humanoid_stand", {{"control_timestep", "0.0123"}}, {"option 'control_timestep' = 0.0123", "timestep 0.005"}},
      {"reacher", {{"tolerance", "0"}}, {"reacher: option 'tolerance' = 0: ", "must be above 0"}},
      {"reacher", {{"control_cost", "-1"}}, {"reacher: option 'control_cost' = -1"}},
      {"reacher", {{"target_min", "0.3"}}, {"reacher: option 'target_min' = 0.3: it is above target_max = 0.2; targets are drawn between the two"}},
      {"reacher", {{"model", default_of("humanoid_stand", "model")}},
       {"reacher: the MuJoCo model '" + default_of("humanoid_stand", "model") + "' has no site named 'fingertip'"}},
  };
  for (const auto& [name, over, wants] : cases) {
    const std::string err = create_error(name, over);
    for (const std::string& w : wants) CHECK_MESSAGE(err.find(w) != std::string::npos, "'" << w << "' not in: " << err);
    CHECK_MESSAGE(err.find('\n') == std::string::npos, err);  // one line, MuJoCo's own text included
  }
  CHECK(create_error("reacher", {}, 0).find("num_envs must be at least 1") != std::string::npos);
  std::filesystem::remove(bad_xml);

  // A range outside the copies is an error, not a write past the arrays.
  EnvPtr e = make("reacher", 2, 1);
  Io io(*e);
  char err[256] = "";
  CHECK(e->step(1, 3, io.view(), err, sizeof err) != 0);
  CHECK(std::string(err) == "reacher: copies [1, 3) are not within the 2 copies");
  CHECK(e->reset(1, -1, 1, io.next.data(), err, sizeof err) != 0);
}
