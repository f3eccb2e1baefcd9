// Unit tests of the batched environment interface, its registry and CartPole-v1.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "training/env/cartpole.hpp"
#include "training/env/env.hpp"

using dqn::CartPoleVecEnv;

namespace {

struct StepOut {
  explicit StepOut(int n) : next(4 * n), final_obs(4 * n), rewards(n), term(n), trunc(n) {}
  std::vector<float> next, final_obs, rewards;
  std::vector<std::uint8_t> term, trunc;
};

void step(dqn::VecEnv& env, const std::vector<std::int32_t>& a, StepOut& o) {
  env.step(a.data(), o.next.data(), o.rewards.data(), o.term.data(), o.trunc.data(),
           o.final_obs.data());
}

void check_state(const CartPoleVecEnv& env, int i, const std::array<double, 4>& want,
                 const StepOut& o) {
  const auto s = env.state(i);
  for (int k = 0; k < 4; ++k) {
    CAPTURE(i);
    CAPTURE(k);
    CHECK(std::fabs(s[static_cast<std::size_t>(k)] - want[static_cast<std::size_t>(k)]) < 1e-12);
    CHECK(std::fabs(o.next[static_cast<std::size_t>(4 * i + k)] - want[static_cast<std::size_t>(k)]) < 1e-6);
  }
}

std::string known_list() {
  std::string s;
  for (const auto& n : dqn::env_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

TEST_CASE("env.registry.builtin_spec") {
  const auto names = dqn::env_names();
  CHECK(std::find(names.begin(), names.end(), "CartPole-v1") != names.end());
  auto env = dqn::make_env("CartPole-v1", 3, 7);
  REQUIRE(env);
  CHECK(env->num_envs() == 3);
  CHECK(env->spec().obs_dim == 4);
  CHECK(env->spec().branch_actions == std::vector<int>{2});
  CHECK(env->spec().max_episode_steps == 500);
  CHECK(env->spec().name == "CartPole-v1");
}

TEST_CASE("env.registry.unknown_name") {
  try {
    dqn::make_env("CartPol-v1", 1, 0);
    FAIL("no exception for an unknown name");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "unknown environment 'CartPol-v1' (known: " + known_list() + ")");
    CHECK(std::string(e.what()).find("CartPole-v1") != std::string::npos);
  }
}

TEST_CASE("env.registry.bad_input") {
  // [name, num_envs, reason]
  CHECK_THROWS_AS(dqn::make_env("CartPole-v1", 0, 0), std::invalid_argument);   // no copies
  CHECK_THROWS_AS(dqn::make_env("CartPole-v1", -2, 0), std::invalid_argument);  // negative
  CHECK_THROWS_AS(dqn::make_env("", 1, 0), std::invalid_argument);              // empty name
  // Duplicates are refused, including the built-in.
  auto factory = [](int n, std::uint64_t s) {
    return std::unique_ptr<dqn::VecEnv>(std::make_unique<CartPoleVecEnv>(n, s));
  };
  CHECK_THROWS_WITH_AS(dqn::register_env("CartPole-v1", factory),
                       "register_env: environment 'CartPole-v1' is already registered",
                       std::invalid_argument);
  CHECK_THROWS_AS(dqn::register_env("", factory), std::invalid_argument);
  CHECK_THROWS_AS(dqn::register_env("Empty-v0", dqn::EnvFactory{}), std::invalid_argument);
}

TEST_CASE("env.registry.register_and_make") {
  dqn::register_env("TestAlias-v0", [](int n, std::uint64_t s) {
    return std::unique_ptr<dqn::VecEnv>(std::make_unique<CartPoleVecEnv>(n, s));
  });
  CHECK_THROWS_AS(dqn::register_env("TestAlias-v0", [](int, std::uint64_t) {
                    return std::unique_ptr<dqn::VecEnv>();
                  }),
                  std::invalid_argument);
  dqn::register_env("TestNull-v0", [](int, std::uint64_t) { return std::unique_ptr<dqn::VecEnv>(); });
  CHECK_THROWS_AS(dqn::make_env("TestNull-v0", 1, 0), std::logic_error);
  const auto names = dqn::env_names();
  CHECK(std::is_sorted(names.begin(), names.end()));
  CHECK(std::find(names.begin(), names.end(), "TestAlias-v0") != names.end());
  auto env = dqn::make_env("TestAlias-v0", 2, 1);
  CHECK(env->num_envs() == 2);
  try {
    dqn::make_env("Nope", 1, 0);
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("CartPole-v1, TestAlias-v0, TestNull-v0") != std::string::npos);
  }
}

TEST_CASE("env.cartpole.dynamics_from_rest") {
  // From the zero state sinθ = 0, cosθ = 1: temp = ±10/1.1, thetaacc = ∓600/41, xacc = ±400/41.
  // Step 1 (Euler: positions use the old velocities): x = 0, x_dot = ±8/41, θ = 0, θ_dot = ∓12/41.
  // Step 2 still has θ = 0 when accelerating: x = ±0.16/41, x_dot = ±16/41, θ = ∓0.24/41,
  // θ_dot = ∓24/41.
  CartPoleVecEnv env(2, 0);
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
  CartPoleVecEnv env(2, 0);
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
    CartPoleVecEnv env(1, 5);
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
  CartPoleVecEnv env(N, 11);
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
    CartPoleVecEnv env(N, 0);
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
  CartPoleVecEnv env(N, 42);
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
  CartPoleVecEnv env(2, 0);
  StepOut o(2);
  const auto before = env.state(0);
  CHECK_THROWS_WITH_AS(step(env, {1, 2}, o),
                       "CartPole-v1: action 2 for copy 1 is out of range (0 push left, 1 push right)",
                       std::invalid_argument);
  CHECK(env.state(0) == before);  // nothing stepped
  CHECK_THROWS_AS(step(env, {-1, 0}, o), std::invalid_argument);
  CHECK_THROWS_AS(CartPoleVecEnv(0, 0), std::invalid_argument);
}

TEST_CASE("env.cartpole.random_policy_episode_length") {
  // A uniformly random policy keeps CartPole up for about 22 steps on average.
  constexpr int N = 16;
  CartPoleVecEnv env(N, 2024);
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
