// Unit tests of the engine's side of environments (VecEnv over a thread pool, the program's own
// environments, make_env) and of the cartpole plugin's CartPole-v1 through it.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dqn/env_base.hpp"
#include "training/env/vec_env.hpp"

namespace {

namespace st = dqn::st;

struct StepOut {
  explicit StepOut(int n, int s = 4) : next(s * n), final_obs(s * n), rewards(n), term(n), trunc(n) {}
  std::vector<float> next, final_obs, rewards;
  std::vector<std::uint8_t> term, trunc;
};

void step(dqn::VecEnv& env, const std::vector<std::int32_t>& a, StepOut& o) {
  env.step(a.data(), o.next.data(), o.rewards.data(), o.term.data(), o.trunc.data(), o.final_obs.data());
}

/// CartPole-v1 from its plugin, with its state read and written through save_state/load_state.
class Cart {
 public:
  Cart(int n, std::uint64_t seed, int threads = 1) : env_(dqn::make_env("CartPole-v1", n, seed, threads)) {}
  operator dqn::VecEnv&() { return *env_; }
  void reset(std::uint64_t seed, float* obs) { env_->reset(seed, obs); }
  std::array<double, 4> state(int i) const {
    const st::File f = saved();
    std::array<double, 4> s{};
    const char* names[] = {"x", "x_dot", "theta", "theta_dot"};
    for (int k = 0; k < 4; ++k) s[std::size_t(k)] = column(f, names[k])[std::size_t(i)];
    return s;
  }
  void set_state(int i, const std::array<double, 4>& s) {
    st::File f = saved();
    const char* names[] = {"x", "x_dot", "theta", "theta_dot"};
    for (int k = 0; k < 4; ++k) {
      std::vector<double> v = column(f, names[k]);
      v[std::size_t(i)] = s[std::size_t(k)];
      f.put_raw(std::string("env/") + names[k], st::DType::F64, {env_->num_envs()}, v.data());
    }
    env_->load_state(f, "env/");
  }
  int episode_steps(int i) const {
    const st::File f = saved();
    std::vector<std::int32_t> v(std::size_t(env_->num_envs()));
    f.get_raw("env/episode_steps", st::DType::I32, {env_->num_envs()}, v.data());
    return v[std::size_t(i)];
  }

 private:
  st::File saved() const {
    st::File f;
    env_->save_state(f, "env/");
    return f;
  }
  std::vector<double> column(const st::File& f, const char* name) const {
    std::vector<double> v(std::size_t(env_->num_envs()));
    f.get_raw(std::string("env/") + name, st::DType::F64, {env_->num_envs()}, v.data());
    return v;
  }
  std::unique_ptr<dqn::VecEnv> env_;
};

void step(Cart& env, const std::vector<std::int32_t>& a, StepOut& o) { step(static_cast<dqn::VecEnv&>(env), a, o); }

void check_state(const Cart& env, int i, const std::array<double, 4>& want, const StepOut& o) {
  const auto s = env.state(i);
  for (int k = 0; k < 4; ++k) {
    CAPTURE(i);
    CAPTURE(k);
    CHECK(std::fabs(s[static_cast<std::size_t>(k)] - want[static_cast<std::size_t>(k)]) < 1e-12);
    CHECK(std::fabs(o.next[static_cast<std::size_t>(4 * i + k)] - want[static_cast<std::size_t>(k)]) < 1e-6);
  }
}

/// A program's own environment: one feature that counts steps, two branches of 3 bins; copy `bad`
/// hands out a NaN at step `nan_at`, and every copy reports itself unstable at step `unstable_at`.
class Counter final : public dqn::EnvBase {
 public:
  explicit Counter(const dqn::EnvCreateInfo& info) : EnvBase(info), t_(std::size_t(num_envs()), 0) {
    set_spec(1, {dqn::EnvBranch{3, 1, -1.0, 1.0, "a"}, dqn::EnvBranch{3, 0, 0.0, 0.0, "b"}}, 10, true);
  }
  void reset_copies(std::uint64_t, int begin, int end, float* obs) override {
    for (int i = begin; i < end; ++i) {
      t_[std::size_t(i)] = 0;
      if (obs) obs[i] = 0.0f;
    }
  }
  void step_copies(int begin, int end, const dqn::EnvStep& io) override {
    for (int i = begin; i < end; ++i) {
      const int t = ++t_[std::size_t(i)];
      io.rewards[i] = float(io.actions[2 * i]) + float(control(0, io.actions[2 * i]));
      io.final_obs[i] = io.next_obs[i] = (i == bad && t == nan_at) ? NAN : float(t);
      io.terminated[i] = 0;
      io.truncated[i] = t >= 10;
      io.unstable[i] = t == unstable_at;
      io.success[i] = t >= 10 && i % 2 == 0;
      if (t >= 10 || t == unstable_at) t_[std::size_t(i)] = 0;
    }
  }
  void save(dqn::StateOut& out) const override { out.put("t", t_); }
  void load(const dqn::StateIn& in) override { t_ = in.get<std::int32_t>("t", {num_envs()}); }
  static inline int bad = -1, nan_at = -1, unstable_at = -1;

