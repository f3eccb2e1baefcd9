// Unit tests of the sum tree, the n-step replay buffer (uniform and prioritized) and schedules.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "training/replay.hpp"
#include "training/schedule.hpp"

using dqn::Batch;
using dqn::ReplayBuffer;
using dqn::SumTree;

namespace {

constexpr double kChi2Crit7 = 24.32;  // 99.9% critical value, 7 degrees of freedom

double chi_square(const std::vector<long>& counts, const std::vector<double>& probs) {
  long total = 0;
  for (long c : counts) total += c;
  double chi2 = 0.0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double expected = probs[i] * static_cast<double>(total);
    const double d = static_cast<double>(counts[i]) - expected;
    chi2 += d * d / expected;
  }
  return chi2;
}

std::vector<double> normalised(std::vector<double> w) {
  double s = 0.0;
  for (double x : w) s += x;
  for (double& x : w) x /= s;
  return w;
}

/// One step of a single-env buffer with 2-dim observations.
void add1(ReplayBuffer& rb, std::vector<float> obs, std::int32_t action, float reward,
          std::vector<float> next, bool term = false, bool trunc = false) {
  const std::uint8_t te = term ? 1 : 0, tr = trunc ? 1 : 0;
  rb.add(obs.data(), &action, &reward, next.data(), &te, &tr);
}

/// Observation of step t in the hand examples: {t, 10 + t}.
std::vector<float> s(int t) { return {static_cast<float>(t), 10.0f + static_cast<float>(t)}; }

void check_slot(const ReplayBuffer& rb, std::int64_t i, int state_t, std::int32_t action,
                double reward, int next_t, float done) {
  CAPTURE(i);
  CHECK(rb.state_at(i)[0] == static_cast<float>(state_t));
  CHECK(rb.state_at(i)[1] == 10.0f + static_cast<float>(state_t));
  CHECK(rb.action_at(i)[0] == action);
  CHECK(rb.reward_at(i) == doctest::Approx(reward).epsilon(1e-6));
  CHECK(rb.next_state_at(i)[0] == static_cast<float>(next_t));
  CHECK(rb.next_state_at(i)[1] == 10.0f + static_cast<float>(next_t));
  CHECK(rb.done_at(i) == done);
}

}  // namespace

// ---------------------------------------------------------------- sum tree

TEST_CASE("replay.sum_tree.total_and_find") {
  SumTree t(5);  // not a power of two: padding leaves must never be found
  CHECK(t.capacity() == 5);
  CHECK(t.total() == 0.0);
  CHECK(std::isinf(t.min_positive()));
  CHECK_THROWS_AS(t.find(0.0), std::logic_error);  // nothing to find yet
  const double p[] = {1, 0, 3, 2, 4};
  for (int i = 0; i < 5; ++i) t.set(i, p[i]);
  CHECK(t.total() == 10.0);
  CHECK(t.min_positive() == 1.0);
  for (int i = 0; i < 5; ++i) CHECK(t.p(i) == p[i]);
  // [prefix, leaf, reason]
  struct Case { double prefix; std::int64_t leaf; const char* why; };
  const Case cases[] = {
      {0.0, 0, "start of the first interval"},
      {0.999, 0, "end of [0, 1)"},
      {1.0, 2, "leaf 1 has p = 0 and is skipped"},
      {3.999, 2, "end of [1, 4)"},
      {4.0, 3, "start of [4, 6)"},
      {5.5, 3, "inside [4, 6)"},
      {6.0, 4, "start of [6, 10)"},
      {9.999, 4, "end of [6, 10)"},
      {10.0, 4, "prefix == total (rounding) → last positive leaf"},
      {12.0, 4, "prefix past the total is clamped"},
      {-1.0, 0, "negative prefix is clamped to 0"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.why);
    CHECK(t.find(c.prefix) == c.leaf);
  }
  t.set(2, 0.5);
  CHECK(t.total() == doctest::Approx(7.5));
  CHECK(t.min_positive() == 0.5);
  CHECK(t.find(1.4) == 2);
  CHECK(t.find(1.5) == 3);
  t.set(2, 0.0);
  CHECK(t.min_positive() == 1.0);
  CHECK(t.find(1.0) == 3);
  // A zero leaf at the end is never returned, even for prefix >= total.
  SumTree u(3);
  u.set(0, 1.0);
  u.set(1, 2.0);
  CHECK(u.find(3.0) == 1);
  CHECK(u.find(100.0) == 1);
}

