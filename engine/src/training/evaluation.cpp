/** @file evaluation.cpp
 *  @brief Whole episodes of a policy on every copy of a vectorised environment, summarised.
 */
#include "training/evaluation.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

#include "core/act_stages.hpp"
#include "training/env/vec_env.hpp"
#include "training/seeds.hpp"

namespace dqn {

EvalResult evaluate_policy(ActStages& actor, VecEnv& env, const EvalOptions& o) {
  const int E = env.num_envs(), S = env.obs_dim(), D = env.branches();
  if (E > actor.rows())
    throw std::invalid_argument("evaluation: " + std::to_string(E) + " environment copies, but the act step takes " +
                                std::to_string(actor.rows()) + " rows at most");
  if (o.episodes_per_copy < 1)
    throw std::invalid_argument("evaluation: episodes per copy must be at least 1, not " +
                                std::to_string(o.episodes_per_copy));
  if (!(o.epsilon >= 0.0 && o.epsilon <= 1.0))
    throw std::invalid_argument("evaluation: epsilon " + std::to_string(o.epsilon) + " is outside [0, 1]");
  const auto ue = std::size_t(E), s = std::size_t(S), d = std::size_t(D);
  std::vector<float> obs(ue * s), next(ue * s), fin(ue * s), rew(ue), compact(ue * s);
  std::vector<double> ret(ue, 0.0);
  std::vector<std::int64_t> len(ue, 0);
  std::vector<std::uint8_t> term(ue), trunc(ue);
  std::vector<int> played(ue, 0);
  std::vector<std::int32_t> act(ue * d, 0), compact_act(ue * d);
  std::vector<int> rows;
  std::vector<std::vector<double>> returns(ue);
  std::vector<std::vector<std::int64_t>> lengths(ue);
  const std::vector<int> bins = env.branch_actions();
  std::mt19937_64 rng(derive_seed(o.seed, kEvalEpsilonStream));
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  int successes = 0;
  EvalResult r;
  r.seed = o.seed;
  env.reset(o.seed, obs.data());
  int remaining = E;
  while (remaining > 0) {
    if (o.stop && o.stop()) return r;  // incomplete: not a result
    rows.clear();
    for (int e = 0; e < E; ++e)
      if (played[std::size_t(e)] < o.episodes_per_copy) {
        std::memcpy(&compact[rows.size() * s], &obs[std::size_t(e) * s], s * sizeof(float));
        rows.push_back(e);
      }
    actor.act(compact.data(), int(rows.size()), compact_act.data());
    for (std::size_t i = 0; i < rows.size(); ++i) {
      std::int32_t* a = &act[std::size_t(rows[i]) * d];
      std::memcpy(a, &compact_act[i * d], d * sizeof(std::int32_t));
      if (o.epsilon > 0 && coin(rng) < o.epsilon)
        for (std::size_t j = 0; j < d; ++j) a[j] = std::uniform_int_distribution<std::int32_t>(0, bins[j] - 1)(rng);
    }
    env.step(act.data(), next.data(), rew.data(), term.data(), trunc.data(), fin.data());
    for (int e : rows) {
      const auto k = std::size_t(e);
      ret[k] += rew[k];
      ++len[k];
      if (term[k] || trunc[k]) {
        returns[k].push_back(ret[k]);
        lengths[k].push_back(len[k]);
        ret[k] = 0;
        len[k] = 0;
        successes += env.success()[k];
        if (++played[k] == o.episodes_per_copy) --remaining;
      }
    }
    obs.swap(next);
  }
  for (std::size_t k = 0; k < ue; ++k) {
    r.returns.insert(r.returns.end(), returns[k].begin(), returns[k].end());
    r.lengths.insert(r.lengths.end(), lengths[k].begin(), lengths[k].end());
  }
  double sum = 0;
  r.min = std::numeric_limits<double>::infinity();
  r.max = -r.min;
  for (double x : r.returns) {
    sum += x;
    r.min = std::min(r.min, x);
    r.max = std::max(r.max, x);
  }
  r.episodes = int(r.returns.size());
  r.mean = sum / r.episodes;
  double sq = 0;
  for (double x : r.returns) sq += (x - r.mean) * (x - r.mean);
  r.std = std::sqrt(sq / r.episodes);
  if (env.spec().reports_success) r.success = double(successes) / r.episodes;
  r.complete = true;
  return r;
}

namespace {
struct LengthStats {
  double mean = 0;
  std::int64_t min = 0, max = 0;
};
LengthStats length_stats(const EvalResult& r) {
  LengthStats l;
  if (r.lengths.empty()) return l;
  l.min = *std::min_element(r.lengths.begin(), r.lengths.end());
  l.max = *std::max_element(r.lengths.begin(), r.lengths.end());
  double sum = 0;
  for (std::int64_t x : r.lengths) sum += double(x);
  l.mean = sum / double(r.lengths.size());
  return l;
}
}  // namespace

std::string eval_json(const EvalResult& r, const std::string& label) {
  nlohmann::ordered_json j;
  const LengthStats l = length_stats(r);
  j["env"] = label;
  j["episodes"] = r.episodes;
  j["mean"] = r.mean;
  j["std"] = r.std;
  j["min"] = r.min;
  j["max"] = r.max;
  j["success"] = r.success ? nlohmann::ordered_json(*r.success) : nlohmann::ordered_json(nullptr);
  j["length_mean"] = l.mean;
  j["length_min"] = l.min;
  j["length_max"] = l.max;
  j["seed"] = r.seed;
  j["returns"] = r.returns;
  j["lengths"] = r.lengths;
  return j.dump();
}

std::string eval_text(const EvalResult& r, const std::string& label) {
  const LengthStats l = length_stats(r);
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s: %d episodes (seed %llu)\n  return  mean %.2f  std %.2f  min %.2f  max %.2f\n"
                "  length  mean %.1f  min %lld  max %lld\n",
                label.c_str(), r.episodes, static_cast<unsigned long long>(r.seed), r.mean, r.std, r.min, r.max,
                l.mean, static_cast<long long>(l.min), static_cast<long long>(l.max));
  std::string s = buf;
  if (r.success) {
    std::snprintf(buf, sizeof buf, "  success %.1f %% of the episodes\n", 100.0 * *r.success);
    s += buf;
  }
  return s;
}

}  // namespace dqn