 private:
  std::vector<std::int32_t> t_;
};

void register_counter() {
  static const bool once = [] {
    dqn::register_env("Counter-v0", [](const dqn::EnvCreateInfo& info) { return std::make_unique<Counter>(info); });
    return true;
  }();
  (void)once;
}

}  // namespace

TEST_CASE("env.plugin.cartpole_spec") {
  auto env = dqn::make_env("CartPole-v1", 3, 7);
  REQUIRE(env);
  CHECK(env->num_envs() == 3);
  CHECK(env->obs_dim() == 4);
  CHECK(env->branch_actions() == std::vector<int>{2});
  CHECK(env->spec().max_episode_steps == 500);
  CHECK(std::string(env->spec().name) == "CartPole-v1");
  CHECK(env->label() == "cartpole:CartPole-v1");
  // By the plugin's name, and with an option.
  dqn::EnvChoice c;
  c.plugin = "cartpole";
  c.options["max_episode_steps"] = std::int64_t(200);
  CHECK(dqn::make_env(c, 1, 0)->spec().max_episode_steps == 200);
}

TEST_CASE("env.plugin.unknown_and_bad_input") {
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("(no exception)");
  };
  CHECK(message([] { dqn::make_env("CartPol-v1", 1, 0); }).find("unknown environment 'CartPol-v1', did you mean 'CartPole-v1'?") == 0);
  CHECK(message([] { dqn::make_env("c51", 1, 0); }).find("plugin 'c51' is a loss head, not an environment") == 0);
  dqn::EnvChoice c;
  c.plugin = "cartpole";
  c.task = "Pendulum-v1";
  CHECK(message([&] { dqn::make_env(c, 1, 0); }) == "plugin 'cartpole' has no task 'Pendulum-v1' (its tasks: CartPole-v1)");
  c.task.clear();
  c.options["max_episode_steps"] = std::int64_t(0);
  CHECK(message([&] { dqn::make_env(c, 1, 0); }).find("'training.env.max_episode_steps' = '0': must be in [1, 1e+09]") !=
        std::string::npos);
  CHECK_THROWS_AS(dqn::make_env("CartPole-v1", 0, 0), std::invalid_argument);   // no copies
  CHECK_THROWS_AS(dqn::make_env("CartPole-v1", -2, 0), std::invalid_argument);  // negative
  CHECK_THROWS_AS(dqn::make_env("", 1, 0), std::invalid_argument);              // no name
}

