// The replay's ops on the CPU reference: the tree's layout and arithmetic, inserting into the
// ring, uniform and prioritised draws (distribution by chi-square with fixed seeds, importance
// weights against a direct computation, β's schedule), priority updates, and bad input. The CUDA
// kernels are held to these same numbers in tests/gpu/replay_gpu_test.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../replay_harness.hpp"

using namespace dqn;
using dqn::test::Draw;
using dqn::test::ReplayHarness;

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

ReplayHarness cpu(std::int64_t capacity, bool prioritized, float alpha = 0.6f, float eps = 1e-6f, int S = 2,
                  int D = 1, int max_batch = 64) {
  return ReplayHarness(make_cpu_runtime(false), capacity, S, D, prioritized, alpha, eps, max_batch);
}

/// Checks that each drawn row holds its slot's data (insert_counting's rows, slot k holding the
/// value `value_of_slot[k]`).
void check_rows(const Draw& d, int S, int D, const std::vector<std::int64_t>& value_of_slot) {
  const std::size_t B = d.idx.size();
  for (std::size_t b = 0; b < B; ++b) {
    const double v = double(value_of_slot[std::size_t(d.idx[b])]);
    CHECK(d.states2[b * std::size_t(S)] == float(v));
    CHECK(d.states2[(B + b) * std::size_t(S)] == float(v + 1));
    CHECK(d.rewards[b] == float(v));
    CHECK(d.dones[b] == float(std::int64_t(v) % 2));
    for (int k = 0; k < D; ++k) CHECK(d.actions[b * std::size_t(D) + std::size_t(k)] == std::int32_t(std::int64_t(v) % 7));
  }
}

}  // namespace

TEST_CASE("replay_ops.tree_layout") {
  // [capacity, levels, level sizes]
  struct Case { std::int64_t cap; int levels; std::vector<std::int64_t> sizes; };
  const Case cases[] = {
      {1, 1, {1}},
      {5, 2, {5, 1}},
      {32, 2, {32, 1}},
      {33, 3, {33, 2, 1}},
      {1024, 3, {1024, 32, 1}},
      {1000000, 5, {1000000, 31250, 977, 31, 1}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.cap);
    const replay::Tree t = replay::tree_layout(c.cap);
    REQUIRE(t.levels == c.levels);
    std::int64_t off = 0;
    for (int l = 0; l < t.levels; ++l) {
      CHECK(t.size[l] == c.sizes[std::size_t(l)]);
      CHECK(t.offset[l] == off);
      off += t.size[l];
    }
    CHECK(t.nodes == off);
  }
}

TEST_CASE("replay_ops.pick_child_and_reduce") {
  // Children {1, 0, 3, 2, 4} (the rest absent): [point, child, reason]
  const replay::Node c[] = {replay::leaf(1), replay::leaf(0), replay::leaf(3), replay::leaf(2), replay::leaf(4)};
  const replay::Node r = replay::reduce_children(c, 5);
  CHECK(r.sum == 10.0f);
  CHECK(r.min == 1.0f);
  struct Case { float point; int child; float rest; const char* why; };
  const Case cases[] = {
      {0.0f, 0, 0.0f, "start of the first interval"},
      {0.999f, 0, 0.999f, "end of [0, 1)"},
      {1.0f, 2, 0.0f, "child 1 has no mass and is skipped"},
      {3.999f, 2, 2.999f, "end of [1, 4)"},
      {4.0f, 3, 0.0f, "start of [4, 6)"},
      {5.5f, 3, 1.5f, "inside [4, 6)"},
      {9.999f, 4, 3.999f, "end of [6, 10)"},
      {10.0f, 4, 4.0f, "point == total (rounding): the last child with mass"},
      {12.0f, 4, 6.0f, "past the total: the last child with mass"},
  };
  for (const auto& k : cases) {
    CAPTURE(k.why);
    float rest = -1;
    CHECK(replay::pick_child(c, 5, k.point, &rest) == k.child);
    CHECK(rest == doctest::Approx(k.rest).epsilon(1e-5));
  }
  // A zero child at the end is never picked, whatever the point.
  const replay::Node z[] = {replay::leaf(1), replay::leaf(2), replay::leaf(0)};
  float rest = 0;
  CHECK(replay::pick_child(z, 3, 3.0f, &rest) == 1);
  CHECK(replay::pick_child(z, 3, 100.0f, &rest) == 1);
  CHECK(replay::reduce_children(z, 3).min == 1.0f);
  CHECK(std::isinf(replay::reduce_children(z + 2, 1).min));
}

