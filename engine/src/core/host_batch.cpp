/** @file host_batch.cpp
 *  @brief A batch on the host (HostBatch): random batches for a pipeline's shapes, batch files,
 *  and the checks that name the tensor and index of bad data; random transitions for a replay.
 */
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>

#include "core/engine_access.hpp"

namespace dqn {

namespace {
/// splitmix64: random transitions for the fill, fast enough for a million of them.
struct Gen {
  std::uint64_t x;
  std::uint64_t next() {
    std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float unit() { return float(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
};
}  // namespace

void fill_replay_random(Engine& e, std::int64_t n) {
  const PipelineSpec& spec = e.spec();
  const int S = spec.network.state, D = spec.network.branches, A = spec.network.actions;
  const std::int64_t K = std::min<std::int64_t>(e.replay().staging_rows(), kReplayFillChunk);
  const auto rows = static_cast<std::size_t>(K);
  std::vector<float> st(rows * std::size_t(S)), nx(st.size()), rw(rows), dn(rows);
  std::vector<std::int32_t> ac(rows * std::size_t(D));
  Gen g{e.parallel().seed() * 7919 + 17};
  for (std::int64_t done = 0; done < n;) {
    const std::int64_t k = std::min(K, n - done);
    for (auto& v : st) v = 2 * g.unit() - 1;
    for (auto& v : nx) v = 2 * g.unit() - 1;
    for (auto& v : rw) v = 2 * g.unit() - 1;
    for (auto& v : dn) v = g.unit() < 0.1f ? 1.0f : 0.0f;
    for (auto& v : ac) v = std::int32_t(g.next() % std::uint64_t(A));
    e.replay().add(Transitions{k, st.data(), nx.data(), ac.data(), rw.data(), dn.data()}, done + k);
    done += k;
  }
}

HostBatch HostBatch::rows(int first, int n) const {
  if (first < 0 || n < 0 || first + n > B)
    throw std::out_of_range("batch rows [" + std::to_string(first) + ", " + std::to_string(first + n) +
                            ") outside its " + std::to_string(B));
  HostBatch r;
  r.B = n;
  r.S = S;
  r.D = D;
  auto slice = [&](const auto& v, int width) {
    using V = std::decay_t<decltype(v)>;
    return V(v.begin() + std::ptrdiff_t(first) * width, v.begin() + std::ptrdiff_t(first + n) * width);
  };
  r.states = slice(states, S);
  r.next_states = slice(next_states, S);
  r.actions = slice(actions, D);
  r.rewards = slice(rewards, 1);
  r.dones = slice(dones, 1);
  r.is_weights = slice(is_weights, 1);
  return r;
}

HostBatch HostBatch::random(const PipelineSpec& spec, std::uint64_t seed) {
  HostBatch b;
  b.B = spec.batch;
  b.S = spec.network.state;
  b.D = spec.network.branches;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), w(0.5f, 1.5f), c(0.0f, 1.0f);
  std::uniform_int_distribution<int> a(0, spec.network.actions - 1);
  const std::size_t n = std::size_t(b.B) * std::size_t(b.S);
  b.states.resize(n);
  b.next_states.resize(n);
  for (auto& x : b.states) x = u(rng);
  for (auto& x : b.next_states) x = u(rng);
  b.actions.resize(std::size_t(b.B) * std::size_t(b.D));
  for (auto& x : b.actions) x = a(rng);
  for (int i = 0; i < b.B; ++i) {
    b.rewards.push_back(u(rng));
    b.dones.push_back(c(rng) < 0.1f ? 1.0f : 0.0f);
    b.is_weights.push_back(w(rng));
  }
  return b;
}

HostBatch HostBatch::from_file(const st::File& f, const std::string& what) {
  HostBatch b;
  const auto& s = f.get("states");
  if (s.shape.size() != 2) throw std::invalid_argument(what + ": 'states' must be [B,S], got " + st::shape_str(s.shape));
  b.B = int(s.shape[0]);
  b.S = int(s.shape[1]);
  const auto& a = f.get("actions");
  if (a.shape.size() != 2 || a.shape[0] != b.B)
    throw std::invalid_argument(what + ": 'actions' must be [B,D] with B = " + std::to_string(b.B) + ", got " + st::shape_str(a.shape));
  b.D = int(a.shape[1]);
  const std::vector<std::int64_t> bs{b.B, b.S}, bv{b.B};
  b.states = f.get_f32("states", bs);
  b.next_states = f.get_f32("next_states", bs);
  b.actions = f.get_i32("actions", {b.B, b.D});
  b.rewards = f.get_f32("rewards", bv);
  b.dones = f.get_f32("dones", bv);
  b.is_weights = f.get_f32("is_weights", bv);
  return b;
}

void HostBatch::to_file(st::File& f) const {
  f.put_f32("states", {B, S}, states.data());
  f.put_f32("next_states", {B, S}, next_states.data());
  f.put_i32("actions", {B, D}, actions.data());
  f.put_f32("rewards", {B}, rewards.data());
  f.put_f32("dones", {B}, dones.data());
  f.put_f32("is_weights", {B}, is_weights.data());
}

void HostBatch::check(const PipelineSpec& spec, const std::string& what) const {
  auto bad = [&](const std::string& m) { throw std::invalid_argument(what + ": " + m); };
  if (B != spec.batch) bad("batch size " + std::to_string(B) + " but the pipeline's batch is " + std::to_string(spec.batch));
  if (S != spec.network.state) bad("states have " + std::to_string(S) + " features but network.state is " + std::to_string(spec.network.state));
  if (D != spec.network.branches) bad("actions have " + std::to_string(D) + " branches but network.branches is " + std::to_string(spec.network.branches));
  const std::size_t n = std::size_t(B) * std::size_t(S);
  if (states.size() != n || next_states.size() != n || actions.size() != std::size_t(B) * std::size_t(D) ||
      rewards.size() != std::size_t(B) || dones.size() != std::size_t(B) || is_weights.size() != std::size_t(B))
    bad("tensor sizes do not match B, S, D");
  for (const auto& [name, v] : {std::pair<const char*, const std::vector<float>*>{"states", &states},
                                {"next_states", &next_states}})
    for (std::size_t i = 0; i < v->size(); ++i)
      if (!std::isfinite((*v)[i]))
        bad(std::string(name) + "[" + std::to_string(i / std::size_t(S)) + "," + std::to_string(i % std::size_t(S)) +
            "] is not finite");
  for (std::size_t i = 0; i < actions.size(); ++i)
    if (actions[i] < 0 || actions[i] >= spec.network.actions)
      bad("actions[" + std::to_string(i / std::size_t(D)) + "," + std::to_string(i % std::size_t(D)) + "] = " +
          std::to_string(actions[i]) + " is outside 0.." + std::to_string(spec.network.actions - 1));
  for (int i = 0; i < B; ++i) {
    if (dones[std::size_t(i)] != 0.0f && dones[std::size_t(i)] != 1.0f)
      bad("dones[" + std::to_string(i) + "] = " + std::to_string(dones[std::size_t(i)]) + " (must be 0 or 1)");
    if (!std::isfinite(rewards[std::size_t(i)])) bad("rewards[" + std::to_string(i) + "] is not finite");
    if (!(is_weights[std::size_t(i)] >= 0.0f) || !std::isfinite(is_weights[std::size_t(i)]))
      bad("is_weights[" + std::to_string(i) + "] must be finite and >= 0");
  }
}

}  // namespace dqn