TEST_CASE("env.program.register_and_make") {
  register_counter();
  auto f = [](const dqn::EnvCreateInfo& info) { return std::make_unique<Counter>(info); };
  CHECK_THROWS_WITH_AS(dqn::register_env("Counter-v0", f), "register_env: environment 'Counter-v0' is already registered",
                       std::invalid_argument);
  CHECK_THROWS_AS(dqn::register_env("", f), std::invalid_argument);
  CHECK_THROWS_AS(dqn::register_env("Empty-v0", dqn::EnvFactory{}), std::invalid_argument);
  dqn::register_env("Null-v0", [](const dqn::EnvCreateInfo&) { return std::unique_ptr<dqn::Env>(); });
  CHECK_THROWS_AS(dqn::make_env("Null-v0", 1, 0), std::logic_error);
  const auto names = dqn::program_env_names();
  CHECK(std::is_sorted(names.begin(), names.end()));
  auto env = dqn::make_env("Counter-v0", 2, 1);
  CHECK(env->num_envs() == 2);
  CHECK(env->label() == "Counter-v0");
  CHECK(env->branch_actions() == std::vector<int>{3, 3});
}

TEST_CASE("env.vec.actions_checked_before_any_copy_moves") {
  register_counter();
  auto env = dqn::make_env("Counter-v0", 2, 0);
  StepOut o(2, 1);
  step(*env, {0, 0, 2, 2}, o);
  CHECK(o.next == std::vector<float>{1.0f, 1.0f});
  CHECK_THROWS_WITH_AS(step(*env, {0, 0, 2, 3}, o),
                       "environment Counter-v0: action 3 for copy 1, branch 1 is out of range (0 to 2)",
                       std::invalid_argument);
  step(*env, {1, 0, 1, 0}, o);
  CHECK(o.next == std::vector<float>{2.0f, 2.0f});  // the refused step moved nothing
  CHECK(o.rewards == std::vector<float>{1.0f, 1.0f});  // bin 1 of 3 over [-1, 1] is the control 0
}

TEST_CASE("env.vec.non_finite_refused_and_unstable_counted") {
  register_counter();
  Counter::bad = 1;
  Counter::nan_at = 3;
  auto env = dqn::make_env("Counter-v0", 3, 0, 2);
  StepOut o(3, 1);
  const std::vector<std::int32_t> a(6, 0);
  step(*env, a, o);
  step(*env, a, o);
  CHECK_THROWS_WITH_AS(step(*env, a, o),
                       "environment Counter-v0: copy 1 handed out an observation = nan (an environment must end an "
                       "unstable episode, never pass a non-finite value on)",
                       std::runtime_error);
  Counter::bad = -1;
  Counter::unstable_at = 2;
  auto fresh = dqn::make_env("Counter-v0", 3, 0, 2);
  step(*fresh, a, o);
  CHECK(fresh->unstable_episodes() == 0);
  step(*fresh, a, o);
  CHECK(fresh->unstable_episodes() == 3);
  CHECK(o.trunc == std::vector<std::uint8_t>{1, 1, 1});
  CHECK(fresh->unstable() == std::vector<std::uint8_t>{1, 1, 1});
  // The count is part of the saved state.
  st::File f;
  fresh->save_state(f, "env/");
  auto other = dqn::make_env("Counter-v0", 3, 0, 1);
  other->load_state(f, "env/");
  CHECK(other->unstable_episodes() == 3);
  Counter::unstable_at = -1;
}