TEST_CASE("replay_ops.insert_fills_the_ring_and_wraps") {
  ReplayHarness h = cpu(5, true);
  h.insert_counting(0, 3, 30);
  std::vector<std::int64_t> c = h.cursor();
  CHECK(c[kCurNext] == 3);
  CHECK(c[kCurSize] == 3);
  CHECK(c[kCurEnvStep] == 30);
  h.insert_counting(3, 4, 70);  // wraps: slots 3, 4, 0, 1
  c = h.cursor();
  CHECK(c[kCurNext] == 2);
  CHECK(c[kCurSize] == 5);
  CHECK(c[kCurEnvStep] == 70);
  CHECK(c[kCurInserted] == 7);
  // Slots 0, 1 now hold transitions 5, 6; 2, 3, 4 hold 2, 3, 4. Every draw returns its slot's row.
  const std::vector<std::int64_t> value{5, 6, 2, 3, 4};
  for (std::uint64_t seed = 1; seed <= 20; ++seed) check_rows(h.sample(16, seed), 2, 1, value);
  // Every leaf at the starting priority 1 (1^α), the root their sum.
  const std::vector<replay::Node> n = h.nodes();
  for (int i = 0; i < 5; ++i) CHECK(n[std::size_t(i)].sum == 1.0f);
  CHECK(n.back().sum == 5.0f);
  CHECK(n.back().min == 1.0f);
}

TEST_CASE("replay_ops.uniform_draws") {
  ReplayHarness h = cpu(8, false, 0.6f, 1e-6f, 3, 2);
  h.insert_counting(0, 8, 8);
  std::vector<long> counts(8, 0);
  std::vector<std::int64_t> value(8);
  for (int i = 0; i < 8; ++i) value[std::size_t(i)] = i;
  for (int k = 0; k < 4000; ++k) {
    const Draw d = h.sample(50, 11);  // the same seed: the draw counter gives fresh numbers
    if (k < 20) check_rows(d, 3, 2, value);
    for (std::size_t b = 0; b < d.idx.size(); ++b) {
      ++counts[std::size_t(d.idx[b])];
      CHECK(d.w[b] == 1.0f);
    }
  }
  const double chi2 = chi_square(counts, std::vector<double>(8, 0.125));
  MESSAGE("uniform replay chi-square (7 dof) " << chi2);
  CHECK(chi2 < kChi2Crit7);
  CHECK(h.cursor()[kCurDraws] == 4000);
  // Another seed draws other slots; the same seed and counter the same ones.
  ReplayHarness a = cpu(8, false), b = cpu(8, false);
  a.insert_counting(0, 8, 8);
  b.insert_counting(0, 8, 8);
  CHECK(a.sample(32, 5).idx == b.sample(32, 5).idx);
  CHECK(a.sample(32, 5).idx != b.sample(32, 6).idx);
}

TEST_CASE("replay_ops.prioritized_distribution_and_alpha") {
  // Priorities 1..8 with α = 0.5: P(i) ∝ sqrt(i + 1), drawn through stratified batches.
  const float eps = 1e-6f;
  ReplayHarness h = cpu(8, true, 0.5f, eps);
  h.insert_counting(0, 8, 8);
  std::vector<std::int64_t> idx(8);
  std::vector<float> td(8);
  std::vector<double> want, linear;
  for (int i = 0; i < 8; ++i) {
    idx[std::size_t(i)] = i;
    td[std::size_t(i)] = float(i + 1);
    want.push_back(std::sqrt(i + 1.0 + eps));
    linear.push_back(i + 1.0);
  }
  h.priorities(idx, td);
  std::vector<long> counts(8, 0);
  std::vector<std::int64_t> value(8);
  for (int i = 0; i < 8; ++i) value[std::size_t(i)] = i;
  for (int k = 0; k < 25000; ++k) {
    const Draw d = h.sample(8, 777);
    if (k < 20) check_rows(d, 2, 1, value);
    for (auto i : d.idx) ++counts[std::size_t(i)];
    // Stratified: the drawn slots come sorted (what the priority update relies on to skip nodes).
    CHECK(std::is_sorted(d.idx.begin(), d.idx.end()));
  }
  const double chi2 = chi_square(counts, normalised(want));
  MESSAGE("prioritized replay chi-square (7 dof) " << chi2);
  CHECK(chi2 < kChi2Crit7);
  CHECK(chi_square(counts, normalised(linear)) > 100.0);  // α is applied
}