TEST_CASE("replay.sum_tree.bad_input") {
  CHECK_THROWS_AS(SumTree(0), std::invalid_argument);
  CHECK_THROWS_AS(SumTree(-3), std::invalid_argument);
  SumTree t(4);
  CHECK_THROWS_AS(t.set(-1, 1.0), std::out_of_range);
  CHECK_THROWS_AS(t.set(4, 1.0), std::out_of_range);
  CHECK_THROWS_AS(t.set(0, -0.5), std::invalid_argument);
  CHECK_THROWS_AS(t.set(0, std::numeric_limits<double>::quiet_NaN()), std::invalid_argument);
  CHECK_THROWS_AS(t.set(0, std::numeric_limits<double>::infinity()), std::invalid_argument);
  CHECK_THROWS_AS(t.p(4), std::out_of_range);
  t.set(1, 1.0);
  CHECK_THROWS_AS(t.find(std::numeric_limits<double>::quiet_NaN()), std::invalid_argument);
}

TEST_CASE("replay.sum_tree.many_updates_keep_sums_exact") {
  // Parents are recomputed from children, so totals do not drift over many updates.
  SumTree t(1000);
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.0, 5.0);
  std::vector<double> v(1000, 0.0);
  for (int k = 0; k < 100000; ++k) {
    const auto i = static_cast<std::size_t>(rng() % 1000);
    v[i] = u(rng);
    t.set(static_cast<std::int64_t>(i), v[i]);
  }
  double sum = 0.0, mn = std::numeric_limits<double>::infinity();
  for (double x : v) {
    sum += x;
    if (x > 0) mn = std::min(mn, x);
  }
  CHECK(t.total() == doctest::Approx(sum).epsilon(1e-12));
  CHECK(t.min_positive() == mn);
}

TEST_CASE("replay.sum_tree.sampling_chi_square") {
  SumTree t(8);
  std::vector<double> p;
  for (int i = 0; i < 8; ++i) {
    t.set(i, i + 1.0);
    p.push_back(i + 1.0);
  }
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<long> counts(8, 0);
  for (int k = 0; k < 200000; ++k) ++counts[static_cast<std::size_t>(t.find(u(rng) * t.total()))];
  const double chi2 = chi_square(counts, normalised(p));
  MESSAGE("sum tree chi-square (7 dof) " << chi2);
  CHECK(chi2 < kChi2Crit7);
  // The test has power: the same counts are far from uniform.
  CHECK(chi_square(counts, std::vector<double>(8, 0.125)) > 1000.0);
}

// ---------------------------------------------------------------- sampling

