/** @file replay.cpp
 *  @brief n-step transition assembly on the host.
 */
#include "training/replay.hpp"

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace dqn {

void TransitionBatch::clear() {
  states.clear();
  next_states.clear();
  rewards.clear();
  dones.clear();
  actions.clear();
}

void TransitionBatch::push(const float* state, const std::int32_t* action, float reward, const float* next_state,
                           bool done) {
  states.insert(states.end(), state, state + S);
  next_states.insert(next_states.end(), next_state, next_state + S);
  actions.insert(actions.end(), action, action + D);
  rewards.push_back(reward);
  dones.push_back(done ? 1.0f : 0.0f);
}

Transitions TransitionBatch::view() const {
  return Transitions{size(), states.data(), next_states.data(), actions.data(), rewards.data(), dones.data()};
}

NStepAssembler::NStepAssembler(int obs_dim, int branches, int n_step, double gamma, int num_envs)
    : obs_dim_(obs_dim), branches_(branches), n_step_(n_step), gamma_(gamma), num_envs_(num_envs) {
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw std::invalid_argument("n-step assembly: " + msg);
  };
  need(obs_dim >= 1, "obs_dim must be at least 1, got " + std::to_string(obs_dim));
  need(branches >= 1, "branches must be at least 1, got " + std::to_string(branches));
  need(n_step >= 1, "n_step must be at least 1, got " + std::to_string(n_step));
  char g[32];
  std::snprintf(g, sizeof g, "%g", gamma);
  need(gamma >= 0.0 && gamma <= 1.0, std::string("gamma must be in [0, 1], got ") + g);
  need(num_envs >= 1, "num_envs must be at least 1, got " + std::to_string(num_envs));
  const auto S = std::size_t(obs_dim), D = std::size_t(branches);
  const auto N = std::size_t(num_envs), n = std::size_t(n_step);
  pend_obs_.assign(N * n * S, 0.0f);
  pend_act_.assign(N * n * D, 0);
  pend_rew_.assign(N * n, 0.0f);
  pend_head_.assign(N, 0);
  pend_count_.assign(N, 0);
}

void NStepAssembler::emit(int e, int k, int count, const float* next_state, bool done, TransitionBatch& out) {
  const auto n = std::size_t(n_step_);
  const auto S = std::size_t(obs_dim_), D = std::size_t(branches_);
  const auto base = std::size_t(e) * n;
  const auto head = std::size_t(pend_head_[std::size_t(e)]);
  double ret = 0.0, discount = 1.0;
  for (int j = k; j < count; ++j) {
    ret += discount * pend_rew_[base + (head + std::size_t(j)) % n];
    discount *= gamma_;
  }
  const std::size_t pos = base + (head + std::size_t(k)) % n;
  out.push(&pend_obs_[pos * S], &pend_act_[pos * D], float(ret), next_state, done);
}

void NStepAssembler::add(const float* obs, const std::int32_t* actions, const float* rewards,
                         const float* next_obs_or_final, const std::uint8_t* terminated,
                         const std::uint8_t* truncated, TransitionBatch& out) {
  out.S = obs_dim_;
  out.D = branches_;
  const auto n = std::size_t(n_step_);
  const auto S = std::size_t(obs_dim_), D = std::size_t(branches_);
  for (int e = 0; e < num_envs_; ++e) {
    const auto ue = std::size_t(e);
    int& head = pend_head_[ue];
    int& count = pend_count_[ue];
    const std::size_t pos = ue * n + std::size_t(head + count) % n;
    std::memcpy(&pend_obs_[pos * S], obs + ue * S, S * sizeof(float));
    std::memcpy(&pend_act_[pos * D], actions + ue * D, D * sizeof(std::int32_t));
    pend_rew_[pos] = rewards[ue];
    ++count;
    const float* next = next_obs_or_final + ue * S;
    if (terminated[ue] || truncated[ue]) {
      // Termination wins when both are set: the episode really ended, nothing to bootstrap.
      const bool done = terminated[ue] != 0;
      for (int k = 0; k < count; ++k) emit(e, k, count, next, done, out);
      head = 0;
      count = 0;
    } else if (count == n_step_) {
      emit(e, 0, count, next, false, out);
      head = (head + 1) % n_step_;
      --count;
    }
  }
}

void NStepAssembler::save_state(st::File& f, const std::string& prefix) const {
  const std::int64_t N = num_envs_, n = n_step_;
  f.put_raw(prefix + "obs", st::DType::F32, {N, n, obs_dim_}, pend_obs_.data());
  f.put_raw(prefix + "actions", st::DType::I32, {N, n, branches_}, pend_act_.data());
  f.put_raw(prefix + "rewards", st::DType::F32, {N, n}, pend_rew_.data());
  f.put_raw(prefix + "head", st::DType::I32, {N}, pend_head_.data());
  f.put_raw(prefix + "count", st::DType::I32, {N}, pend_count_.data());
}

void NStepAssembler::load_state(const st::File& f, const std::string& prefix) {
  const std::int64_t N = num_envs_, n = n_step_;
  std::vector<float> obs(pend_obs_.size()), rew(pend_rew_.size());
  std::vector<std::int32_t> act(pend_act_.size());
  std::vector<int> head(pend_head_.size()), count(pend_count_.size());
  f.get_raw(prefix + "obs", st::DType::F32, {N, n, obs_dim_}, obs.data());
  f.get_raw(prefix + "actions", st::DType::I32, {N, n, branches_}, act.data());
  f.get_raw(prefix + "rewards", st::DType::F32, {N, n}, rew.data());
  f.get_raw(prefix + "head", st::DType::I32, {N}, head.data());
  f.get_raw(prefix + "count", st::DType::I32, {N}, count.data());
  for (std::size_t e = 0; e < head.size(); ++e)
    if (head[e] < 0 || head[e] >= n_step_ || count[e] < 0 || count[e] > n_step_)
      throw std::invalid_argument("n-step state in '" + f.path + "': env copy " + std::to_string(e) + " has window head " +
                                  std::to_string(head[e]) + " and count " + std::to_string(count[e]) + " (n_step " +
                                  std::to_string(n_step_) + ")");
  pend_obs_ = std::move(obs);
  pend_act_ = std::move(act);
  pend_rew_ = std::move(rew);
  pend_head_ = std::move(head);
  pend_count_ = std::move(count);
}

}  // namespace dqn