TEST_CASE("env.vec.threads_give_the_numbers_of_one") {
  // CartPole-v1 over 1, 2, 3 and 8 threads: the same observations, rewards and flags.
  constexpr int N = 8;
  auto rollout = [](int threads) {
    auto env = dqn::make_env("CartPole-v1", N, 5, threads);
    CHECK(env->threads() == threads);
    std::vector<float> trace(4 * N);
    env->reset(5, trace.data());
    StepOut o(N);
    std::vector<std::int32_t> a(N);
    std::mt19937_64 rng(3);
    for (int t = 0; t < 200; ++t) {
      for (auto& x : a) x = static_cast<std::int32_t>(rng() & 1);
      step(*env, a, o);
      trace.insert(trace.end(), o.next.begin(), o.next.end());
      trace.insert(trace.end(), o.final_obs.begin(), o.final_obs.end());
      for (int i = 0; i < N; ++i) trace.push_back(float(o.term[std::size_t(i)] + 2 * o.trunc[std::size_t(i)]));
    }
    return trace;
  };
  const auto one = rollout(1);
  for (int t : {2, 3, 8}) {
    CAPTURE(t);
    CHECK(rollout(t) == one);
  }
  CHECK(dqn::env_threads(4, 2) == 2);
  CHECK(dqn::env_threads(0, 1000) == 0);  // chosen by the VecEnv once it has timed its steps
  // The choice: one thread per 50 µs of a step's work, within the cores the learner leaves.
  const int cores = std::max(1, int(std::thread::hardware_concurrency()) - 1);
  CHECK(dqn::auto_threads(1e-6, 8) == 1);
  CHECK(dqn::auto_threads(1e-3, 64) == std::min(20, cores));
  CHECK(dqn::auto_threads(1e-3, 3) == std::min(3, cores));
  // CartPole's step is far cheaper than that: auto stays on one thread.
  auto cheap = dqn::make_env("CartPole-v1", N, 5, 0);
  StepOut o(N);
  for (int t = 0; t < 2 * dqn::kAutoProbeSteps; ++t) step(*cheap, std::vector<std::int32_t>(N, 1), o);
  CHECK(cheap->threads() == 1);
}

TEST_CASE("env.cartpole.dynamics_from_rest") {
  // From the zero state sinθ = 0, cosθ = 1: temp = ±10/1.1, thetaacc = ∓600/41, xacc = ±400/41.
  // Step 1 (Euler: positions use the old velocities): x = 0, x_dot = ±8/41, θ = 0, θ_dot = ∓12/41.
  // Step 2 still has θ = 0 when accelerating: x = ±0.16/41, x_dot = ±16/41, θ = ∓0.24/41,
  // θ_dot = ∓24/41.
  Cart env(2, 0);
  env.set_state(0, {0, 0, 0, 0});
  env.set_state(1, {0, 0, 0, 0});
  StepOut o(2);
  step(env, {1, 0}, o);
  check_state(env, 0, {0.0, 8.0 / 41, 0.0, -12.0 / 41}, o);
  check_state(env, 1, {0.0, -8.0 / 41, 0.0, 12.0 / 41}, o);
  step(env, {1, 0}, o);
  check_state(env, 0, {0.16 / 41, 16.0 / 41, -0.24 / 41, -24.0 / 41}, o);
  check_state(env, 1, {-0.16 / 41, -16.0 / 41, 0.24 / 41, 24.0 / 41}, o);
  // Step 3 with θ ≠ 0 (values from a Python transcription of Gym's cartpole.py).
  step(env, {1, 0}, o);
  check_state(env, 0, {0.011707317073170733, 0.58544735551625904, -0.017560975609756099,
                       -0.87988698253885533}, o);
  check_state(env, 1, {-0.011707317073170733, -0.58544735551625904, 0.017560975609756099,
                       0.87988698253885533}, o);
  for (int i = 0; i < 2; ++i) {
    CHECK(o.rewards[static_cast<std::size_t>(i)] == 1.0f);
    CHECK(o.term[static_cast<std::size_t>(i)] == 0);
    CHECK(o.trunc[static_cast<std::size_t>(i)] == 0);
    CHECK(env.episode_steps(i) == 3);
  }
  CHECK(o.final_obs == o.next);
}

TEST_CASE("env.cartpole.dynamics_general_state") {
  // Both actions, nonzero θ and θ_dot (Python transcription of Gym's cartpole.py, "euler").
  Cart env(2, 0);
  env.set_state(0, {0.03, -0.2, 0.1, 0.5});
  env.set_state(1, {-1.0, 0.7, -0.15, -0.3});
  StepOut o(2);
  step(env, {1, 0}, o);
  check_state(env, 0, {0.025999999999999999, -0.006419476403295904, 0.11, 0.24043088355103481}, o);
  check_state(env, 1, {-0.98599999999999999, 0.50729890304367453, -0.156, -0.05812890391179254}, o);
  step(env, {0, 0}, o);
  check_state(env, 0, {0.025871610471934082, -0.20292682222242187, 0.1148086176710207,
                       0.56568521600247268}, o);
  check_state(env, 1, {-0.97585402193912651, 0.31471773993900753, -0.15716257807823586,
                       0.18155677013935206}, o);
  step(env, {1, 1}, o);
  check_state(env, 0, {0.021813074027485644, -0.0095868518842384398, 0.12612232199107015,
                       0.31126410633542645}, o);
  check_state(env, 1, {-0.96955966714034636, 0.51169858060550832, -0.15353144267544883,
                       -0.15628873271351101}, o);
}