TEST_CASE("replay.prioritized.sampling_chi_square") {
  // Priorities 1..8 with alpha 0.5: P(i) ∝ sqrt(i + 1), drawn through stratified batches.
  const double eps = 1e-6;
  ReplayBuffer rb(8, 2, 1, 1, 0.99, 1, true, 0.5, eps);
  for (int t = 0; t < 8; ++t) add1(rb, s(t), t, 0.0f, s(t + 1));
  std::vector<std::int64_t> idx(8);
  std::vector<float> td(8);
  std::vector<double> want;
  for (int i = 0; i < 8; ++i) {
    idx[static_cast<std::size_t>(i)] = i;
    td[static_cast<std::size_t>(i)] = static_cast<float>(i + 1);
    want.push_back(std::sqrt(i + 1.0 + eps));
  }
  rb.update_priorities(idx.data(), td.data(), 8);
  std::mt19937_64 rng(777);
  Batch b;
  std::vector<long> counts(8, 0);
  for (int k = 0; k < 25000; ++k) {
    rb.sample(8, 0.4, rng, b);
    for (std::size_t r = 0; r < 8; ++r) {
      const auto i = b.indices[r];
      ++counts[static_cast<std::size_t>(i)];
      // The row holds the slot's own data.
      CHECK(b.states[2 * r] == static_cast<float>(i));
      CHECK(b.actions[r] == i);
    }
  }
  // Stratified draws vary less than independent ones, so this chi-square is conservative.
  const double chi2 = chi_square(counts, normalised(want));
  MESSAGE("prioritized replay chi-square (7 dof) " << chi2);
  CHECK(chi2 < kChi2Crit7);
  // alpha is applied: proportional to p (alpha = 1) would be rejected.
  std::vector<double> linear;
  for (int i = 0; i < 8; ++i) linear.push_back(i + 1.0);
  CHECK(chi_square(counts, normalised(linear)) > 100.0);
}

TEST_CASE("replay.uniform.sampling") {
  ReplayBuffer rb(8, 2, 1, 1, 0.99, 1, false, 0.6, 1e-6);
  for (int t = 0; t < 8; ++t) add1(rb, s(t), t, 0.0f, s(t + 1));
  std::mt19937_64 rng(5);
  Batch b;
  std::vector<long> counts(8, 0);
  for (int k = 0; k < 25000; ++k) {
    rb.sample(8, 0.4, rng, b);
    for (std::size_t r = 0; r < 8; ++r) {
      ++counts[static_cast<std::size_t>(b.indices[r])];
      CHECK(b.is_weights[r] == 1.0f);
    }
  }
  CHECK(chi_square(counts, std::vector<double>(8, 0.125)) < kChi2Crit7);
  // Priorities are ignored by uniform replay.
  const std::int64_t i = 0;
  const float big = 100.0f;
  rb.update_priorities(&i, &big, 1);
  CHECK(rb.priority_at(0) == 1.0);
}

TEST_CASE("replay.prioritized.is_weights_hand_example") {
  // p = |td| + eps = {1, 2, 4, 8}, alpha = 0.5, beta = 0.5, N = 4.
  // P(i) = sqrt(p_i) / (1 + √2 + 2 + 2√2); w_i = (N P(i))^-β / max_w, max_w from p_min = 1,
  // so w_i = (sqrt(p_i) / 1)^-0.5 = p_i^-0.25 = {1, 0.840896, 0.707107, 0.594604}.
  ReplayBuffer rb(4, 2, 1, 1, 0.99, 1, true, 0.5, 0.5);
  for (int t = 0; t < 4; ++t) add1(rb, s(t), t, 0.0f, s(t + 1));
  const std::int64_t idx[] = {0, 1, 2, 3};
  const float td[] = {0.5f, -1.5f, 3.5f, -7.5f};  // sign does not matter
  rb.update_priorities(idx, td, 4);
  const double p[] = {1, 2, 4, 8};
  for (int i = 0; i < 4; ++i) CHECK(rb.priority_at(i) == p[i]);
  CHECK(rb.max_priority() == 8.0);
  const double total = 3.0 + 3.0 * std::sqrt(2.0);
  const double literal[] = {1.0, 0.8408964152537145, 0.7071067811865476, 0.5946035575013605};
  std::mt19937_64 rng(1);
  Batch b;
  std::vector<int> seen(4, 0);
  for (int k = 0; k < 200; ++k) {
    rb.sample(4, 0.5, rng, b);
    for (std::size_t r = 0; r < 4; ++r) {
      const auto i = static_cast<std::size_t>(b.indices[r]);
      seen[i] = 1;
      const double P = std::sqrt(p[i]) / total;
      const double max_w = std::pow(4.0 * (1.0 / total), -0.5);
      CHECK(b.is_weights[r] == doctest::Approx(std::pow(4.0 * P, -0.5) / max_w).epsilon(1e-6));
      CHECK(b.is_weights[r] == doctest::Approx(literal[i]).epsilon(1e-6));
    }
  }
  CHECK(seen == std::vector<int>{1, 1, 1, 1});
  // beta = 0: no correction; beta = 1: full correction, w = p_min^α / p_i^α.
  rb.sample(64, 0.0, rng, b);
  for (float w : b.is_weights) CHECK(w == doctest::Approx(1.0));
  rb.sample(64, 1.0, rng, b);
  for (std::size_t r = 0; r < 64; ++r)
    CHECK(b.is_weights[r] ==
          doctest::Approx(1.0 / std::sqrt(p[static_cast<std::size_t>(b.indices[r])])).epsilon(1e-6));
}

