// Unit tests of the n-step transition assembly on the host (what goes into the engine's replay)
// and the schedules. The replay's own ops (insert, draws, priorities) are tests/unit/replay_ops_test.cpp.
#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "training/replay.hpp"
#include "training/schedule.hpp"

using dqn::NStepAssembler;
using dqn::TransitionBatch;

namespace {

/// The transitions an assembler emitted so far, with accessors in the shape of the old store.
struct Emitted {
  TransitionBatch t;
  std::int64_t size() const { return t.size(); }
  const float* state_at(std::int64_t i) const { return &t.states[std::size_t(i * t.S)]; }
  const float* next_state_at(std::int64_t i) const { return &t.next_states[std::size_t(i * t.S)]; }
  const std::int32_t* action_at(std::int64_t i) const { return &t.actions[std::size_t(i * t.D)]; }
  float reward_at(std::int64_t i) const { return t.rewards[std::size_t(i)]; }
  float done_at(std::int64_t i) const { return t.dones[std::size_t(i)]; }
};

/// One step of a single-env assembler with 2-dim observations.
void add1(NStepAssembler& a, Emitted& out, std::vector<float> obs, std::int32_t action, float reward,
          std::vector<float> next, bool term = false, bool trunc = false) {
  const std::uint8_t te = term ? 1 : 0, tr = trunc ? 1 : 0;
  a.add(obs.data(), &action, &reward, next.data(), &te, &tr, out.t);
}

/// Observation of step t in the hand examples: {t, 10 + t}.
std::vector<float> s(int t) { return {static_cast<float>(t), 10.0f + static_cast<float>(t)}; }

void check_slot(const Emitted& rb, std::int64_t i, int state_t, std::int32_t action, double reward, int next_t,
                float done) {
  CAPTURE(i);
  REQUIRE(i < rb.size());
  CHECK(rb.state_at(i)[0] == static_cast<float>(state_t));
  CHECK(rb.state_at(i)[1] == 10.0f + static_cast<float>(state_t));
  CHECK(rb.action_at(i)[0] == action);
  CHECK(rb.reward_at(i) == doctest::Approx(reward).epsilon(1e-6));
  CHECK(rb.next_state_at(i)[0] == static_cast<float>(next_t));
  CHECK(rb.next_state_at(i)[1] == 10.0f + static_cast<float>(next_t));
  CHECK(rb.done_at(i) == done);
}

}  // namespace

// ---------------------------------------------------------------- n-step