TEST_CASE("replay_ops.prioritized_deep_tree_distribution") {
  // 3,000 slots (levels 3000, 94, 3, 1) with random priorities: the share of each eighth of the
  // slots against the priorities' own shares.
  const std::int64_t C = 3000;
  ReplayHarness h = cpu(C, true, 1.0f, 1e-6f, 1, 1, 256);
  h.insert_counting(0, C, C);
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<double> u(0.0, 5.0);
  std::vector<std::int64_t> idx(256);
  std::vector<float> td(256);
  std::vector<double> p(std::size_t(C), 1.0 + 1e-6);
  for (std::int64_t first = 0; first < C; first += 256) {
    const int n = int(std::min<std::int64_t>(256, C - first));
    idx.resize(std::size_t(n));
    td.resize(std::size_t(n));
    for (int i = 0; i < n; ++i) {
      idx[std::size_t(i)] = first + i;
      td[std::size_t(i)] = float(u(rng));
      p[std::size_t(first + i)] = double(float(double(td[std::size_t(i)]) + 1e-6));
    }
    h.priorities(idx, td);
  }
  std::vector<double> bins(8, 0.0);
  for (std::int64_t i = 0; i < C; ++i) bins[std::size_t(i * 8 / C)] += p[std::size_t(i)];
  // The tree holds what was written: its root against the direct sum.
  double total = 0;
  for (double x : p) total += x;
  CHECK(h.nodes().back().sum == doctest::Approx(total).epsilon(1e-5));
  std::vector<long> counts(8, 0);
  for (int k = 0; k < 400; ++k)
    for (auto i : h.sample(256, 3).idx) ++counts[std::size_t(i * 8 / C)];
  const double chi2 = chi_square(counts, normalised(bins));
  MESSAGE("deep tree chi-square (7 dof) " << chi2);
  CHECK(chi2 < kChi2Crit7);
}

TEST_CASE("replay_ops.importance_weights_hand_example") {
  // p = |td| + eps = {1, 2, 4, 8}, α = 0.5, β = 0.5, N = 4:
  // w_i = (N P(i))^-β / max_j (N P(j))^-β = (p_min^α / p_i^α)^β = p_i^-0.25 = {1, 0.8409, 0.7071, 0.5946}.
  ReplayHarness h = cpu(4, true, 0.5f, 0.5f);
  h.insert_counting(0, 4, 4);
  h.priorities({0, 1, 2, 3}, {0.5f, -1.5f, 3.5f, -7.5f});  // the sign does not matter
  CHECK(h.max_priority() == 8.0f);
  const double p[] = {1, 2, 4, 8};
  const double total = 3.0 + 3.0 * std::sqrt(2.0);
  const double literal[] = {1.0, 0.8408964152537145, 0.7071067811865476, 0.5946035575013605};
  std::vector<int> seen(4, 0);
  for (int k = 0; k < 200; ++k) {
    const Draw d = h.sample(4, 1, 0.5f, 0.5f);
    for (std::size_t r = 0; r < 4; ++r) {
      const auto i = std::size_t(d.idx[r]);
      seen[i] = 1;
      const double P = std::sqrt(p[i]) / total, max_w = std::pow(4.0 * (1.0 / total), -0.5);
      CHECK(d.w[r] == doctest::Approx(std::pow(4.0 * P, -0.5) / max_w).epsilon(1e-6));
      CHECK(d.w[r] == doctest::Approx(literal[i]).epsilon(1e-6));
    }
  }
  CHECK(seen == std::vector<int>{1, 1, 1, 1});
  // β = 0: no correction; β = 1: full, w = p_min^α / p_i^α.
  for (float w : h.sample(64, 2, 0.0f, 0.0f).w) CHECK(w == doctest::Approx(1.0));
  const Draw full = h.sample(64, 2, 1.0f, 1.0f);
  for (std::size_t r = 0; r < 64; ++r) CHECK(full.w[r] == doctest::Approx(1.0 / std::sqrt(p[full.idx[r]])).epsilon(1e-6));
}