TEST_CASE("replay.prioritized.update_priorities_changes_sampling") {
  ReplayBuffer rb(4, 2, 1, 1, 0.99, 1, true, 1.0, 0.01);
  for (int t = 0; t < 4; ++t) add1(rb, s(t), t, 0.0f, s(t + 1));
  std::mt19937_64 rng(9);
  Batch b;
  auto share_of_3 = [&] {
    long hits = 0, n = 0;
    for (int k = 0; k < 5000; ++k) {
      rb.sample(8, 0.4, rng, b);
      for (auto i : b.indices) {
        if (i == 3) ++hits;
        ++n;
      }
    }
    return static_cast<double>(hits) / static_cast<double>(n);
  };
  // All start at priority 1: uniform.
  CHECK(share_of_3() == doctest::Approx(0.25).epsilon(0.05));
  const std::int64_t idx[] = {0, 1, 2, 3};
  const float td[] = {0.0f, 0.0f, 0.0f, 10.0f};  // p = {0.01, 0.01, 0.01, 10.01}
  rb.update_priorities(idx, td, 4);
  const double want = 10.01 / 10.04;
  CHECK(share_of_3() == doctest::Approx(want).epsilon(0.003));
  // A new transition gets the largest priority seen so far.
  add1(rb, s(9), 9, 0.0f, s(10));  // overwrites slot 0
  CHECK(rb.priority_at(0) == doctest::Approx(10.01));
  CHECK(rb.max_priority() == doctest::Approx(10.01));
}

TEST_CASE("replay.new_transitions_start_at_priority_1") {
  ReplayBuffer rb(4, 2, 1, 1, 0.99, 1, true, 0.6, 1e-6);
  add1(rb, s(0), 0, 0.0f, s(1));
  CHECK(rb.priority_at(0) == 1.0);
  const std::int64_t i = 0;
  const float small = 0.2f;
  rb.update_priorities(&i, &small, 1);
  add1(rb, s(1), 1, 0.0f, s(2));
  CHECK(rb.priority_at(1) == 1.0);  // lowering a priority does not lower the max
  CHECK(rb.priority_at(0) == doctest::Approx(0.2 + 1e-6));
}

// ---------------------------------------------------------------- n-step