TEST_CASE("env.cartpole.termination_bounds") {
  constexpr double th = 12.0 * 2.0 * 3.14159265358979323846 / 360.0;
  struct Case {
    std::array<double, 4> s;
    bool terminates;
    const char* why;
  };
  // Velocities chosen so that x' = x + 0.02 x_dot and θ' = θ + 0.02 θ_dot land where wanted.
  const Case cases[] = {
      {{2.39, 1.0, 0.0, 0.0}, true, "x goes to 2.41 > 2.4"},
      {{-2.39, -1.0, 0.0, 0.0}, true, "x goes to -2.41 < -2.4"},
      {{2.4, 0.0, 0.0, 0.0}, false, "x stays at exactly 2.4: the bound is strict"},
      {{-2.4, 0.0, 0.0, 0.0}, false, "x stays at exactly -2.4"},
      {{2.3, 1.0, 0.0, 0.0}, false, "x goes to 2.32, inside"},
      {{0.0, 0.0, th - 0.001, 0.1}, true, "θ goes past +12°"},
      {{0.0, 0.0, -th + 0.001, -0.1}, true, "θ goes past -12°"},
      {{0.0, 0.0, th - 0.003, 0.1}, false, "θ stays just under 12°"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.why);
    Cart env(1, 5);
    env.set_state(0, c.s);
    StepOut o(1);
    step(env, {1}, o);
    CHECK(o.term[0] == (c.terminates ? 1 : 0));
    CHECK(o.trunc[0] == 0);
    CHECK(o.rewards[0] == 1.0f);  // the terminal step is rewarded too
    if (c.terminates) {
      // final_obs is the state that ended it; next obs is a fresh reset state.
      const bool out_x = std::fabs(o.final_obs[0]) > 2.4f;
      const bool out_th = std::fabs(o.final_obs[2]) > static_cast<float>(th);
      CHECK((out_x || out_th));
      for (int k = 0; k < 4; ++k) CHECK(std::fabs(o.next[static_cast<std::size_t>(k)]) <= 0.05f);
      CHECK(env.episode_steps(0) == 0);
    } else {
      CHECK(o.final_obs == o.next);
      CHECK(env.episode_steps(0) == 1);
    }
  }
}

TEST_CASE("env.cartpole.truncation_at_500") {
  // A linear controller that keeps the pole up: the episode must end by the time limit alone.
  constexpr int N = 4;
  Cart env(N, 11);
  std::vector<float> obs(4 * N);
  env.reset(11, obs.data());
  StepOut o(N);
  std::vector<std::int32_t> a(N);
  for (int t = 1; t <= 500; ++t) {
    for (int i = 0; i < N; ++i) {
      const float* s = &obs[static_cast<std::size_t>(4 * i)];
      a[static_cast<std::size_t>(i)] = (0.1f * s[0] + 0.5f * s[1] + 10.0f * s[2] + 2.0f * s[3]) > 0 ? 1 : 0;
    }
    step(env, a, o);
    for (int i = 0; i < N; ++i) {
      const auto k = static_cast<std::size_t>(i);
      CAPTURE(t);
      CAPTURE(i);
      REQUIRE(o.term[k] == 0);
      CHECK(o.rewards[k] == 1.0f);
      CHECK(o.trunc[k] == (t == 500 ? 1 : 0));
      if (t == 500) {
        CHECK(env.episode_steps(i) == 0);  // auto-reset
        for (int j = 0; j < 4; ++j) CHECK(std::fabs(o.next[4 * k + static_cast<std::size_t>(j)]) <= 0.05f);
      }
    }
    if (t == 500) {
      // final_obs is the last state before the reset, not the reset state.
      CHECK(o.final_obs != o.next);
    } else {
      CHECK(o.final_obs == o.next);
    }
    obs = o.next;
  }
  // The next episode counts from 1 again.
  step(env, a, o);
  for (int i = 0; i < N; ++i) CHECK(env.episode_steps(i) == 1);
}