TEST_CASE("replay_ops.beta_follows_the_env_step") {
  // β from 0.4 to 1 over 1,000 env steps; the insert sets the env step the draw reads.
  ReplayHarness h = cpu(16, true);
  // [env step of the last insert, β]
  const std::pair<std::int64_t, double> cases[] = {{0, 0.4}, {250, 0.55}, {500, 0.7}, {1000, 1.0}, {5000, 1.0}};
  std::int64_t next = 0;
  for (const auto& [step, beta] : cases) {
    CAPTURE(step);
    h.insert_counting(next++, 1, step);
    const Draw d = h.sample(4, 9, 0.4f, 1.0f, 1000);
    CHECK(d.stats[1] == doctest::Approx(beta).epsilon(1e-6));
    CHECK(d.stats[0] == float(std::min<std::int64_t>(next, 16)));
  }
  // Uniform replay reports β 0 and weights 1.
  ReplayHarness u = cpu(16, false);
  u.insert_counting(0, 4, 500);
  const Draw d = u.sample(4, 9, 0.4f, 1.0f, 1000);
  CHECK(d.stats[1] == 0.0f);
  CHECK(d.stats[2] == 1.0f);
}

TEST_CASE("replay_ops.priorities_change_draws_and_the_running_max") {
  ReplayHarness h = cpu(4, true, 1.0f, 0.01f);
  h.insert_counting(0, 4, 4);
  auto share_of_3 = [&] {
    long hits = 0, n = 0;
    for (int k = 0; k < 5000; ++k)
      for (auto i : h.sample(8, 9).idx) hits += i == 3, ++n;
    return double(hits) / double(n);
  };
  CHECK(share_of_3() == doctest::Approx(0.25).epsilon(0.05));  // all start at priority 1
  h.priorities({0, 1, 2, 3}, {0.0f, 0.0f, 0.0f, 10.0f});       // p = {0.01, 0.01, 0.01, 10.01}
  CHECK(share_of_3() == doctest::Approx(10.01 / 10.04).epsilon(0.003));
  CHECK(h.max_priority() == doctest::Approx(10.01));
  // A new transition enters at the largest priority so far; lowering one does not lower the max.
  h.insert_counting(9, 1, 5);  // overwrites slot 0
  CHECK(h.nodes()[0].sum == doctest::Approx(10.01));
  h.priorities({3}, {0.5f});
  CHECK(h.max_priority() == doctest::Approx(10.01));
  CHECK(h.nodes()[3].sum == doctest::Approx(0.51));
}

TEST_CASE("replay_ops.priorities_duplicates_and_non_finite") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  ReplayHarness h = cpu(6, true, 1.0f, 0.0001f);
  h.insert_counting(0, 6, 6);
  // Slot 2 drawn three times: the last finite row (4.0) counts; slot 4's only row is NaN: kept at 1.
  h.priorities({1, 2, 2, 2, 4, 5}, {3.0f, 2.0f, 4.0f, nan, nan, -inf});
  const std::vector<replay::Node> n = h.nodes();
  CHECK(n[1].sum == doctest::Approx(3.0001));
  CHECK(n[2].sum == doctest::Approx(4.0001));
  CHECK(n[4].sum == 1.0f);
  CHECK(n[5].sum == 1.0f);
  CHECK(h.max_priority() == doctest::Approx(4.0001));
  double total = 0;
  for (int i = 0; i < 6; ++i) total += n[std::size_t(i)].sum;
  CHECK(n.back().sum == doctest::Approx(total));
}

TEST_CASE("replay_ops.bad_input") {
  {
    ReplayHarness h = cpu(4, true);
    CHECK_THROWS_WITH(h.sample(4, 1), doctest::Contains("the replay is empty"));
  }
  {
    ReplayHarness h = cpu(4, true);
    h.insert_counting(0, 2, 2);
    CHECK_THROWS_WITH(h.priorities({0, 2}, {1.0f, 1.0f}), doctest::Contains("an index is outside the replay"));
    // A refused update changes nothing.
    CHECK(h.nodes()[0].sum == 1.0f);
  }
  {
    ReplayHarness h = cpu(4, true);
    CHECK_THROWS_WITH(h.insert_counting(0, 5, 0), doctest::Contains("n must be in 1..capacity"));
  }
  {
    ReplayHarness h = cpu(4, false);
    h.insert_counting(0, 2, 2);
    CHECK_THROWS_WITH(h.priorities({0}, {1.0f}), doctest::Contains("the replay is not prioritised"));
  }
  ReplayStore s;
  CHECK(std::string(replay::store_error(s)) == "capacity must be in 1..2^31");
  s.capacity = 4;
  CHECK(std::string(replay::store_error(s)) == "S and D must be at least 1");
}