TEST_CASE("replay.nstep.terminating_episode") {
  // n = 3, γ = 0.9; one episode s0..s5 with rewards 1..5 that terminates at its 5th step.
  ReplayBuffer rb(16, 2, 1, 3, 0.9, 1, false, 0.6, 1e-6);
  for (int t = 0; t < 5; ++t) {
    add1(rb, s(t), 100 + t, static_cast<float>(t + 1), s(t + 1), t == 4);
    // Nothing is stored until a window of 3 is full; termination flushes the rest.
    const std::int64_t want_size[] = {0, 0, 1, 2, 5};
    CHECK(rb.size() == want_size[t]);
  }
  // [slot, s_t, a_t, R, s_next, done]
  check_slot(rb, 0, 0, 100, 1 + 0.9 * 2 + 0.81 * 3, 3, 0.0f);  // 5.23
  check_slot(rb, 1, 1, 101, 2 + 0.9 * 3 + 0.81 * 4, 4, 0.0f);  // 7.94
  check_slot(rb, 2, 2, 102, 3 + 0.9 * 4 + 0.81 * 5, 5, 1.0f);  // 10.65, ends at the terminal step
  check_slot(rb, 3, 3, 103, 4 + 0.9 * 5, 5, 1.0f);             // 8.5: the sum stops there
  check_slot(rb, 4, 4, 104, 5, 5, 1.0f);                       // 5
  CHECK(rb.reward_at(0) == doctest::Approx(5.23));
  CHECK(rb.reward_at(2) == doctest::Approx(10.65));
  // The next episode does not see the old one's rewards.
  for (int t = 20; t < 23; ++t) add1(rb, s(t), t, 1.0f, s(t + 1));
  CHECK(rb.size() == 6);
  check_slot(rb, 5, 20, 20, 1 + 0.9 + 0.81, 23, 0.0f);
}

TEST_CASE("replay.nstep.truncation_flush") {
  // n = 3, γ = 0.9. Truncated episodes are flushed with done = 0 and next = the final obs.
  ReplayBuffer rb(16, 2, 1, 3, 0.9, 1, false, 0.6, 1e-6);
  add1(rb, s(0), 0, 1.0f, s(1));
  add1(rb, s(1), 1, 2.0f, s(2), false, true);  // s(2) is the final observation
  REQUIRE(rb.size() == 2);
  check_slot(rb, 0, 0, 0, 1 + 0.9 * 2, 2, 0.0f);  // bootstrapped from s2 (with γ^3: see replay.hpp)
  check_slot(rb, 1, 1, 1, 2, 2, 0.0f);
  // A longer truncated episode: one full window, then the flush of the rest.
  for (int t = 10; t < 14; ++t) add1(rb, s(t), t, static_cast<float>(t), s(t + 1), false, t == 13);
  REQUIRE(rb.size() == 6);
  check_slot(rb, 2, 10, 10, 10 + 0.9 * 11 + 0.81 * 12, 13, 0.0f);
  check_slot(rb, 3, 11, 11, 11 + 0.9 * 12 + 0.81 * 13, 14, 0.0f);
  check_slot(rb, 4, 12, 12, 12 + 0.9 * 13, 14, 0.0f);
  check_slot(rb, 5, 13, 13, 13, 14, 0.0f);
  // Terminated and truncated on the same step: it terminated, so done = 1.
  add1(rb, s(30), 30, 1.0f, s(31), true, true);
  check_slot(rb, 6, 30, 30, 1, 31, 1.0f);
}

TEST_CASE("replay.nstep.one_step") {
  ReplayBuffer rb(8, 2, 1, 1, 0.5, 1, false, 0.6, 1e-6);
  add1(rb, s(0), 7, 2.0f, s(1));
  add1(rb, s(1), 8, 3.0f, s(2), true);
  add1(rb, s(5), 9, 4.0f, s(6));
  REQUIRE(rb.size() == 3);
  check_slot(rb, 0, 0, 7, 2, 1, 0.0f);
  check_slot(rb, 1, 1, 8, 3, 2, 1.0f);
  check_slot(rb, 2, 5, 9, 4, 6, 0.0f);
}