TEST_CASE("env.cartpole.reset_determinism") {
  constexpr int N = 8;
  auto rollout = [](std::uint64_t seed) {
    Cart env(N, 0);
    std::vector<float> trace(4 * N);
    env.reset(seed, trace.data());
    StepOut o(N);
    std::vector<std::int32_t> a(N);
    std::mt19937_64 rng(99);
    for (int t = 0; t < 300; ++t) {
      for (auto& x : a) x = static_cast<std::int32_t>(rng() & 1);
      step(env, a, o);
      trace.insert(trace.end(), o.next.begin(), o.next.end());
      trace.insert(trace.end(), o.final_obs.begin(), o.final_obs.end());
    }
    return trace;
  };
  const auto a1 = rollout(42), a2 = rollout(42), b = rollout(43);
  CHECK(a1 == a2);
  CHECK(a1 != b);
  // Copies differ from each other, and every reset state lies in [-0.05, 0.05).
  Cart env(N, 42);
  std::vector<float> obs(4 * N);
  env.reset(42, obs.data());
  for (float v : obs) CHECK(std::fabs(v) <= 0.05f);
  for (int i = 1; i < N; ++i)
    CHECK(!std::equal(obs.begin(), obs.begin() + 4, obs.begin() + 4 * i));
  // make_env's seed is the same as reset's.
  auto made = dqn::make_env("CartPole-v1", N, 42);
  std::vector<float> from_make(4 * N), from_reset(4 * N);
  StepOut o1(N), o2(N);
  std::vector<std::int32_t> ones(N, 1);
  step(*made, ones, o1);
  env.reset(42, from_reset.data());
  step(env, ones, o2);
  CHECK(o1.next == o2.next);
}

TEST_CASE("env.cartpole.bad_action") {
  Cart env(2, 0);
  StepOut o(2);
  const auto before = env.state(0);
  CHECK_THROWS_WITH_AS(step(env, {1, 2}, o),
                       "environment cartpole:CartPole-v1: action 2 for copy 1, branch 0 is out of range (0 to 1)",
                       std::invalid_argument);
  CHECK(env.state(0) == before);  // nothing stepped
  CHECK_THROWS_AS(step(env, {-1, 0}, o), std::invalid_argument);
  CHECK_THROWS_AS(dqn::make_env("CartPole-v1", 0, 0), std::invalid_argument);
}

TEST_CASE("env.cartpole.random_policy_episode_length") {
  // A uniformly random policy keeps CartPole up for about 22 steps on average.
  constexpr int N = 16;
  Cart env(N, 2024);
  std::vector<float> obs(4 * N);
  env.reset(2024, obs.data());
  StepOut o(N);
  std::vector<std::int32_t> a(N);
  std::mt19937_64 rng(7);
  std::vector<int> len(N, 0);
  long episodes = 0, steps = 0;
  while (episodes < 500) {
    for (auto& x : a) x = static_cast<std::int32_t>(rng() & 1);
    step(env, a, o);
    for (int i = 0; i < N && episodes < 500; ++i) {
      const auto k = static_cast<std::size_t>(i);
      ++len[k];
      if (o.term[k] || o.trunc[k]) {
        steps += len[k];
        len[k] = 0;
        ++episodes;
      }
    }
  }
  const double mean = static_cast<double>(steps) / static_cast<double>(episodes);
  MESSAGE("random policy mean episode length " << mean);
  CHECK(mean > 15.0);
  CHECK(mean < 30.0);
}