TEST_CASE("nstep.terminating_episode") {
  // n = 3, γ = 0.9; one episode s0..s5 with rewards 1..5 that terminates at its 5th step.
  NStepAssembler nb(2, 1, 3, 0.9, 1);
  Emitted rb;
  for (int t = 0; t < 5; ++t) {
    add1(nb, rb, s(t), 100 + t, static_cast<float>(t + 1), s(t + 1), t == 4);
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
  for (int t = 20; t < 23; ++t) add1(nb, rb, s(t), t, 1.0f, s(t + 1));
  CHECK(rb.size() == 6);
  check_slot(rb, 5, 20, 20, 1 + 0.9 + 0.81, 23, 0.0f);
}

TEST_CASE("nstep.truncation_flush") {
  // n = 3, γ = 0.9. Truncated episodes are flushed with done = 0 and next = the final obs.
  NStepAssembler nb(2, 1, 3, 0.9, 1);
  Emitted rb;
  add1(nb, rb, s(0), 0, 1.0f, s(1));
  add1(nb, rb, s(1), 1, 2.0f, s(2), false, true);  // s(2) is the final observation
  REQUIRE(rb.size() == 2);
  check_slot(rb, 0, 0, 0, 1 + 0.9 * 2, 2, 0.0f);  // bootstrapped from s2 (with γ^3: see replay.hpp)
  check_slot(rb, 1, 1, 1, 2, 2, 0.0f);
  // A longer truncated episode: one full window, then the flush of the rest.
  for (int t = 10; t < 14; ++t) add1(nb, rb, s(t), t, static_cast<float>(t), s(t + 1), false, t == 13);
  REQUIRE(rb.size() == 6);
  check_slot(rb, 2, 10, 10, 10 + 0.9 * 11 + 0.81 * 12, 13, 0.0f);
  check_slot(rb, 3, 11, 11, 11 + 0.9 * 12 + 0.81 * 13, 14, 0.0f);
  check_slot(rb, 4, 12, 12, 12 + 0.9 * 13, 14, 0.0f);
  check_slot(rb, 5, 13, 13, 13, 14, 0.0f);
  // Terminated and truncated on the same step: it terminated, so done = 1.
  add1(nb, rb, s(30), 30, 1.0f, s(31), true, true);
  check_slot(rb, 6, 30, 30, 1, 31, 1.0f);
}

TEST_CASE("nstep.one_step") {
  NStepAssembler nb(2, 1, 1, 0.5, 1);
  Emitted rb;
  add1(nb, rb, s(0), 7, 2.0f, s(1));
  add1(nb, rb, s(1), 8, 3.0f, s(2), true);
  add1(nb, rb, s(5), 9, 4.0f, s(6));
  REQUIRE(rb.size() == 3);
  check_slot(rb, 0, 0, 7, 2, 1, 0.0f);
  check_slot(rb, 1, 1, 8, 3, 2, 1.0f);
  check_slot(rb, 2, 5, 9, 4, 6, 0.0f);
}

TEST_CASE("nstep.per_env_windows") {
  // Two envs, n = 2, γ = 0.5, two branches. Env 0 terminates on its 2nd step, env 1 runs on.
  NStepAssembler nb(1, 2, 2, 0.5, 2);
  Emitted rb;
  auto step = [&](float o0, float o1, float r0, float r1, float n0, float n1, bool t0) {
    const float obs[] = {o0, o1}, rew[] = {r0, r1}, nxt[] = {n0, n1};
    const std::int32_t act[] = {static_cast<std::int32_t>(o0), 0, static_cast<std::int32_t>(o1), 1};
    const std::uint8_t te[] = {static_cast<std::uint8_t>(t0 ? 1 : 0), 0}, tr[] = {0, 0};
    nb.add(obs, act, rew, nxt, te, tr, rb.t);
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

TEST_CASE("nstep.bad_input_and_bounds") {
  // [obs_dim, branches, n_step, gamma, num_envs, reason]
  struct Case { int S, D, n; double gamma; int N; const char* needle; };
  const Case bad[] = {
      {0, 1, 1, 0.99, 1, "obs_dim must be at least 1"},
      {4, 0, 1, 0.99, 1, "branches must be at least 1"},
      {4, 1, 0, 0.99, 1, "n_step must be at least 1"},
      {4, 1, 1, 1.5, 1, "gamma must be in [0, 1], got 1.5"},
      {4, 1, 1, -0.1, 1, "gamma must be in [0, 1]"},
      {4, 1, 1, 0.99, 0, "num_envs must be at least 1"},
  };
  for (const auto& c : bad) {
    CAPTURE(c.needle);
    try {
      NStepAssembler a(c.S, c.D, c.n, c.gamma, c.N);
      FAIL("accepted");
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      CHECK(what.rfind("n-step assembly: ", 0) == 0);
      CHECK(what.find(c.needle) != std::string::npos);
    }
  }
  CHECK_NOTHROW(NStepAssembler(1, 1, 5, 1.0, 3));
  // The staging the engine sizes for one env step: every copy flushing a full window.
  NStepAssembler a(1, 1, 3, 0.9, 2);
  CHECK(a.max_per_step() == 6);
  Emitted out;
  const float o[] = {0, 0}, r[] = {1, 1};
  const std::int32_t act[] = {0, 0};
  const std::uint8_t no[] = {0, 0}, yes[] = {1, 1};
  a.add(o, act, r, o, no, no, out.t);
  a.add(o, act, r, o, no, no, out.t);
  CHECK(out.size() == 0);
  a.add(o, act, r, o, yes, no, out.t);
  CHECK(out.size() == a.max_per_step());
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