TEST_CASE("replay.nstep.per_env_windows") {
  // Two envs, n = 2, γ = 0.5, two branches. Env 0 terminates on its 2nd step, env 1 runs on.
  ReplayBuffer rb(16, 1, 2, 2, 0.5, 2, false, 0.6, 1e-6);
  auto step = [&](float o0, float o1, float r0, float r1, float n0, float n1, bool t0) {
    const float obs[] = {o0, o1}, rew[] = {r0, r1}, nxt[] = {n0, n1};
    const std::int32_t act[] = {static_cast<std::int32_t>(o0), 0, static_cast<std::int32_t>(o1), 1};
    const std::uint8_t te[] = {static_cast<std::uint8_t>(t0 ? 1 : 0), 0}, tr[] = {0, 0};
    rb.add(obs, act, rew, nxt, te, tr);
  };
  step(0, 100, 1, 10, 1, 101, false);
  CHECK(rb.size() == 0);
  step(1, 101, 2, 20, 2, 102, true);  // env 0 flushes 2 (done); env 1 emits 1
  REQUIRE(rb.size() == 3);
  // Per env in env order: env 0's two, then env 1's.
  CHECK(rb.state_at(0)[0] == 0.0f);
  CHECK(rb.reward_at(0) == doctest::Approx(1 + 0.5 * 2));
  CHECK(rb.next_state_at(0)[0] == 2.0f);
  CHECK(rb.done_at(0) == 1.0f);
  CHECK(rb.state_at(1)[0] == 1.0f);
  CHECK(rb.reward_at(1) == doctest::Approx(2));
  CHECK(rb.done_at(1) == 1.0f);
  CHECK(rb.state_at(2)[0] == 100.0f);
  CHECK(rb.action_at(2)[0] == 100);
  CHECK(rb.action_at(2)[1] == 1);  // both branches' actions are kept
  CHECK(rb.reward_at(2) == doctest::Approx(10 + 0.5 * 20));
  CHECK(rb.next_state_at(2)[0] == 102.0f);
  CHECK(rb.done_at(2) == 0.0f);
  step(50, 102, 5, 30, 51, 103, false);  // env 0 starts over (nothing yet); env 1 emits s101
  REQUIRE(rb.size() == 4);
  CHECK(rb.state_at(3)[0] == 101.0f);
  CHECK(rb.reward_at(3) == doctest::Approx(20 + 0.5 * 30));
}

// ---------------------------------------------------------------- storage

TEST_CASE("replay.circular_overwrite") {
  ReplayBuffer rb(4, 2, 1, 1, 0.99, 1, true, 0.6, 1e-6);
  for (int t = 0; t < 6; ++t) add1(rb, s(t), t, static_cast<float>(t), s(t + 1));
  CHECK(rb.size() == 4);
  CHECK(rb.capacity() == 4);
  // Slots 0, 1 were overwritten by transitions 4, 5; slots 2, 3 still hold 2, 3.
  check_slot(rb, 0, 4, 4, 4, 5, 0.0f);
  check_slot(rb, 1, 5, 5, 5, 6, 0.0f);
  check_slot(rb, 2, 2, 2, 2, 3, 0.0f);
  check_slot(rb, 3, 3, 3, 3, 4, 0.0f);
  std::mt19937_64 rng(2);
  Batch b;
  for (int k = 0; k < 200; ++k) {
    rb.sample(4, 0.4, rng, b);
    for (std::size_t r = 0; r < 4; ++r) {
      CHECK(b.indices[r] >= 0);
      CHECK(b.indices[r] < 4);
      CHECK(b.states[2 * r] >= 2.0f);  // transitions 0 and 1 are gone
      CHECK(b.rewards[r] == b.states[2 * r]);
      CHECK(b.next_states[2 * r] == b.states[2 * r] + 1.0f);
    }
  }
  CHECK(b.states.size() == 8);
  CHECK(b.dones.size() == 4);
  CHECK_THROWS_AS(rb.state_at(4), std::out_of_range);
}

TEST_CASE("replay.bad_input") {
  // [capacity, obs_dim, branches, n_step, gamma, num_envs, prioritized, alpha, eps, reason]
  struct Case {
    std::int64_t cap; int S, D, n; double gamma; int N; bool per; double alpha, eps;
    const char* needle;
  };
  const Case bad[] = {
      {0, 4, 1, 1, 0.99, 1, false, 0.6, 1e-6, "capacity must be at least 1, got 0"},
      {-5, 4, 1, 1, 0.99, 1, false, 0.6, 1e-6, "capacity must be at least 1, got -5"},
      {10, 0, 1, 1, 0.99, 1, false, 0.6, 1e-6, "obs_dim must be at least 1"},
      {10, 4, 0, 1, 0.99, 1, false, 0.6, 1e-6, "branches must be at least 1"},
      {10, 4, 1, 0, 0.99, 1, false, 0.6, 1e-6, "n_step must be at least 1"},
      {10, 4, 1, 1, 1.5, 1, false, 0.6, 1e-6, "gamma must be in [0, 1], got 1.5"},
      {10, 4, 1, 1, -0.1, 1, false, 0.6, 1e-6, "gamma must be in [0, 1]"},
      {10, 4, 1, 1, 0.99, 0, false, 0.6, 1e-6, "num_envs must be at least 1"},
      {10, 4, 1, 1, 0.99, 1, true, -1.0, 1e-6, "alpha must be >= 0, got -1"},
      {10, 4, 1, 1, 0.99, 1, true, 0.6, 0.0, "priority_eps must be > 0"},
  };
  for (const auto& c : bad) {
    CAPTURE(c.needle);
    try {
      ReplayBuffer rb(c.cap, c.S, c.D, c.n, c.gamma, c.N, c.per, c.alpha, c.eps);
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      CHECK(what.rfind("replay buffer: ", 0) == 0);
      CHECK(what.find(c.needle) != std::string::npos);
    }
  }
  // Valid edge cases side by side.
  CHECK_NOTHROW(ReplayBuffer(1, 1, 1, 1, 0.0, 1, true, 0.0, 1e-9));
  CHECK_NOTHROW(ReplayBuffer(1, 1, 1, 5, 1.0, 3, false, -1.0, 0.0));  // alpha/eps unused

  ReplayBuffer rb(4, 2, 1, 1, 0.99, 1, true, 0.6, 1e-6);
  std::mt19937_64 rng(0);
  Batch b;
  CHECK_THROWS_WITH_AS(rb.sample(2, 0.4, rng, b), "replay buffer: sample() from an empty buffer",
                       std::logic_error);
  add1(rb, s(0), 0, 0.0f, s(1));
  CHECK_THROWS_AS(rb.sample(0, 0.4, rng, b), std::invalid_argument);
  CHECK_THROWS_AS(rb.sample(2, -0.1, rng, b), std::invalid_argument);
  const std::int64_t out_of_range = 1;  // only slot 0 is filled
  const float td = 1.0f;
  CHECK_THROWS_AS(rb.update_priorities(&out_of_range, &td, 1), std::out_of_range);
  const std::int64_t idx[] = {0, 0};
  const float nan_td[] = {2.0f, std::numeric_limits<float>::quiet_NaN()};
  CHECK_THROWS_AS(rb.update_priorities(idx, nan_td, 2), std::invalid_argument);
  CHECK(rb.priority_at(0) == 1.0);  // a rejected update changes nothing
}

// ---------------------------------------------------------------- schedule

TEST_CASE("schedule.linear") {
  using dqn::linear_schedule;
  CHECK(linear_schedule(1.0, 0.05, 1000, 0) == 1.0);
  CHECK(linear_schedule(1.0, 0.05, 1000, 1000) == 0.05);
  CHECK(linear_schedule(1.0, 0.05, 1000, 500) == doctest::Approx(0.525));
  CHECK(linear_schedule(1.0, 0.05, 1000, 250) == doctest::Approx(0.7625));
  CHECK(linear_schedule(1.0, 0.05, 1000, 5000) == 0.05);   // clamped after the duration
  CHECK(linear_schedule(1.0, 0.05, 1000, -10) == 1.0);     // clamped before the start
  CHECK(linear_schedule(0.4, 1.0, 100, 50) == doctest::Approx(0.7));  // β anneals upwards
  CHECK(linear_schedule(0.4, 1.0, 100, 101) == 1.0);
  CHECK(linear_schedule(1.0, 0.1, 0, 0) == 0.1);           // no duration: already annealed
}
